package cli

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/quorum/approval"
	"github.com/better-compute/better-compute/internal/store"
)

// serveAgent serves a real ssh-agent keyring holding key on a unix socket
// and returns the socket's path.
func serveAgent(t *testing.T, key any) string {
	t.Helper()
	// A unix socket path is short (108 bytes): t.TempDir() may be longer.
	dir, err := os.MkdirTemp("", "bcagent")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	keyring := agent.NewKeyring()
	require.NoError(t, keyring.Add(agent.AddedKey{PrivateKey: key, Comment: "approver"}))
	// A decoy that is no approver: the CLI must pick the approver's key.
	_, decoy, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	require.NoError(t, keyring.Add(agent.AddedKey{PrivateKey: decoy, Comment: "decoy"}))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = agent.ServeAgent(keyring, c)
			}()
		}
	}()
	return sock
}

// TestBatchesCLI: approvers set, a batch proposed, approved once with a key
// file (it does not run) and once through a real SSH agent (it runs, each
// leaf once), and an approver-set rotation signed by the old quorum.
func TestBatchesCLI(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	dir := t.TempDir()
	env := map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: cp.URL, envToken: cp.AdminKey, "HOME": dir}
	cli := func(argv ...string) (int, string, string) {
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}
	ok := func(argv ...string) string {
		t.Helper()
		code, out, errs := cli(argv...)
		require.Equal(t, 0, code, "%v: %s", argv, errs)
		return out
	}
	ok("tenants", "create", "acme")
	var tenantID string
	var node string
	require.NoError(t, cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT id FROM tenants WHERE name = 'acme'`).Scan(&tenantID); err != nil {
			return err
		}
		now := cp.Clock.Now()
		node = envelope.NewID(fleet.NodeIDPrefix, now)
		return fleet.NodeInsert(ctx, tx, &fleet.NodeInsertParams{ID: node, Name: "rd-1", TenantID: tenantID, ProjectID: "prj_x",
			HardwareKey: "hw-1", State: fleet.NodeActive, Liveness: fleet.LivenessReady, Mode: fleet.RoleRamdisk, CreateTime: now})
	}))

	// Approver 1: an Ed25519 key in an OpenSSH private key file.
	_, k1, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	blk, err := ssh.MarshalPrivateKey(k1, "approver-1")
	require.NoError(t, err)
	keyFile := filepath.Join(dir, "id_ed25519")
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(blk), 0o600))
	s1, err := ssh.NewSignerFromKey(k1)
	require.NoError(t, err)
	// Approver 2: an ECDSA key held only by an SSH agent.
	k2, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	s2, err := ssh.NewSignerFromKey(k2)
	require.NoError(t, err)
	env[envSSHAuthSock] = serveAgent(t, k2)
	pub := func(name string, s ssh.Signer) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, ssh.MarshalAuthorizedKey(s.PublicKey()), 0o600))
		return p
	}
	p1, p2 := pub("a1.pub", s1), pub("a2.pub", s2)

	out := ok("batches", "approvers", "set", "--tenant", "acme", "--threshold", "2", "--public-key", p1, "--public-key", p2)
	require.Contains(t, out, "2 of 2")

	out = ok("batches", "create", "--tenant", "acme", "--leaf", `disk.wipe,`+node+`,{"method":"discard","passes":1}`, "-o", "json")
	var created struct {
		Batch struct {
			ID string `json:"id"`
		} `json:"batch"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &created))
	id := created.Batch.ID
	require.True(t, envelope.IsID(id, "cbt"), out)

	out = ok("batches", "approve", id, "--tenant", "acme", "--key", keyFile)
	require.Contains(t, out, "pending")
	require.Contains(t, out, "1/2")
	code, _, errs := cli("commands", "run", "--batch", id, "--tenant", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "1 of the 2 approvals")

	out = ok("batches", "approve", id, "--tenant", "acme", "--ssh-agent")
	require.Contains(t, out, "approved")
	require.Contains(t, out, approval.KeyID(s2.PublicKey()))
	out = ok("commands", "run", "--batch", id, "--tenant", "acme")
	require.Contains(t, out, "ran")
	require.Contains(t, out, "cmd_")
	require.Equal(t, 1, strings.Count(ok("commands", "list", "--tenant", "acme"), "disk.wipe"))
	ok("commands", "run", "--batch", id, "--tenant", "acme")
	require.Equal(t, 1, strings.Count(ok("commands", "list", "--tenant", "acme"), "disk.wipe"), "a second run adds no command")

	// Rotation to approver 1 alone: its own approval is one of two needed.
	line1 := strings.TrimSpace(ok("batches", "approvers", "sign", "--tenant", "acme", "--threshold", "1", "--public-key", p1, "--key", keyFile))
	code, _, errs = cli("batches", "approvers", "set", "--tenant", "acme", "--threshold", "1", "--public-key", p1, "--approval", line1)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "PERMISSION_DENIED")
	require.Contains(t, errs, "needs approvals by 2 of the 2 keys of epoch 1")
	line2 := strings.TrimSpace(ok("batches", "approvers", "sign", "--tenant", "acme", "--threshold", "1", "--public-key", p1, "--ssh-agent"))
	out = ok("batches", "approvers", "set", "--tenant", "acme", "--threshold", "1", "--public-key", p1, "--approval", line1, "--approval", line2)
	require.Contains(t, out, "1 of 1")
	require.Contains(t, ok("batches", "approvers", "get", "--tenant", "acme"), approval.KeyID(s1.PublicKey()))

	// Now the agent's key is no approver: the CLI says so before signing.
	b2 := ok("batches", "create", "--tenant", "acme", "--leaf", "disk.wipe,"+node)
	id2 := strings.Fields(strings.Split(b2, "\n")[1])[0]
	code, _, errs = cli("batches", "approve", id2, "--tenant", "acme", "--ssh-agent")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "is an approver")
	require.Contains(t, ok("batches", "list", "--tenant", "acme", "--state", "pending"), id2)
	require.Contains(t, ok("batches", "cancel", id2, "--tenant", "acme"), "canceled")
}

