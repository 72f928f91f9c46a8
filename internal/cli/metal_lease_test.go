package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/imagesig"
)

// TestMachineLeaseCommands drives a dedicated-root lease through the CLI:
// acme leases its commissioned IPMI machine to beta, beta accepts with its
// own signed image and root key, releases, and lease-get shows every
// teardown step's verified evidence; the machine is ready again.
func TestMachineLeaseCommands(t *testing.T) {
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
	type machine struct {
		Machine struct{ WorkflowId, State, LeaseId string }
	}
	get := func() machine {
		var m machine
		require.NoError(t, json.Unmarshal([]byte(ok("machines", "get", "m1", "--tenant", "acme", "-o", "json")), &m))
		return m
	}
	idle := func() machine {
		var m machine
		bctest.WaitFor(t, "m1's workflow to end", func() bool { m = get(); return m.Machine.WorkflowId == "" })
		return m
	}
	ok("tenants", "create", "acme")
	ok("tenants", "create", "beta")
	var site struct{ Site struct{ Id string } }
	require.NoError(t, json.Unmarshal([]byte(ok("sites", "create", "dc1", "--tenant", "acme", "--networks", "127.0.0.0/8", "-o", "json")), &site))
	sim := bctest.NewSimSite(t, cp.App.Metal, site.Site.Id)
	sim.SignSiteReports(t, cp)
	sm := sim.AddIPMIMachine(t, "m1")
	pwFile := filepath.Join(dir, "bmc-password")
	require.NoError(t, os.WriteFile(pwFile, []byte(sm.Password), 0o600))
	ok("machines", "enroll", "m1", "--tenant", "acme", "--site", "dc1", "--bmc-driver", "ipmi",
		"--bmc-address", sm.BMCAddress, "--bmc-username", sm.Username, "--bmc-password-file", pwFile, "--mac", sm.MAC)
	ok("machines", "commission", "m1", "--tenant", "acme")
	require.Equal(t, "ready", idle().Machine.State)

	// beta's own image, signed by a key on beta's allowlist.
	ctx := context.Background()
	admin := cp.Admin()
	b := []byte("beta's os")
	sum := sha256.Sum256(b)
	pushed, err := admin.PushImage(ctx, &apiv1.PushImageHeader{Tenant: "beta", Name: "beta-os", Kind: "raw",
		Sha256: hex.EncodeToString(sum[:]), SizeBytes: int64(len(b))}, bytes.NewReader(b), "")
	require.NoError(t, err)
	signer, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	require.NoError(t, err)
	_, err = admin.SignerKeys.Add(ctx, connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: "beta", Name: "beta-key", PublicKey: signer.Public.PEM()}))
	require.NoError(t, err)
	img := pushed.GetImage()
	sig, err := signer.Sign(imagesig.Payload(img.GetName(), img.GetKind(), img.GetSha256()))
	require.NoError(t, err)
	_, err = admin.Images.Sign(ctx, connect.NewRequest(&apiv1.SignImageRequest{Tenant: "beta", Image: img.GetId(),
		KeyFingerprint: signer.Public.Fingerprint, Signature: sig}))
	require.NoError(t, err)
	keyFile := filepath.Join(dir, "id.pub")
	require.NoError(t, os.WriteFile(keyFile, []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl root@beta\n"), 0o600))

	code, _, errs := cli("machines", "lease", "m1", "--tenant", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "lessee")

	var lease struct{ Lease struct{ Id, State string } }
	require.NoError(t, json.Unmarshal([]byte(ok("machines", "lease", "m1", "--tenant", "acme", "--lessee", "beta", "-o", "json")), &lease))
	require.Equal(t, "offered", lease.Lease.State)
	out := ok("machines", "lease-accept", lease.Lease.Id, "--tenant", "beta", "--image", "beta-os", "--ssh-key-file", keyFile)
	require.Contains(t, out, "deploying")
	require.Contains(t, out, "root key SHA256:")
	m := idle()
	require.Equal(t, "deployed", m.Machine.State)
	require.Equal(t, lease.Lease.Id, m.Machine.LeaseId)
	require.Contains(t, ok("machines", "get", "m1", "--tenant", "acme"), "under dedicated-root lease "+lease.Lease.Id)

	require.Contains(t, ok("machines", "lease-release", lease.Lease.Id, "--tenant", "beta"), "releasing")
	require.Equal(t, "ready", idle().Machine.State, "%s\n%s", ok("machines", "get", "m1", "--tenant", "acme"),
		ok("machines", "lease-get", lease.Lease.Id, "--tenant", "beta"))
	out = ok("machines", "lease-get", lease.Lease.Id, "--tenant", "beta")
	require.Contains(t, out, "returned")
	require.Contains(t, out, "teardown evidence:")
	for _, step := range []string{"fence", "boot-ramdisk", "ramdisk-joined", "firmware", "erase", "gpu-diagnostics", "power-off", "rotate-bmc"} {
		require.Regexp(t, `\n  `+step+` +ok `, out)
	}
	require.NotContains(t, out, "REFUSED")
}
