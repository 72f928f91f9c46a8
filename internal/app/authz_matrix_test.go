package app_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/quorum/approval"
	"github.com/better-compute/better-compute/internal/release"
	"github.com/better-compute/better-compute/internal/rollout"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/webhooks"
)

// principals of the matrix, all of tenant acme except the platform admin.
var matrixPrincipals = []string{"platform-admin", "admin", "member", "operator", "viewer", "agent"}

// matrixExpect is the authorization matrix: for every mutation in the
// catalog, the outcome each principal gets. Adding a mutation to the catalog
// without a row here fails TestAuthzMatrix.
var matrixExpect = map[string]map[string]string{
	"tenants.create": {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// A tenant's lifecycle is the platform's; a delete waits for a human
	// even then. The cells act on a fresh tenant, not acme, whose keys the
	// rest of the matrix needs.
	"tenants.suspend": {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"tenants.resume":  {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"tenants.delete":  {"platform-admin": "CONFIRMATION_REQUIRED", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"projects.create": {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"projects.delete": {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "CONFIRMATION_REQUIRED"},
	"apiKeys.create":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"apiKeys.revoke":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"policies.put":    {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// A service key may hold the admin role but is no human: the decision
	// allows, the approval itself is refused.
	"confirmations.approve": {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// The node lifecycle stays with admins; members and agents run
	// commands, only members (people) cancel them.
	"nodes.drain":     {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"nodes.undrain":   {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"nodes.delete":    {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"commands.run":    {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"commands.cancel": {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},

	// GPU health: quarantine, lift and breaker reset are the operator's,
	// and a tenant's operator is its admin.
	"gpus.quarantine":    {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"gpus.lift":          {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"pools.resetBreaker": {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// Command batches: whoever runs commands proposes, approves (the
	// approver key is what counts), cancels and runs them; an agent only
	// proposes. The approver set is a credential: admins.
	"commandBatches.create":  {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"commandBatches.approve": {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"commandBatches.cancel":  {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"commandBatches.run":     {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"approverSets.put":       {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// Join tokens and join approvals admit machines: credentials.
	"joinTokens.create":    {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"joinTokens.revoke":    {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"trustAnchors.create":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"trustAnchors.delete":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"joinRequests.approve": {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"joinRequests.reject":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// Pools: admins write, everyone else only reads.
	"pools.create":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"pools.update":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"pools.archive": {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"pools.offer":   {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// Rebuilding the capacity rollups spans every tenant: the platform's.
	// bcd rollouts are the platform's: no tenant role reaches them.
	"rollouts.create":  {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"rollouts.pause":   {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"rollouts.resume":  {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"rollouts.abort":   {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"capacity.rebuild": {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// Quotas: tenant admins set their projects' quotas (the call uses a
	// project scope); a tenant-wide quota is the platform's alone.
	"quotas.set": {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// Budgets: a tenant's admins and the platform set and delete them;
	// everyone else reads.
	"budgets.set":    {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"budgets.delete": {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// Reservations: whoever works in the tenant books capacity; viewers
	// look. (An agent's extension past a day needs a human:
	// TestAuthzAgentExtendNeedsConfirmation.)
	"reservations.create":  {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"reservations.extend":  {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"reservations.release": {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"reservations.cancel":  {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	// Running a process in a reservation is using what was booked: whoever
	// books may; viewers only look.
	"reservations.exec": {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	// Images: admins push, sign and delete; making one public reaches
	// every tenant, so it is the platform's alone.
	"images.push":    {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"images.sign":    {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"images.promote": {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"images.delete":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// A bcd release runs on every tenant's nodes: the platform's alone.
	"releases.create": {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"releases.delete": {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// Signer keys decide what a tenant deploys: credentials.
	"signerKeys.add":    {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"signerKeys.remove": {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// Webhooks: admins manage endpoints; a secret (create, rotation) is a
	// credential.
	"webhooks.create":       {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"webhooks.update":       {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"webhooks.delete":       {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"webhooks.test":         {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"webhooks.rotateSecret": {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"webhooks.redeliver":    {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// Bare metal: admins manage sites and machines; a machine's BMC
	// password and rescue key are credentials, and deploy, release and
	// retire destroy what is on its disk.
	"sites.create":            {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"sites.update":            {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"sites.delete":            {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.enroll":         {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.inspect":        {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.commission":     {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.deploy":         {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.release":        {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.retire":         {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.rescue":         {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.power":          {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.abort":          {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.pauseWorkflow":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.resumeWorkflow": {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.retryWorkflow":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.abortWorkflow":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// A rotation is a bmc.rotate leaf once acme has approvers: an admin
	// passes authorization and is sent to a command batch.
	"machines.lease":        {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.acceptLease":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.releaseLease": {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"machines.rotateBMC":    {"platform-admin": "QUORUM_REQUIRED", "admin": "QUORUM_REQUIRED", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// Instances: admins manage flavors and IP pools.
	"flavors.create":           {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"flavors.delete":           {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"ipPools.create":           {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"sandboxTemplates.create":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"sandboxTemplates.delete":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"sandboxes.create":         {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"sandboxes.extend":         {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"sandboxes.snapshot":       {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"sandboxes.exec":           {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"sandboxes.restore":        {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"workloadTokens.issue":     {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"sandboxes.delete":         {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "CONFIRMATION_REQUIRED"},
	"sandboxes.deleteSnapshot": {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "CONFIRMATION_REQUIRED"},
	"secrets.put":              {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"secrets.delete":           {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"fleetMarks.set":           {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"fleetMarks.delete":        {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"providerAccounts.create":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"profiles.create":          {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"profiles.update":          {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"profiles.delete":          {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"providerAccounts.delete":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"ipPools.delete":           {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "operator": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// Guests: whoever works in the tenant runs them; a delete destroys a
	// disk, so an agent's waits for a human.
	"instances.create": {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"instances.start":  {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"instances.stop":   {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"instances.reboot": {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"instances.ssh":    {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"instances.delete": {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "CONFIRMATION_REQUIRED"},
	"volumes.create":   {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"volumes.attach":   {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"volumes.detach":   {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"volumes.delete":   {"platform-admin": "OK", "admin": "OK", "member": "OK", "operator": "OK", "viewer": "PERMISSION_DENIED", "agent": "CONFIRMATION_REQUIRED"},
}

type matrixFixture struct {
	cp      *bctest.ControlPlane
	admin   *client.Client
	keys    map[string]string
	counter atomic.Int64
	// acme and web are the ids of the tenant and project of the matrix.
	acme, web string
	// gpuPool is the id of acme's pool of one simulated 8-GPU node.
	gpuPool string
	// active is an active reservation of that pool, made on first use.
	active string
	// acmeSigner and platformSigner are on acme's and the platform's
	// signer allowlists once matrixSigners ran.
	acmeSigner, platformSigner *imagesig.Signer
	// machineSite is acme's site of the matrix's machines.
	machineSite string
	// volumeHost is a running instance whose host takes the matrix's
	// volumes, made before the reservations fill the node.
	volumeHost string
	// approver is the one key of acme's approver set, once made.
	approver ssh.Signer
	// releaseKey signs the matrix's releases; the control plane trusts it.
	releaseKey release.Key
}

// matrixRelease signs a fresh release (one platform, tiny files) and
// returns its envelope and files.
func (f *matrixFixture) matrixRelease(t *testing.T) (string, []client.ReleaseFile) {
	t.Helper()
	bin := []byte(f.name("bcd"))
	bom := []byte(`{"bomFormat":"CycloneDX"}`)
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	m := release.Manifest{Schema: release.Schema, Version: fmt.Sprintf("v1.0.%d", f.counter.Add(1)), MinControlPlaneVersion: "v0.1.0",
		CreatedAt: f.cp.Clock.Now(), Binaries: []release.Binary{{Platform: "linux-amd64", Name: "bcd-linux-amd64",
			SHA256: sum(bin), Size: int64(len(bin)), SBOM: release.File{Name: "bcd-linux-amd64.sbom.json", SHA256: sum(bom), Size: int64(len(bom))}}}}
	env, err := release.Sign(m, f.releaseKey)
	require.NoError(t, err)
	return string(env), []client.ReleaseFile{{Name: "bcd-linux-amd64", Content: bytes.NewReader(bin)},
		{Name: "bcd-linux-amd64.sbom.json", Content: bytes.NewReader(bom)}}
}

func (f *matrixFixture) name(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, f.counter.Add(1))
}

// providerSecret puts a secret in acme (as its admin) and returns its
// reference, for a provider account's token.
func (f *matrixFixture) providerSecret(t *testing.T) string {
	t.Helper()
	name := f.name("hctoken")
	_, err := f.admin.Secrets.Put(context.Background(), connect.NewRequest(&apiv1.PutSecretRequest{Tenant: "acme", Name: name,
		Value: []byte("hcloud-token")}))
	require.NoError(t, err)
	f.cp.Authz.Reset()
	return "secret://" + name
}

// matrixNode inserts a node of acme/web in the given state, as a join would.
func (f *matrixFixture) matrixNode(t *testing.T, state string) fleet.Node {
	t.Helper()
	now := f.cp.Clock.Now()
	p := &fleet.NodeInsertParams{ID: envelope.NewID(fleet.NodeIDPrefix, now), Name: f.name("node"), TenantID: f.acme,
		ProjectID: f.web, HardwareKey: f.name("hw"), State: state, Liveness: fleet.LivenessReady, CreateTime: now}
	err := f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return fleet.NodeInsert(ctx, tx, p)
	})
	require.NoError(t, err)
	return fleet.Node{ID: p.ID, Name: p.Name}
}

// matrixGPU inserts an active node of acme with one GPU (not in any pool:
// its model matches no selector) and returns the GPU's UUID.
func (f *matrixFixture) matrixGPU(t *testing.T) string {
	t.Helper()
	n := f.matrixNode(t, fleet.NodeActive)
	uuid := "GPU-" + f.name("matrix")
	require.NoError(t, f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO gpus (uuid, node_id, idx, model, memory_mib, pci_bus_id, numa_node, mig_mode, update_time)
			VALUES ($1, $2, 0, 'T4', 16384, '0000:01:00.0', 0, 'disabled', $3)`, uuid, n.ID, f.cp.Clock.Now())
		return err
	}))
	return uuid
}

// matrixApprovers gives acme a one-key approver set (f.approver) if it has
// none, and returns the current one.
func (f *matrixFixture) matrixApprovers(t *testing.T) *apiv1.ApproverSet {
	t.Helper()
	ctx := context.Background()
	if f.approver == nil {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		f.approver, err = ssh.NewSignerFromKey(k)
		require.NoError(t, err)
		res, err := f.admin.CommandBatches.PutApproverSet(ctx, connect.NewRequest(&apiv1.PutApproverSetRequest{Tenant: "acme",
			Threshold: 1, PublicKeys: []string{approval.AuthorizedKey(f.approver.PublicKey())}}))
		require.NoError(t, err)
		return res.Msg.GetApproverSet()
	}
	res, err := f.admin.CommandBatches.GetApproverSet(ctx, connect.NewRequest(&apiv1.GetApproverSetRequest{Tenant: "acme"}))
	require.NoError(t, err)
	return res.Msg.GetApproverSet()
}

// matrixRamdisk inserts a commissioning ramdisk node of acme (a disk.wipe
// runs nowhere else) and returns its id.
func (f *matrixFixture) matrixRamdisk(t *testing.T) string {
	t.Helper()
	now := f.cp.Clock.Now()
	p := &fleet.NodeInsertParams{ID: envelope.NewID(fleet.NodeIDPrefix, now), Name: f.name("ramdisk"), TenantID: f.acme,
		ProjectID: f.web, HardwareKey: f.name("hw"), State: fleet.NodeActive, Liveness: fleet.LivenessReady, Mode: fleet.RoleRamdisk, CreateTime: now}
	require.NoError(t, f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error { return fleet.NodeInsert(ctx, tx, p) }))
	return p.ID
}

// matrixBatch proposes a one-leaf batch of acme, approved by f.approver
// when approved is set.
func (f *matrixFixture) matrixBatch(t *testing.T, approved bool) *apiv1.CommandBatch {
	t.Helper()
	ctx := context.Background()
	f.matrixApprovers(t)
	res, err := f.admin.CommandBatches.Create(ctx, connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "acme",
		Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: fleet.KindDiskWipe, Subject: f.matrixRamdisk(t)}}}))
	require.NoError(t, err)
	b := res.Msg.GetBatch()
	if approved {
		_, err := f.admin.CommandBatches.Approve(ctx, connect.NewRequest(f.matrixApproval(t, b)))
		require.NoError(t, err)
	}
	return b
}

// matrixApproval is f.approver's approval of b.
func (f *matrixFixture) matrixApproval(t *testing.T, b *apiv1.CommandBatch) *apiv1.ApproveCommandBatchRequest {
	t.Helper()
	root, err := approval.ParseRoot(b.GetRoot())
	require.NoError(t, err)
	sig, err := approval.Sign(f.approver, approval.BatchMessage(b.GetTrustDomain(), b.GetId(), root, b.GetApproverEpoch()))
	require.NoError(t, err)
	return &apiv1.ApproveCommandBatchRequest{Tenant: "acme", Id: b.GetId(), Root: b.GetRoot(),
		Approval: &apiv1.KeySignature{Key: approval.AuthorizedKey(f.approver.PublicKey()), Signature: sig}}
}

// matrixJoinRequest inserts a pending join request of acme, as a deferred
// join would.
func (f *matrixFixture) matrixJoinRequest(t *testing.T) string {
	t.Helper()
	now := f.cp.Clock.Now()
	tok := &fleet.JoinToken{ID: envelope.NewID(fleet.JoinTokenIDPrefix, now), TenantID: f.acme, ProjectID: f.web,
		CreatedBy: "test", CreateTime: now, ExpireTime: now.Add(time.Hour)}
	jr := &fleet.JoinRequest{ID: envelope.NewID(fleet.JoinRequestIDPrefix, now), TenantID: f.acme, TokenID: tok.ID,
		CSRSHA256: "csr", HardwareKey: f.name("hw"), Identity: "placeholder", Reason: "test", CreateTime: now}
	err := f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		if err := fleet.JoinTokenInsert(ctx, tx, tok); err != nil {
			return err
		}
		return fleet.JoinRequestInsert(ctx, tx, jr)
	})
	require.NoError(t, err)
	return jr.ID
}

// matrixTenant creates a tenant of its own for a lifecycle cell,
// suspended when asked.
func (f *matrixFixture) matrixTenant(t *testing.T, suspended bool) string {
	t.Helper()
	name := f.name("t")
	_, err := f.admin.Tenants.Create(context.Background(), connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
	require.NoError(t, err)
	if suspended {
		_, err = f.admin.Tenants.Suspend(context.Background(), connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: name}))
		require.NoError(t, err)
	}
	f.cp.Authz.Reset()
	return name
}

// matrixWebhook creates a webhook of acme (disabled, so nothing is sent).
func (f *matrixFixture) matrixWebhook(t *testing.T) string {
	t.Helper()
	res, err := f.admin.Webhooks.Create(context.Background(), connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme",
		Url: "http://127.0.0.1:9/" + f.name("hook")}))
	require.NoError(t, err)
	f.cp.Authz.Reset()
	return res.Msg.GetWebhook().GetId()
}

// matrixDeadDelivery gives a webhook of acme a dead delivery, as a day of
// failures would.
func (f *matrixFixture) matrixDeadDelivery(t *testing.T) (webhookID, deliveryID string) {
	t.Helper()
	wh := f.matrixWebhook(t)
	now := f.cp.Clock.Now()
	d := &webhooks.Delivery{ID: envelope.NewID(webhooks.DeliveryIDPrefix, now), WebhookID: wh, TenantID: f.acme, EventID: "1",
		EventType: "webhook.test", Payload: []byte("{}"), State: webhooks.DeliveryDead, Attempts: 30, NextAttemptTime: now,
		CreateTime: now, UpdateTime: now}
	require.NoError(t, f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return webhooks.DeliveryInsert(ctx, tx, d)
	}))
	return wh, d.ID
}

// matrixCalls makes each mutation with fresh resources, so every cell of the
// matrix is independent.
var matrixCalls = map[string]func(t *testing.T, f *matrixFixture, c *client.Client) error{
	"tenants.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Tenants.Create(context.Background(), connect.NewRequest(&apiv1.CreateTenantRequest{Name: f.name("t")}))
		return err
	},
	"tenants.suspend": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.matrixTenant(t, false)
		_, err := c.Tenants.Suspend(context.Background(), connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: name}))
		return err
	},
	"tenants.resume": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.matrixTenant(t, true)
		_, err := c.Tenants.Resume(context.Background(), connect.NewRequest(&apiv1.ResumeTenantRequest{Tenant: name}))
		return err
	},
	"tenants.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.matrixTenant(t, true)
		_, err := c.Tenants.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteTenantRequest{Tenant: name}))
		return err
	},
	"projects.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Projects.Create(context.Background(), connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: f.name("p")}))
		return err
	},
	"projects.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.name("p")
		_, err := f.admin.Projects.Create(context.Background(), connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: name}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.Projects.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: name}))
		return err
	},
	"apiKeys.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.ApiKeys.Create(context.Background(), connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "viewer"}))
		return err
	},
	"apiKeys.revoke": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		k, err := f.admin.ApiKeys.Create(context.Background(), connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "viewer"}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.ApiKeys.Revoke(context.Background(), connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: "acme", Id: k.Msg.GetApiKey().GetId()}))
		return err
	},
	"policies.put": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Policies.Put(context.Background(), connect.NewRequest(&apiv1.PutPolicyRequest{
			Tenant: "acme", Id: f.name("pol"),
			Text: `@id("no-viewer-deletes") forbid (principal, action == BC::Action::"projects.delete", resource) when { principal.role == "viewer" };`,
		}))
		return err
	},
	"nodes.drain": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		n := f.matrixNode(t, fleet.NodeActive)
		_, err := c.Nodes.Drain(context.Background(), connect.NewRequest(&apiv1.DrainNodeRequest{Tenant: "acme", Node: n.Name}))
		return err
	},
	"nodes.undrain": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		n := f.matrixNode(t, fleet.NodeDrained)
		_, err := c.Nodes.Undrain(context.Background(), connect.NewRequest(&apiv1.UndrainNodeRequest{Tenant: "acme", Node: n.ID}))
		return err
	},
	"nodes.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		n := f.matrixNode(t, fleet.NodeRetired)
		_, err := c.Nodes.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteNodeRequest{Tenant: "acme", Node: n.ID}))
		return err
	},
	"gpus.quarantine": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		gpu := f.matrixGPU(t)
		_, err := c.Health.QuarantineGpu(context.Background(), connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: gpu, Reason: "matrix"}))
		return err
	},
	"gpus.lift": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		gpu := f.matrixGPU(t)
		_, err := f.admin.Health.QuarantineGpu(context.Background(), connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: gpu, Reason: "matrix"}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.Health.LiftGpu(context.Background(), connect.NewRequest(&apiv1.LiftGpuRequest{Tenant: "acme", Gpu: gpu, Reason: "matrix"}))
		return err
	},
	"pools.resetBreaker": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Health.ResetBreaker(context.Background(), connect.NewRequest(&apiv1.ResetBreakerRequest{Tenant: "acme", Pool: f.gpuPool, Reason: "matrix"}))
		return err
	},
	"commands.run": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		n := f.matrixNode(t, fleet.NodeActive)
		_, err := c.Commands.Run(context.Background(), connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: n.Name, Kind: "inventory.refresh"}))
		return err
	},
	"commands.cancel": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		n := f.matrixNode(t, fleet.NodeActive)
		cmd, err := f.admin.Commands.Run(context.Background(), connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: n.Name, Kind: "inventory.refresh"}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.Commands.Cancel(context.Background(), connect.NewRequest(&apiv1.CancelCommandRequest{Tenant: "acme", Id: cmd.Msg.GetCommand().GetId()}))
		return err
	},
	"commandBatches.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		f.matrixApprovers(t)
		n := f.matrixRamdisk(t)
		f.cp.Authz.Reset()
		_, err := c.CommandBatches.Create(context.Background(), connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "acme",
			Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: fleet.KindDiskWipe, Subject: n}}}))
		return err
	},
	"commandBatches.approve": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		b := f.matrixBatch(t, false)
		f.cp.Authz.Reset()
		_, err := c.CommandBatches.Approve(context.Background(), connect.NewRequest(f.matrixApproval(t, b)))
		return err
	},
	"commandBatches.cancel": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		b := f.matrixBatch(t, false)
		f.cp.Authz.Reset()
		_, err := c.CommandBatches.Cancel(context.Background(), connect.NewRequest(&apiv1.CancelCommandBatchRequest{Tenant: "acme", Id: b.GetId()}))
		return err
	},
	"commandBatches.run": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		b := f.matrixBatch(t, true)
		f.cp.Authz.Reset()
		_, err := c.CommandBatches.Run(context.Background(), connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "acme", Id: b.GetId()}))
		return err
	},
	"approverSets.put": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		// The same one key again, signed by the set it replaces.
		cur := f.matrixApprovers(t)
		key := f.approver.PublicKey()
		sig, err := approval.Sign(f.approver, approval.SetMessage(cur.GetTrustDomain(), f.acme, cur.GetEpoch()+1, 1, []ssh.PublicKey{key}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.CommandBatches.PutApproverSet(context.Background(), connect.NewRequest(&apiv1.PutApproverSetRequest{Tenant: "acme",
			Threshold: 1, PublicKeys: []string{approval.AuthorizedKey(key)}, PreviousEpoch: cur.GetEpoch(),
			Approvals: []*apiv1.KeySignature{{Key: approval.AuthorizedKey(key), Signature: sig}}}))
		return err
	},
	"joinTokens.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.JoinTokens.Create(context.Background(), connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web"}))
		return err
	},
	"joinTokens.revoke": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		jt, err := f.admin.JoinTokens.Create(context.Background(), connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web"}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.JoinTokens.Revoke(context.Background(), connect.NewRequest(&apiv1.RevokeJoinTokenRequest{Tenant: "acme", Id: jt.Msg.GetJoinToken().GetId()}))
		return err
	},
	"trustAnchors.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.TrustAnchors.Create(context.Background(), connect.NewRequest(&apiv1.CreateTrustAnchorRequest{Tenant: "acme",
			Name: f.name("anchor"), Attestor: "tpm", EkPublicSha256: strings.Repeat("ab", 32)}))
		return err
	},
	"trustAnchors.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		ta, err := f.admin.TrustAnchors.Create(context.Background(), connect.NewRequest(&apiv1.CreateTrustAnchorRequest{Tenant: "acme",
			Name: f.name("anchor"), Attestor: "tpm", EkPublicSha256: strings.Repeat("cd", 32)}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.TrustAnchors.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteTrustAnchorRequest{Tenant: "acme", TrustAnchor: ta.Msg.GetTrustAnchor().GetId()}))
		return err
	},
	"joinRequests.approve": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.JoinRequests.Approve(context.Background(), connect.NewRequest(&apiv1.ApproveJoinRequestRequest{Tenant: "acme", Id: f.matrixJoinRequest(t)}))
		return err
	},
	"joinRequests.reject": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.JoinRequests.Reject(context.Background(), connect.NewRequest(&apiv1.RejectJoinRequestRequest{Tenant: "acme", Id: f.matrixJoinRequest(t)}))
		return err
	},
	"pools.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Pools.Create(context.Background(), connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: f.name("pool")}))
		return err
	},
	"pools.update": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		id := f.matrixPool(t)
		_, err := c.Pools.Update(context.Background(), connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: id,
			Policy: &apiv1.PoolPolicy{GpuSharing: "timeslice", SlotsPerGpu: 4}}))
		return err
	},
	"pools.archive": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Pools.Archive(context.Background(), connect.NewRequest(&apiv1.ArchivePoolRequest{Tenant: "acme", Pool: f.matrixPool(t)}))
		return err
	},
	"pools.offer": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Pools.Offer(context.Background(), connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "acme", Pool: f.matrixPool(t), To: []string{"all"}}))
		return err
	},
	"rollouts.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		f.matrixFreeRolloutPool(t)
		_, err := c.Rollouts.Create(context.Background(), connect.NewRequest(&apiv1.CreateRolloutRequest{Release: "v1.1.0", Pool: f.gpuPool,
			Waves: []string{"100%"}}))
		return err
	},
	"rollouts.pause": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		id := f.matrixRollout(t, false)
		_, err := c.Rollouts.Pause(context.Background(), connect.NewRequest(&apiv1.PauseRolloutRequest{Id: id}))
		return err
	},
	"rollouts.resume": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		id := f.matrixRollout(t, true)
		_, err := c.Rollouts.Resume(context.Background(), connect.NewRequest(&apiv1.ResumeRolloutRequest{Id: id}))
		return err
	},
	"rollouts.abort": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		id := f.matrixRollout(t, false)
		_, err := c.Rollouts.Abort(context.Background(), connect.NewRequest(&apiv1.AbortRolloutRequest{Id: id}))
		return err
	},
	"capacity.rebuild": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Capacity.Rebuild(context.Background(), connect.NewRequest(&apiv1.RebuildCapacityRequest{}))
		return err
	},
	"webhooks.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Webhooks.Create(context.Background(), connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme",
			Url: "http://127.0.0.1:9/" + f.name("hook")}))
		return err
	},
	"webhooks.update": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		desc := "renamed"
		_, err := c.Webhooks.Update(context.Background(), connect.NewRequest(&apiv1.UpdateWebhookRequest{Tenant: "acme",
			Webhook: f.matrixWebhook(t), Description: &desc}))
		return err
	},
	"webhooks.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Webhooks.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteWebhookRequest{Tenant: "acme", Webhook: f.matrixWebhook(t)}))
		return err
	},
	"webhooks.test": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Webhooks.Test(context.Background(), connect.NewRequest(&apiv1.TestWebhookRequest{Tenant: "acme", Webhook: f.matrixWebhook(t)}))
		return err
	},
	"webhooks.rotateSecret": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Webhooks.RotateSecret(context.Background(), connect.NewRequest(&apiv1.RotateWebhookSecretRequest{Tenant: "acme", Webhook: f.matrixWebhook(t)}))
		return err
	},
	"sites.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Sites.Create(context.Background(), connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: f.name("site"),
			Networks: []string{"10.0.0.0/24"}}))
		return err
	},
	"sites.update": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		site := f.matrixSite(t)
		desc := "rack 4"
		_, err := c.Sites.Update(context.Background(), connect.NewRequest(&apiv1.UpdateSiteRequest{Tenant: "acme", Site: site, Description: &desc}))
		return err
	},
	"sites.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		site := f.matrixSite(t)
		_, err := c.Sites.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteSiteRequest{Tenant: "acme", Site: site}))
		return err
	},
	"machines.enroll": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		site := f.matrixMachineSite(t)
		_, err := c.Machines.Enroll(context.Background(), connect.NewRequest(f.matrixEnroll(site)))
		return err
	},
	"machines.inspect": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		m := f.matrixMachine(t, metal.StateEnrolled)
		_, err := c.Machines.Inspect(context.Background(), connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: m}))
		return err
	},
	"machines.commission": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		m := f.matrixMachine(t, metal.StateEnrolled)
		_, err := c.Machines.Commission(context.Background(), connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: m}))
		return err
	},
	"machines.deploy": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		img := f.matrixImage(t, true)
		m := f.matrixMachine(t, metal.StateReady)
		_, err := c.Machines.Deploy(context.Background(), connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "acme", Machine: m, Image: img.GetId()}))
		return err
	},
	"machines.release": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		m := f.matrixMachine(t, metal.StateDeployed)
		_, err := c.Machines.Release(context.Background(), connect.NewRequest(&apiv1.ReleaseMachineRequest{Tenant: "acme", Machine: m}))
		return err
	},
	"machines.retire": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		m := f.matrixMachine(t, metal.StateEnrolled)
		_, err := c.Machines.Retire(context.Background(), connect.NewRequest(&apiv1.RetireMachineRequest{Tenant: "acme", Machine: m}))
		return err
	},
	"machines.rescue": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		m := f.matrixMachine(t, metal.StateReady)
		_, err := c.Machines.Rescue(context.Background(), connect.NewRequest(&apiv1.RescueMachineRequest{Tenant: "acme", Machine: m,
			SshPublicKey: sfSSHKey, DurationSeconds: 600}))
		return err
	},
	"machines.power": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		m := f.matrixMachine(t, metal.StateReady)
		_, err := c.Machines.Power(context.Background(), connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: m, Action: "on"}))
		return err
	},
	"machines.rotateBMC": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		m := f.matrixMachine(t, metal.StateReady)
		_, err := c.Machines.RotateBMCPassword(context.Background(), connect.NewRequest(&apiv1.RotateBMCPasswordRequest{Tenant: "acme", Machine: m}))
		return err
	},
	"machines.lease": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		m := f.matrixLeasable(t)
		_, err := c.Machines.Lease(context.Background(), connect.NewRequest(&apiv1.LeaseMachineRequest{Tenant: "acme", Machine: m, Lessee: "acme"}))
		return err
	},
	"machines.acceptLease": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		img := f.matrixImage(t, true)
		l := f.matrixOffer(t)
		_, err := c.Machines.AcceptLease(context.Background(), connect.NewRequest(&apiv1.AcceptMachineLeaseRequest{Tenant: "acme", Lease: l,
			Image: img.GetId(), SshKey: sfSSHKey}))
		return err
	},
	"machines.releaseLease": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		l := f.matrixOffer(t)
		_, err := c.Machines.ReleaseLease(context.Background(), connect.NewRequest(&apiv1.ReleaseMachineLeaseRequest{Tenant: "acme", Lease: l}))
		return err
	},
	"machines.abort": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		// A machine with a workflow running: the platform admin's power-on
		// (off needs a quorum once acme has approvers, as the batch rows
		// give it).
		m := f.matrixMachine(t, metal.StateReady)
		_, err := f.admin.Machines.Power(context.Background(), connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: m, Action: "on"}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.Machines.Abort(context.Background(), connect.NewRequest(&apiv1.AbortMachineRequest{Tenant: "acme", Machine: m}))
		return err
	},
	"machines.pauseWorkflow": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		wf := f.matrixWorkflow(t, false)
		_, err := c.Machines.PauseWorkflow(context.Background(), connect.NewRequest(&apiv1.PauseMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
		return err
	},
	"machines.resumeWorkflow": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		wf := f.matrixWorkflow(t, true)
		_, err := c.Machines.ResumeWorkflow(context.Background(), connect.NewRequest(&apiv1.ResumeMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
		return err
	},
	"machines.retryWorkflow": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		wf := f.matrixWorkflow(t, true)
		_, err := c.Machines.RetryWorkflow(context.Background(), connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme",
			Workflow: wf, FromStep: "power-on"}))
		return err
	},
	"machines.abortWorkflow": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		wf := f.matrixWorkflow(t, false)
		_, err := c.Machines.AbortWorkflow(context.Background(), connect.NewRequest(&apiv1.AbortMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
		return err
	},
	"flavors.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Flavors.Create(context.Background(), connect.NewRequest(&apiv1.CreateFlavorRequest{Tenant: "acme", Name: f.name("flv"),
			Vcpus: 2, MemoryMib: 2048, DiskGib: 10}))
		return err
	},
	"flavors.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.name("flv")
		_, err := f.admin.Flavors.Create(context.Background(), connect.NewRequest(&apiv1.CreateFlavorRequest{Tenant: "acme", Name: name,
			Vcpus: 2, MemoryMib: 2048, DiskGib: 10}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.Flavors.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteFlavorRequest{Tenant: "acme", Flavor: name}))
		return err
	},
	"sandboxTemplates.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		mxSandboxBase(t, f)
		f.cp.Authz.Reset()
		_, err := c.SandboxTemplates.Create(context.Background(), connect.NewRequest(mxTemplateReq(f.name("sbt"))))
		return err
	},
	"sandboxTemplates.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := mxSandboxTemplate(t, f)
		f.cp.Authz.Reset()
		_, err := c.SandboxTemplates.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteSandboxTemplateRequest{Tenant: "acme", Template: name}))
		return err
	},
	"sandboxes.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := mxSandboxTemplate(t, f)
		f.cp.Authz.Reset()
		_, err := c.Sandboxes.Create(context.Background(), connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: name}))
		return err
	},
	"sandboxes.extend": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		id := mxSandbox(t, f)
		f.cp.Authz.Reset()
		_, err := c.Sandboxes.Extend(context.Background(), connect.NewRequest(&apiv1.ExtendSandboxRequest{Tenant: "acme", Sandbox: id,
			Ttl: durationpb.New(20 * time.Minute)}))
		return err
	},
	"sandboxes.snapshot": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		id := mxSandbox(t, f)
		f.cp.Authz.Reset()
		_, err := c.Sandboxes.Snapshot(context.Background(), connect.NewRequest(&apiv1.SnapshotSandboxRequest{Tenant: "acme", Sandbox: id}))
		return err
	},
	"workloadTokens.issue": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		id := f.matrixActive(t)
		f.cp.Authz.Reset()
		_, err := c.WorkloadIdentity.IssueToken(context.Background(), connect.NewRequest(&apiv1.IssueWorkloadTokenRequest{Tenant: "acme",
			WorkloadKind: "reservation", Workload: id, Audience: "https://store.example"}))
		return err
	},
	"sandboxes.exec": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		id := mxSandbox(t, f)
		f.cp.Authz.Reset()
		_, err := c.Sandboxes.Exec(context.Background(), connect.NewRequest(&apiv1.ExecSandboxRequest{Tenant: "acme", Sandbox: id,
			PublicKey: mxPublicKey(t)}))
		return err
	},
	"sandboxes.restore": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		id := mxSandbox(t, f)
		snap := mxSnapshot(t, f, id)
		f.cp.Authz.Reset()
		_, err := c.Sandboxes.Restore(context.Background(), connect.NewRequest(&apiv1.RestoreSandboxRequest{Tenant: "acme", Sandbox: id, Snapshot: snap}))
		return err
	},
	"sandboxes.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		id := mxSandbox(t, f)
		f.cp.Authz.Reset()
		_, err := c.Sandboxes.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: "acme", Sandbox: id}))
		return err
	},
	"sandboxes.deleteSnapshot": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		snap := mxSnapshot(t, f, mxSandbox(t, f))
		f.cp.Authz.Reset()
		_, err := c.Sandboxes.DeleteSnapshot(context.Background(), connect.NewRequest(&apiv1.DeleteSandboxSnapshotRequest{Tenant: "acme", Snapshot: snap}))
		return err
	},
	"secrets.put": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Secrets.Put(context.Background(), connect.NewRequest(&apiv1.PutSecretRequest{Tenant: "acme", Name: f.name("sec"),
			Value: []byte("s3cret")}))
		return err
	},
	"providerAccounts.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		ref := f.providerSecret(t)
		_, err := c.ProviderAccounts.Create(context.Background(), connect.NewRequest(&apiv1.CreateProviderAccountRequest{Tenant: "acme",
			Name: f.name("pac"), Type: "hetzner-cloud", SecretRefs: map[string]string{"token": ref}}))
		return err
	},
	"providerAccounts.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		ref, name := f.providerSecret(t), f.name("pac")
		_, err := f.admin.ProviderAccounts.Create(context.Background(), connect.NewRequest(&apiv1.CreateProviderAccountRequest{Tenant: "acme",
			Name: name, Type: "hetzner-cloud", SecretRefs: map[string]string{"token": ref}}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.ProviderAccounts.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteProviderAccountRequest{Tenant: "acme", Account: name}))
		return err
	},
	"profiles.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Profiles.Create(context.Background(), connect.NewRequest(&apiv1.CreateProfileRequest{Tenant: "acme",
			Document: sfProfileDoc(f.name("prf"))}))
		return err
	},
	"profiles.update": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.name("prf")
		_, err := f.admin.Profiles.Create(context.Background(), connect.NewRequest(&apiv1.CreateProfileRequest{Tenant: "acme",
			Document: sfProfileDoc(name)}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.Profiles.Update(context.Background(), connect.NewRequest(&apiv1.UpdateProfileRequest{Tenant: "acme", Profile: name,
			Document: sfProfileDoc(name)}))
		return err
	},
	"profiles.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.name("prf")
		_, err := f.admin.Profiles.Create(context.Background(), connect.NewRequest(&apiv1.CreateProfileRequest{Tenant: "acme",
			Document: sfProfileDoc(name)}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.Profiles.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteProfileRequest{Tenant: "acme", Profile: name}))
		return err
	},
	"secrets.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.name("sec")
		_, err := f.admin.Secrets.Put(context.Background(), connect.NewRequest(&apiv1.PutSecretRequest{Tenant: "acme", Name: name,
			Value: []byte("s3cret")}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.Secrets.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteSecretRequest{Tenant: "acme", Secret: name}))
		return err
	},
	"fleetMarks.set": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.FleetConfig.SetMark(context.Background(), connect.NewRequest(&apiv1.SetManagedMarkRequest{Tenant: "acme", Kind: "Pool",
			Name: f.name("fmk"), SpecJson: `{"selector":"gpu.model=H100"}`}))
		return err
	},
	"fleetMarks.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.name("fmk")
		_, err := f.admin.FleetConfig.SetMark(context.Background(), connect.NewRequest(&apiv1.SetManagedMarkRequest{Tenant: "acme", Kind: "Pool",
			Name: name, SpecJson: `{}`}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.FleetConfig.DeleteMark(context.Background(), connect.NewRequest(&apiv1.DeleteManagedMarkRequest{Tenant: "acme", Kind: "Pool", Name: name}))
		return err
	},
	"ipPools.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.IPPools.Create(context.Background(), connect.NewRequest(&apiv1.CreateIPPoolRequest{Tenant: "acme", Name: f.name("ipp"),
			Cidr: "10.0.0.0/24"}))
		return err
	},
	"ipPools.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.name("ipp")
		_, err := f.admin.IPPools.Create(context.Background(), connect.NewRequest(&apiv1.CreateIPPoolRequest{Tenant: "acme", Name: name,
			Cidr: "10.0.0.0/24"}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.IPPools.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteIPPoolRequest{Tenant: "acme", IpPool: name}))
		return err
	},
	"instances.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		f.matrixInstanceCatalog(t)
		_, err := c.Instances.Create(context.Background(), connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: f.name("vm"),
			Flavor: "mx-tiny", Image: "debian-12", IpPool: "mx-lan", Project: "web", Pool: f.gpuPool}))
		return err
	},
	"instances.start": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		id := f.matrixInstance(t, "stopped")
		_, err := c.Instances.Start(context.Background(), connect.NewRequest(&apiv1.StartInstanceRequest{Tenant: "acme", Instance: id}))
		return err
	},
	"instances.stop": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Instances.Stop(context.Background(), connect.NewRequest(&apiv1.StopInstanceRequest{Tenant: "acme", Instance: f.matrixInstance(t, "running")}))
		return err
	},
	"instances.reboot": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Instances.Reboot(context.Background(), connect.NewRequest(&apiv1.RebootInstanceRequest{Tenant: "acme", Instance: f.matrixInstance(t, "running")}))
		return err
	},
	"instances.ssh": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		id := f.matrixInstance(t, "running")
		_, err := c.Instances.Ssh(context.Background(), connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "acme", Instance: id,
			PublicKey: mxPublicKey(t)}))
		return err
	},
	"instances.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Instances.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: f.matrixInstance(t, "running")}))
		return err
	},
	"volumes.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Volumes.Create(context.Background(), connect.NewRequest(&apiv1.CreateVolumeRequest{Tenant: "acme", Name: f.name("vol"), SizeGib: 1,
			Instance: f.volumeHost}))
		return err
	},
	"volumes.attach": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Volumes.Attach(context.Background(), connect.NewRequest(&apiv1.AttachVolumeRequest{Tenant: "acme", Volume: f.matrixVolume(t),
			Instance: f.volumeHost}))
		return err
	},
	"volumes.detach": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Volumes.Detach(context.Background(), connect.NewRequest(&apiv1.DetachVolumeRequest{Tenant: "acme", Volume: f.matrixVolume(t)}))
		return err
	},
	"volumes.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Volumes.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteVolumeRequest{Tenant: "acme", Volume: f.matrixVolume(t)}))
		return err
	},
	"webhooks.redeliver": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		wh, dl := f.matrixDeadDelivery(t)
		_, err := c.Webhooks.Redeliver(context.Background(), connect.NewRequest(&apiv1.RedeliverWebhookRequest{Tenant: "acme", Webhook: wh, Delivery: dl}))
		return err
	},
	"quotas.set": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		gpus := int32(4)
		// A fresh model per cell gives each call a scope of its own.
		_, err := c.Quotas.Set(context.Background(), connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "acme", Project: "web",
			Model: f.name("m"), Gpus: &gpus}))
		return err
	},
	"budgets.set": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		// Soft: the later reservation cells are never refused by it.
		_, err := c.Budgets.Set(context.Background(), connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: "acme", Period: "month",
			Amount: "1000000", Enforcement: "soft"}))
		return err
	},
	"budgets.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := f.admin.Budgets.Set(context.Background(), connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: "acme", Period: "month",
			Amount: "1000000", Enforcement: "soft"}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.Budgets.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteBudgetRequest{Tenant: "acme"}))
		return err
	},
	"reservations.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Reservations.Create(context.Background(), connect.NewRequest(f.matrixReservationRequest()))
		return err
	},
	"reservations.extend": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		// A few minutes more: far below the day an agent may hold GPUs.
		_, err := c.Reservations.Extend(context.Background(), connect.NewRequest(&apiv1.ExtendReservationRequest{Tenant: "acme",
			Reservation: f.matrixReservation(t), ExtendSeconds: 600}))
		return err
	},
	"reservations.release": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Reservations.Release(context.Background(), connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme",
			Reservation: f.matrixReservation(t)}))
		return err
	},
	"reservations.cancel": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Reservations.Cancel(context.Background(), connect.NewRequest(&apiv1.CancelReservationRequest{Tenant: "acme",
			Reservation: f.matrixReservation(t)}))
		return err
	},
	"reservations.exec": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		stream, err := c.Reservations.Exec(context.Background(), connect.NewRequest(&apiv1.ExecReservationRequest{Tenant: "acme",
			Reservation: f.matrixActive(t), Argv: []string{"true"}}))
		if err != nil {
			return err
		}
		defer func() { _ = stream.Close() }()
		for stream.Receive() {
			if e := stream.Msg().GetExit(); e != nil && (e.GetState() != "succeeded" || e.GetExitCode() != 0) {
				return fmt.Errorf("exec ended %s (exit %d): %s", e.GetState(), e.GetExitCode(), e.GetMessage())
			}
		}
		return stream.Err()
	},
	"images.push": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := f.matrixImagePush(c)
		return err
	},
	"images.sign": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		f.matrixSigners(t)
		img := f.matrixImage(t, false)
		_, err := f.matrixSign(c, img, f.acmeSigner)
		return err
	},
	"images.promote": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		img := f.matrixImage(t, true)
		_, err := c.Images.Promote(context.Background(), connect.NewRequest(&apiv1.PromoteImageRequest{Tenant: "acme", Image: img.GetId()}))
		return err
	},
	"releases.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		env, files := f.matrixRelease(t)
		_, err := c.CreateRelease(context.Background(), env, files, "")
		return err
	},
	"releases.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		env, files := f.matrixRelease(t)
		res, err := f.admin.CreateRelease(context.Background(), env, files, "")
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.Releases.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteReleaseRequest{Version: res.GetRelease().GetVersion()}))
		return err
	},
	"images.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		img := f.matrixImage(t, false)
		_, err := c.Images.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteImageRequest{Tenant: "acme", Image: img.GetId()}))
		return err
	},
	"signerKeys.add": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		s, _, err := imagesig.GenerateKey(imagesig.AlgECDSAP256)
		require.NoError(t, err)
		_, err = c.SignerKeys.Add(context.Background(), connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: "acme", Name: f.name("key"),
			PublicKey: s.Public.PEM()}))
		return err
	},
	"signerKeys.remove": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		s, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
		require.NoError(t, err)
		k, err := f.admin.SignerKeys.Add(context.Background(), connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: "acme", Name: f.name("key"),
			PublicKey: s.Public.PEM()}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.SignerKeys.Remove(context.Background(), connect.NewRequest(&apiv1.RemoveSignerKeyRequest{Tenant: "acme", Key: k.Msg.GetSignerKey().GetId()}))
		return err
	},
	"confirmations.approve": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.name("p")
		_, err := f.admin.Projects.Create(context.Background(), connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: name}))
		require.NoError(t, err)
		_, err = f.cp.Client(f.keys["agent"]).Projects.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: name}))
		require.Equal(t, "CONFIRMATION_REQUIRED", client.Code(err))
		f.cp.Authz.Reset()
		_, err = c.Confirmations.Approve(context.Background(), connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: client.Detail(err).GetConfirmationId()}))
		return err
	},
}

// matrixSigners puts a key on acme's and one on the platform's allowlist,
// once.
func (f *matrixFixture) matrixSigners(t *testing.T) {
	t.Helper()
	if f.acmeSigner != nil {
		return
	}
	for _, tenant := range []string{"acme", ""} {
		s, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
		require.NoError(t, err)
		_, err = f.admin.SignerKeys.Add(context.Background(), connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: tenant, Name: f.name("key"),
			PublicKey: s.Public.PEM()}))
		require.NoError(t, err)
		if tenant == "" {
			f.platformSigner = &s
		} else {
			f.acmeSigner = &s
		}
	}
}

// matrixImagePush is a push of fresh bytes into acme.
func (f *matrixFixture) matrixImagePush(c *client.Client) (*apiv1.Image, error) {
	body := []byte(f.name("image-bytes"))
	sum := sha256.Sum256(body)
	res, err := c.PushImage(context.Background(), &apiv1.PushImageHeader{Tenant: "acme", Name: f.name("img"), Kind: "raw",
		Sha256: hex.EncodeToString(sum[:]), SizeBytes: int64(len(body))}, bytes.NewReader(body), "")
	return res.GetImage(), err
}

// matrixImage pushes an image into acme as the platform admin, signed by
// the platform's key when platformSigned, and returns it.
func (f *matrixFixture) matrixImage(t *testing.T, platformSigned bool) *apiv1.Image {
	t.Helper()
	img, err := f.matrixImagePush(f.admin)
	require.NoError(t, err)
	if platformSigned {
		f.matrixSigners(t)
		img, err = f.matrixSign(f.admin, img, f.platformSigner)
		require.NoError(t, err)
	}
	f.cp.Authz.Reset()
	return img
}

func (f *matrixFixture) matrixSign(c *client.Client, img *apiv1.Image, s *imagesig.Signer) (*apiv1.Image, error) {
	sig, err := s.Sign(imagesig.Payload(img.GetName(), img.GetKind(), img.GetSha256()))
	if err != nil {
		return nil, err
	}
	res, err := c.Images.Sign(context.Background(), connect.NewRequest(&apiv1.SignImageRequest{Tenant: "acme", Image: img.GetId(),
		KeyFingerprint: s.Public.Fingerprint, Signature: sig}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetImage(), nil
}

// matrixSite creates a site in acme as the platform admin and returns its
// name.
func (f *matrixFixture) matrixSite(t *testing.T) string {
	t.Helper()
	name := f.name("site")
	_, err := f.admin.Sites.Create(context.Background(), connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: name,
		Networks: []string{"127.0.0.0/8"}}))
	require.NoError(t, err)
	f.cp.Authz.Reset()
	return name
}

// matrixMachineSite is acme's site for the matrix's machines, made on
// first use.
func (f *matrixFixture) matrixMachineSite(t *testing.T) string {
	t.Helper()
	if f.machineSite == "" {
		f.machineSite = f.matrixSite(t)
	}
	return f.machineSite
}

// matrixEnroll is an enrolment of a fresh machine (its own name, MAC and
// BMC address) at site.
func (f *matrixFixture) matrixEnroll(site string) *apiv1.EnrollMachineRequest {
	n := f.counter.Add(1)
	return &apiv1.EnrollMachineRequest{Tenant: "acme", Site: site, Name: fmt.Sprintf("m-%d", n), BmcDriver: "ipmi",
		BmcAddress: fmt.Sprintf("127.0.%d.%d", n/250, n%250+1), BmcUsername: "admin", BmcPassword: "secret",
		Mac: fmt.Sprintf("02:00:00:00:%02x:%02x", n/256, n%256)}
}

// matrixMachine enrolls a machine in acme as the platform admin, puts it in
// state (as its workflows would have) and returns its id.
func (f *matrixFixture) matrixMachine(t *testing.T, state metal.State) string {
	t.Helper()
	res, err := f.admin.Machines.Enroll(context.Background(), connect.NewRequest(f.matrixEnroll(f.matrixMachineSite(t))))
	require.NoError(t, err)
	id := res.Msg.GetMachine().GetId()
	require.NoError(t, f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE machines SET state = $2 WHERE id = $1`, id, string(state))
		return err
	}))
	f.cp.Authz.Reset()
	return id
}

// matrixWorkflow is the active workflow of a fresh ready machine: the
// platform admin's power-on, paused by it when paused is set (with no step
// in flight, so that a retry may restart it).
func (f *matrixFixture) matrixWorkflow(t *testing.T, paused bool) string {
	t.Helper()
	ctx := context.Background()
	m := f.matrixMachine(t, metal.StateReady)
	p, err := f.admin.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: m, Action: "on"}))
	require.NoError(t, err)
	wf := p.Msg.GetMachine().GetWorkflowId()
	if paused {
		_, err = f.admin.Machines.PauseWorkflow(ctx, connect.NewRequest(&apiv1.PauseMachineWorkflowRequest{Tenant: "acme", Workflow: wf}))
		require.NoError(t, err)
		bctest.WaitFor(t, "the paused workflow's step to leave flight", func() bool {
			var n int
			require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
				return tx.QueryRow(ctx, `SELECT COUNT(*) FROM provision_steps WHERE workflow_id = $1 AND state IN ('running', 'awaiting')`, wf).Scan(&n)
			}))
			return n == 0
		})
	}
	f.cp.Authz.Reset()
	return wf
}

// matrixLeasable is a ready machine with a firmware baseline, as a
// commissioning by a signing ramdisk leaves it.
func (f *matrixFixture) matrixLeasable(t *testing.T) string {
	t.Helper()
	id := f.matrixMachine(t, metal.StateReady)
	require.NoError(t, f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE machines SET firmware_baseline = $2 WHERE id = $1`, id, `{"bios_version":"1.0"}`)
		return err
	}))
	return id
}

// matrixOffer is a lease of a fresh machine offered to acme itself, made
// by the platform admin.
func (f *matrixFixture) matrixOffer(t *testing.T) string {
	t.Helper()
	res, err := f.admin.Machines.Lease(context.Background(), connect.NewRequest(&apiv1.LeaseMachineRequest{Tenant: "acme",
		Machine: f.matrixLeasable(t), Lessee: "acme"}))
	require.NoError(t, err)
	f.cp.Authz.Reset()
	return res.Msg.GetLease().GetId()
}

// matrixPool creates a pool in acme as the platform admin and returns its id.
// matrixReleases publishes every version (the control plane does not
// read the manifest; bcd verifies it).
type matrixReleases struct{}

func (matrixReleases) Get(_ context.Context, _ store.Querier, version string) (rollout.Release, error) {
	return rollout.Release{Version: version, Manifest: []byte("{}"), Platforms: []string{"linux-amd64"}}, nil
}

// matrixFreeRolloutPool aborts the active rollout of the matrix's GPU pool,
// as the platform admin, so another may start.
func (f *matrixFixture) matrixFreeRolloutPool(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	l, err := f.admin.Rollouts.List(ctx, connect.NewRequest(&apiv1.ListRolloutsRequest{Pool: f.gpuPool}))
	require.NoError(t, err)
	for _, r := range l.Msg.GetRollouts() {
		if slices.Contains(rollout.ActiveStates, r.GetState()) {
			_, err := f.admin.Rollouts.Abort(ctx, connect.NewRequest(&apiv1.AbortRolloutRequest{Id: r.GetId()}))
			require.NoError(t, err)
		}
	}
	f.cp.Authz.Reset()
}

// matrixRollout starts a rollout on the matrix's GPU pool (paused when
// asked) as the platform admin and returns its id.
func (f *matrixFixture) matrixRollout(t *testing.T, paused bool) string {
	t.Helper()
	ctx := context.Background()
	f.matrixFreeRolloutPool(t)
	r, err := f.admin.Rollouts.Create(ctx, connect.NewRequest(&apiv1.CreateRolloutRequest{Release: "v1.1.0", Pool: f.gpuPool, Waves: []string{"100%"}}))
	require.NoError(t, err)
	id := r.Msg.GetRollout().GetId()
	if paused {
		_, err = f.admin.Rollouts.Pause(ctx, connect.NewRequest(&apiv1.PauseRolloutRequest{Id: id}))
		require.NoError(t, err)
	}
	f.cp.Authz.Reset()
	return id
}

func (f *matrixFixture) matrixPool(t *testing.T) string {
	t.Helper()
	p, err := f.admin.Pools.Create(context.Background(), connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: f.name("pool")}))
	require.NoError(t, err)
	f.cp.Authz.Reset()
	return p.Msg.GetPool().GetId()
}

// matrixReservationRequest asks for one GPU of the GPU pool for an hour in a
// window of its own, hours ahead: cells never compete for the GPUs, and a
// reservation that has not started can be canceled.
func (f *matrixFixture) matrixReservationRequest() *apiv1.CreateReservationRequest {
	start := f.cp.Clock.Now().Add(time.Duration(f.counter.Add(1)) * 2 * time.Hour)
	// One vCPU and 1 GiB, not the pool's per-GPU share: host resources
	// are booked for every live reservation, future ones included, and the
	// matrix makes dozens on one host beside its instances and sandboxes.
	return &apiv1.CreateReservationRequest{Tenant: "acme", Project: "web", Pool: f.gpuPool, Gpus: 1, Vcpu: 1, MemoryGib: 1,
		StartTime: timestamppb.New(start), DurationSeconds: 3600}
}

// matrixReservation creates a reservation in acme as the platform admin and
// returns its id.
func (f *matrixFixture) matrixReservation(t *testing.T) string {
	t.Helper()
	r, err := f.admin.Reservations.Create(context.Background(), connect.NewRequest(f.matrixReservationRequest()))
	require.NoError(t, err)
	require.Equal(t, "placed", r.Msg.GetReservation().GetState())
	f.cp.Authz.Reset()
	return r.Msg.GetReservation().GetId()
}

// matrixActive returns an active reservation of one GPU for the next hour,
// made (as the platform admin) and bound on first use; the windows of
// matrixReservationRequest start later.
func (f *matrixFixture) matrixActive(t *testing.T) string {
	t.Helper()
	if f.active == "" {
		ctx := context.Background()
		r, err := f.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Project: "web",
			Pool: f.gpuPool, Gpus: 1, DurationSeconds: 3600}))
		require.NoError(t, err)
		f.active = r.Msg.GetReservation().GetId()
		eventually(t, "reservation "+f.active+" active", func() bool {
			g, err := f.admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: f.active}))
			require.NoError(t, err)
			return g.Msg.GetReservation().GetState() == "active"
		})
	}
	f.cp.Authz.Reset()
	return f.active
}

// matrixInstanceCatalog makes acme's flavor mx-tiny and IP pool mx-lan
// once.
func (f *matrixFixture) matrixInstanceCatalog(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if _, err := f.admin.Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Tenant: "acme", Flavor: "mx-tiny"})); err == nil {
		f.cp.Authz.Reset()
		return
	}
	_, err := f.admin.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Tenant: "acme", Name: "mx-tiny", Vcpus: 1,
		MemoryMib: 1024, DiskGib: 1}))
	require.NoError(t, err)
	_, err = f.admin.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Tenant: "acme", Name: "mx-lan", Cidr: "10.50.0.0/16"}))
	require.NoError(t, err)
	f.cp.Authz.Reset()
}

// matrixInstance returns a fresh instance of acme/web on the pool's node,
// running or stopped.
func (f *matrixFixture) matrixInstance(t *testing.T, state string) string {
	t.Helper()
	ctx := context.Background()
	f.matrixInstanceCatalog(t)
	res, err := f.admin.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: f.name("vm"),
		Flavor: "mx-tiny", Image: "debian-12", IpPool: "mx-lan", Project: "web", Pool: f.gpuPool}))
	require.NoError(t, err)
	id := res.Msg.GetInstance().GetId()
	wait := func(want string) {
		eventually(t, "instance "+id+" "+want, func() bool {
			g, err := f.admin.Instances.Get(ctx, connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "acme", Instance: id}))
			require.NoError(t, err)
			return g.Msg.GetInstance().GetState() == want
		})
	}
	wait("running")
	// The matrix makes one per principal and action on one host: give its
	// booking back once the case is decided.
	t.Cleanup(func() {
		_, _ = f.admin.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: id}))
		wait("deleted")
	})
	if state == "stopped" {
		_, err := f.admin.Instances.Stop(ctx, connect.NewRequest(&apiv1.StopInstanceRequest{Tenant: "acme", Instance: id}))
		require.NoError(t, err)
		wait("stopped")
	}
	f.cp.Authz.Reset()
	return id
}

// matrixVolume returns a fresh detached volume of acme on the pool's node.
func (f *matrixFixture) matrixVolume(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	v, err := f.admin.Volumes.Create(ctx, connect.NewRequest(&apiv1.CreateVolumeRequest{Tenant: "acme", Name: f.name("vol"), SizeGib: 1,
		Instance: f.volumeHost}))
	require.NoError(t, err)
	id := v.Msg.GetVolume().GetId()
	eventually(t, "volume "+id+" available", func() bool {
		g, err := f.admin.Volumes.Get(ctx, connect.NewRequest(&apiv1.GetVolumeRequest{Tenant: "acme", Volume: id}))
		require.NoError(t, err)
		return g.Msg.GetVolume().GetState() == "available"
	})
	f.cp.Authz.Reset()
	return id
}

// mxGPUPool joins one simulated 8-GPU node to tenant/project and returns
// the id of a pool that adopts it; the node stops with the test.
func mxGPUPool(t *testing.T, cp *bctest.ControlPlane, admin *client.Client, tenant, project string) string {
	t.Helper()
	ctx := context.Background()
	before := countRows(t, cp, `SELECT COUNT(*) FROM gpus`)
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: tenant, Project: project}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	eventually(t, "the node's 8 GPUs", func() bool { return countRows(t, cp, `SELECT COUNT(*) FROM gpus`) == before+8 })
	p, err := admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: tenant, Name: "gpus",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	return p.Msg.GetPool().GetId()
}

// mxSandboxBase gives acme a flavor and an IP pool for sandbox templates
// (once; a second call finds them).
func mxSandboxBase(t *testing.T, f *matrixFixture) {
	t.Helper()
	ctx := context.Background()
	if _, err := f.admin.Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Tenant: "acme", Flavor: "sbx-tiny"})); err == nil {
		return
	}
	_, err := f.admin.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Tenant: "acme", Name: "sbx-tiny", Vcpus: 1,
		MemoryMib: 512, DiskGib: 1}))
	require.NoError(t, err)
	_, err = f.admin.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Tenant: "acme", Name: "sbx-lan", Cidr: "10.77.0.0/24"}))
	require.NoError(t, err)
}

func mxTemplateReq(name string) *apiv1.CreateSandboxTemplateRequest {
	return &apiv1.CreateSandboxTemplateRequest{Tenant: "acme", Name: name, Flavor: "sbx-tiny", Image: "debian-12", Pool: "gpus", IpPool: "sbx-lan", Project: "web",
		DefaultTtl: durationpb.New(10 * time.Minute), MaxTtl: durationpb.New(time.Hour)}
}

// mxSandboxTemplate creates a template of acme's as its admin.
func mxSandboxTemplate(t *testing.T, f *matrixFixture) string {
	t.Helper()
	mxSandboxBase(t, f)
	name := f.name("sbt")
	_, err := f.admin.SandboxTemplates.Create(context.Background(), connect.NewRequest(mxTemplateReq(name)))
	require.NoError(t, err)
	return name
}

// mxPublicKey is a fresh SSH public key in authorized_keys form.
func mxPublicKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	k, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}

// mxSandbox creates a running sandbox of acme's as its admin.
func mxSandbox(t *testing.T, f *matrixFixture) string {
	t.Helper()
	ctx := context.Background()
	res, err := f.admin.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: mxSandboxTemplate(t, f)}))
	require.NoError(t, err)
	id := res.Msg.GetSandbox().GetId()
	eventually(t, "sandbox "+id+" running", func() bool {
		g, err := f.admin.Sandboxes.Get(ctx, connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: "acme", Sandbox: id}))
		return err == nil && g.Msg.GetSandbox().GetState() == "running"
	})
	// The matrix makes one per principal and action on one host: give its
	// booking back once the case is decided.
	t.Cleanup(func() {
		_, _ = f.admin.Sandboxes.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: "acme", Sandbox: id}))
		eventually(t, "sandbox "+id+" deleted", func() bool {
			g, err := f.admin.Sandboxes.Get(ctx, connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: "acme", Sandbox: id}))
			return err == nil && g.Msg.GetSandbox().GetState() == "deleted"
		})
	})
	return id
}

// TestCatalogCoversAPI fails when the API serves a procedure that has no
// catalog row (it would be refused at runtime) or the catalog names one the
// API does not serve.
func TestCatalogCoversAPI(t *testing.T) {
	t.Parallel()
	served := map[string]bool{}
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if fd.Package() != "bettercompute.api.v1" {
			return true
		}
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				served[fmt.Sprintf("/%s/%s", svc.FullName(), svc.Methods().Get(j).Name())] = true
			}
		}
		return true
	})
	_ = apiv1.File_bettercompute_api_v1_tenancy_proto // make sure the descriptors are registered
	require.NotEmpty(t, served)
	for p := range served {
		_, ok := envelope.Lookup(p)
		require.True(t, ok, "procedure %s has no catalog row", p)
	}
	for _, m := range envelope.Catalog() {
		require.True(t, served[m.Procedure], "catalog row %s is not served", m.Procedure)
	}
}

// TestAuthzMatrix runs every mutation of the catalog as every principal kind
// and checks the outcome and that exactly one authorization decision was
// made for it.
func TestAuthzMatrix(t *testing.T) {
	t.Parallel()
	releaseKey, _, err := release.GenerateKey(release.AlgEd25519)
	require.NoError(t, err)
	releasePub := filepath.Join(t.TempDir(), "release.pub")
	require.NoError(t, os.WriteFile(releasePub, releaseKey.Public.PEM(), 0o644))
	cp := bctest.NewControlPlane(t, func(c *app.Config) { c.ReleasePubkeys = []string{releasePub} })
	ctx := context.Background()
	f := &matrixFixture{cp: cp, admin: cp.Admin(), keys: map[string]string{"platform-admin": cp.AdminKey}, releaseKey: releaseKey}
	cp.App.Rollouts.SetReleases(matrixReleases{})
	acme, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	web, err := f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web"}))
	require.NoError(t, err)
	f.acme, f.web = acme.Msg.GetTenant().GetId(), web.Msg.GetProject().GetId()
	for _, role := range []string{"admin", "member", "operator", "viewer", "agent"} {
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: role}))
		require.NoError(t, err)
		f.keys[role] = k.Msg.GetSecret()
	}
	f.gpuPool = mxGPUPool(t, cp, f.admin, "acme", "web")
	f.volumeHost = f.matrixInstance(t, "running")

	var actions []string
	for _, m := range envelope.Catalog() {
		if m.Kind != envelope.KindMutation {
			continue
		}
		actions = append(actions, m.Action)
		require.Contains(t, matrixExpect, m.Action, "mutation %s has no row in the authz matrix", m.Action)
		require.Contains(t, matrixCalls, m.Action, "mutation %s has no call in the authz matrix", m.Action)
	}
	sort.Strings(actions)
	// Several procedures may share an action (Create and CreateReservations
	// are both reservations.create): the matrix has a row per action.
	actions = slices.Compact(actions)
	require.Len(t, matrixExpect, len(actions), "the matrix names a mutation the catalog does not have")

	// Cells share one control plane, so they run one after another: the
	// decision counter is global to it.
	for _, action := range actions {
		for _, who := range matrixPrincipals {
			want := matrixExpect[action][who]
			require.NotEmpty(t, want, "no expectation for %s as %s", action, who)
			t.Run(action+"/"+who, func(t *testing.T) {
				cp.Authz.Reset()
				err := matrixCalls[action](t, f, cp.Client(f.keys[who]))
				got := "OK"
				if err != nil {
					got = client.Code(err)
				}
				require.Equal(t, want, got, "err: %v", err)
				require.Equal(t, 1, cp.Authz.CallsFor(action), "decisions for %s", action)
				require.Equal(t, 1, cp.Authz.Calls(), "decisions in total")
			})
		}
	}
}

// TestAuthzAgentExtendNeedsConfirmation: an agent may keep GPUs for a day;
// an extension past that waits for a human, and the reservation keeps its
// end until one approves.
func TestAuthzAgentExtendNeedsConfirmation(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	sfProject(t, admin, "acme", "web")
	agentSecret, _ := sfKey(t, admin, "acme", "agent", 0)
	agent := cp.Client(agentSecret)
	pool := mxGPUPool(t, cp, admin, "acme", "web")

	res, err := agent.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Pool: pool,
		Gpus: 1, DurationSeconds: 3600}))
	require.NoError(t, err)
	r := res.Msg.GetReservation()
	end := r.GetEndTime().AsTime()
	extend := &apiv1.ExtendReservationRequest{Tenant: "acme", Reservation: r.GetId(), ExtendSeconds: 24 * 3600}

	err = cfRequireDecisions(t, cp, "reservations.extend", 1, func() error {
		_, err := agent.Reservations.Extend(ctx, connect.NewRequest(extend))
		return err
	})
	sfRequireCode(t, err, "CONFIRMATION_REQUIRED")
	cfmID := client.Detail(err).GetConfirmationId()
	require.True(t, envelope.IsID(cfmID, "cfm"), "confirmation id %q", cfmID)
	got, err := admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: r.GetId()}))
	require.NoError(t, err)
	require.Equal(t, end, got.Msg.GetReservation().GetEndTime().AsTime(), "the end waits for a human")

	// An extension within the day needs nobody.
	ok, err := agent.Reservations.Extend(ctx, connect.NewRequest(&apiv1.ExtendReservationRequest{Tenant: "acme",
		Reservation: r.GetId(), ExtendSeconds: 3600}))
	require.NoError(t, err)
	end = end.Add(time.Hour)
	require.Equal(t, end, ok.Msg.GetReservation().GetEndTime().AsTime())

	// A human approves; the agent's replay extends it.
	_, err = admin.Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: cfmID}))
	require.NoError(t, err)
	done, err := agent.Reservations.Extend(ctx, sfWithHeader(extend, client.HeaderConfirmationID, cfmID))
	require.NoError(t, err)
	require.Equal(t, end.Add(24*time.Hour), done.Msg.GetReservation().GetEndTime().AsTime())
}

// mxSnapshot takes a snapshot of the sandbox as acme's admin and waits
// until it is ready.
func mxSnapshot(t *testing.T, f *matrixFixture, sandboxID string) string {
	t.Helper()
	ctx := context.Background()
	s, err := f.admin.Sandboxes.Snapshot(ctx, connect.NewRequest(&apiv1.SnapshotSandboxRequest{Tenant: "acme", Sandbox: sandboxID}))
	require.NoError(t, err)
	snap := s.Msg.GetSnapshot().GetId()
	eventually(t, "snapshot "+snap+" ready", func() bool {
		n := 0
		err := f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM sandbox_snapshots WHERE id = $1 AND state = 'ready'`, snap).Scan(&n)
		})
		return err == nil && n == 1
	})
	return snap
}