// TestBatchRootRefusesALyingServer: the CLI signs only the root it
// recomputes from the leaves it was shown.
func TestBatchRootRefusesALyingServer(t *testing.T) {
	t.Parallel()
	params, err := structpb.NewStruct(map[string]any{"method": "discard"})
	require.NoError(t, err)
	d, _, err := approval.ParamsDigest(params.AsMap())
	require.NoError(t, err)
	leaf := approval.Leaf{Kind: "disk.wipe", Subject: "nod_1", ParamsDigest: d}
	root, err := approval.Root([]approval.Leaf{leaf})
	require.NoError(t, err)
	honest := &apiv1.CommandBatch{Id: "cbt_1", Root: approval.HexRoot(root), Leaves: []*apiv1.CommandBatchLeaf{
		{Kind: "disk.wipe", Subject: "nod_1", Params: params, ParamsSha256: approval.HexRoot(d)}}}
	got, err := BatchRoot(honest)
	require.NoError(t, err)
	require.Equal(t, root, got)

	otherRoot := proto.CloneOf(honest)
	otherRoot.Root = strings.Repeat("ab", 32)
	_, err = BatchRoot(otherRoot)
	require.ErrorContains(t, err, "not signing")

	otherSubject := proto.CloneOf(honest)
	otherSubject.Leaves[0].Subject = "nod_2"
	_, err = BatchRoot(otherSubject)
	require.ErrorContains(t, err, "not signing")

	otherParams := proto.CloneOf(honest)
	otherParams.Leaves[0].Params.Fields["method"] = structpb.NewStringValue("zero")
	_, err = BatchRoot(otherParams)
	require.ErrorContains(t, err, "not signing")
}
