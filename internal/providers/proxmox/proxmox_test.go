package proxmox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest/proxmoxemu"
	"github.com/better-compute/better-compute/internal/providers"
	"github.com/better-compute/better-compute/internal/providers/conformance"
	"github.com/better-compute/better-compute/internal/providers/proxmox"
)

func settings(emu *proxmoxemu.Server) map[string]string {
	return map[string]string{
		"token_id":    emu.TokenID(),
		"api_url":     emu.URL(),
		"node":        proxmoxemu.NodeA,
		"nodes":       proxmoxemu.NodeA + "," + proxmoxemu.NodeB,
		"template":    proxmoxemu.TemplateName,
		"storage":     proxmoxemu.DiskStorage,
		"bridge":      proxmoxemu.Bridge,
		"iso_storage": proxmoxemu.ISOStorage,
		"sizes":       proxmoxemu.Sizes,
	}
}

// newProvider builds a provider against emu as the registry would.
func newProvider(t *testing.T, emu *proxmoxemu.Server, log *slog.Logger, edit func(map[string]string)) providers.Provider {
	t.Helper()
	f, ok := providers.Lookup(proxmox.Type)
	require.True(t, ok, "the proxmox type is registered")
	s := settings(emu)
	if edit != nil {
		edit(s)
	}
	refs := map[string]string{"token_secret": "sealed:proxmox-token"}
	require.Empty(t, f.Manifest.Validate(s, refs))
	p, err := f.New(providers.Config{
		Credentials:    map[string]string{"token_secret": emu.Secret()},
		Settings:       s,
		ControlPlaneID: "cp-test",
		HTTPClient:     emu.Client(),
		Logger:         log,
	})
	require.NoError(t, err)
	return p
}

func TestConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, conformance.Harness{
		New: func(t *testing.T, log *slog.Logger) (providers.Provider, conformance.Emulator) {
			emu := proxmoxemu.New(t)
			return newProvider(t, emu, log, nil), emu
		},
		Request: providers.CreateRequest{ServerType: "small", Image: proxmoxemu.TemplateName, Location: proxmoxemu.NodeA},
	})
}

type fixture struct {
	emu *proxmoxemu.Server
	p   providers.Provider
	ctx context.Context
}

func setup(t *testing.T) fixture {
	t.Helper()
	emu := proxmoxemu.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return fixture{emu: emu, p: newProvider(t, emu, nil, nil), ctx: ctx}
}

const userData = "#cloud-config\nwrite_files:\n- path: /etc/bcd/join-token\n  content: bcjoin_test_token_0123456789\n"

// The VM carries its labels in its description, its size in its config,
// and its user data on an ISO only: never in its config.
func TestCreateWritesLabelsSizeAndCloudInitISO(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s, err := f.p.Create(f.ctx, providers.CreateRequest{
		InstanceID: "ins_a1", Name: "bc-a1", ServerType: "medium", Location: proxmoxemu.NodeB,
		UserData: userData, SSHKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample op@example"},
		Labels: map[string]string{"pool": "gpu-a"},
	})
	require.NoError(t, err)
	require.Equal(t, providers.StatusRunning, s.Status)
	require.Equal(t, proxmoxemu.NodeB, s.Location)
	require.Equal(t, "medium", s.ServerType)
	require.Equal(t, "gpu-a", s.Labels["pool"])
	require.Equal(t, "cp-test", s.Labels[providers.ManagedLabel])
	require.False(t, s.Created.IsZero())

	id, err := strconv.Atoi(s.ID)
	require.NoError(t, err)
	cfg := f.emu.VMConfig(id)
	require.Equal(t, "4", cfg["cores"])
	require.Equal(t, "8192", cfg["memory"])
	require.Equal(t, "bc-a1", cfg["name"])
	require.Contains(t, cfg["description"], `"bettercompute.io/instance":"ins_a1"`)
	require.Contains(t, cfg["net0"], "bridge="+proxmoxemu.Bridge)
	vol := proxmoxemu.ISOStorage + ":iso/bc-" + s.ID + "-cidata.iso"
	require.Equal(t, vol+",media=cdrom", cfg["ide2"])
	for k, v := range cfg {
		require.NotContains(t, v, "bcjoin_test_token", "config key %s carries the join token", k)
	}

	files := readISO(t, f.emu.Volume(vol))
	require.Equal(t, userData, files["user-data"])
	require.Contains(t, files["meta-data"], "instance-id: ins_a1")
	require.Contains(t, files["meta-data"], "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample")

	require.NoError(t, f.p.Delete(f.ctx, "ins_a1"))
	require.Empty(t, f.emu.Volumes(), "delete removes the cloud-init ISO")
}

// readISO reads every file of a NoCloud seed.
func readISO(t *testing.T, iso []byte) map[string]string {
	t.Helper()
	require.NotEmpty(t, iso)
	path := filepath.Join(t.TempDir(), "seed.iso")
	require.NoError(t, os.WriteFile(path, iso, 0o600))
	b, err := file.OpenFromPath(path, true)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	fs, err := iso9660.Read(b, 0, 0, 2048)
	require.NoError(t, err)
	require.Equal(t, "cidata", strings.TrimRight(fs.Label(), "\x00 "))
	out := map[string]string{}
	for _, name := range []string{"user-data", "meta-data"} {
		fh, err := fs.OpenFile("/"+name, os.O_RDONLY)
		require.NoError(t, err, name)
		c, err := io.ReadAll(fh)
		require.NoError(t, err)
		out[name] = string(c)
	}
	return out
}

// A VM id another client takes between nextid and the clone costs one
// more try, not a failure.
func TestCloneRetriesATakenVMID(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.emu.RaceNextID()
	s, err := f.p.Create(f.ctx, providers.CreateRequest{InstanceID: "ins_b1", UserData: userData})
	require.NoError(t, err)
	require.Equal(t, "101", s.ID, "100 went to the other client")
	require.Equal(t, "bc-ins-b1", s.Name, "a VM without a name is named for its instance, as a DNS name")
	require.Equal(t, 2, f.emu.Servers())
	list, err := f.p.List(f.ctx)
	require.NoError(t, err)
	require.Len(t, list, 1, "the other client's VM is not ours")
}

// A rebuild re-clones the template under the VM's own id and boots the
// same cloud-init seed.
func TestRebuildKeepsTheVMIDAndSeed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s, err := f.p.Create(f.ctx, providers.CreateRequest{InstanceID: "ins_r1", Name: "bc-r1", ServerType: "large", UserData: userData})
	require.NoError(t, err)
	id, err := strconv.Atoi(s.ID)
	require.NoError(t, err)
	require.NoError(t, f.p.Power(f.ctx, "ins_r1", providers.PowerOff))
	require.NoError(t, f.p.Rebuild(f.ctx, "ins_r1", strconv.Itoa(proxmoxemu.TemplateID)))
	got, err := f.p.Get(f.ctx, "ins_r1")
	require.NoError(t, err)
	require.Equal(t, s.ID, got.ID)
	require.Equal(t, providers.StatusRunning, got.Status)
	require.Equal(t, "large", got.ServerType)
	cfg := f.emu.VMConfig(id)
	require.Equal(t, proxmoxemu.ISOStorage+":iso/bc-"+s.ID+"-cidata.iso,media=cdrom", cfg["ide2"])
	require.Equal(t, "8", cfg["cores"])
	require.Equal(t, 1, f.emu.Servers())
}

func TestErrorsNameTheirKind(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		status int
		msg    string
		want   providers.ErrorKind
	}{
		{"missing VM", 500, "Configuration file 'nodes/pve1/qemu-server/107.conf' does not exist", providers.KindNotFound},
		{"parameter", 400, "Parameter verification failed.", providers.KindInvalid},
		{"node down", 595, "Connection refused", providers.KindUnavailable},
		{"token", 401, "authentication failure", providers.KindAuth},
		{"permission", 403, "Permission check failed (/vms/100, VM.Allocate)", providers.KindForbidden},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			f.emu.FailNext(c.status, c.msg)
			_, err := f.p.List(f.ctx)
			require.Equal(t, c.want, providers.KindOf(err), "%v", err)
		})
	}
	f := setup(t)
	f.emu.RateLimitNext(1)
	_, err := f.p.Offers(f.ctx)
	require.True(t, errors.Is(err, providers.ErrRateLimited), "%v", err)
	ok, after := providers.Retryable(err)
	require.True(t, ok)
	require.GreaterOrEqual(t, after, time.Second)
}

func TestCreateRefusesWhatTheAccountLacks(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, req := range []providers.CreateRequest{
		{InstanceID: "ins_c1", ServerType: "huge"},
		{InstanceID: "ins_c2", Location: "pve9"},
		{InstanceID: "ins_c3", Image: "no-such-template"},
	} {
		_, err := f.p.Create(f.ctx, req)
		require.Equal(t, providers.KindInvalid, providers.KindOf(err), "%+v: %v", req, err)
	}
	bad := newProvider(t, f.emu, nil, func(s map[string]string) { s["bridge"] = "vmbr7" })
	_, err := bad.Create(f.ctx, providers.CreateRequest{InstanceID: "ins_c4", UserData: userData})
	require.Equal(t, providers.KindInvalid, providers.KindOf(err), "%v", err)
	require.Contains(t, err.Error(), "vmbr7")
}

// Offers: every size on every node; a node off line offers nothing.
func TestOffersFollowNodes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	offers, err := f.p.Offers(f.ctx)
	require.NoError(t, err)
	require.Len(t, offers, f.emu.Offers())
	f.emu.SetNodeOnline(proxmoxemu.NodeB, false)
	offers, err = f.p.Offers(f.ctx)
	require.NoError(t, err)
	available := 0
	for _, o := range offers {
		if o.Available {
			available++
			require.Equal(t, proxmoxemu.NodeA, o.Location)
		}
	}
	require.Equal(t, f.emu.Offers(), available)
}

// TestProxmoxerAgainstEmulator runs Debian's python3-proxmoxer against the
// emulator: proof that it speaks the real API, not what our provider
// happens to send. BC_PROXMOXER=1 turns it on (apt-get install
// python3-proxmoxer python3-requests).
func TestProxmoxerAgainstEmulator(t *testing.T) {
	t.Parallel()
	if os.Getenv("BC_PROXMOXER") != "1" {
		t.Skip("BC_PROXMOXER=1 runs proxmoxer against the emulator")
	}
	python := ""
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import proxmoxer, requests").Run() == nil {
			python = py
			break
		}
	}
	require.NotEmpty(t, python, "no python3 with proxmoxer and requests: apt-get install -y python3-proxmoxer python3-requests")
	emu := proxmoxemu.New(t)
	user, token, _ := strings.Cut(emu.TokenID(), "!")
	cmd := exec.CommandContext(t.Context(), python, "-c", proxmoxerScript)
	cmd.Env = append(os.Environ(),
		"PVE_HOST="+emu.HostPort(), "PVE_USER="+user, "PVE_TOKEN="+token, "PVE_SECRET="+emu.Secret(),
		"PVE_NODE="+proxmoxemu.NodeA, "PVE_TEMPLATE="+strconv.Itoa(proxmoxemu.TemplateID))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "proxmoxer: ok")
	require.Zero(t, emu.Servers(), "proxmoxer deleted its clone")
}

const proxmoxerScript = `
import os, sys, time, urllib.parse
from proxmoxer import ProxmoxAPI, ResourceException

host, port = os.environ["PVE_HOST"].rsplit(":", 1)
node, template = os.environ["PVE_NODE"], int(os.environ["PVE_TEMPLATE"])
pve = ProxmoxAPI(host, port=int(port), user=os.environ["PVE_USER"], token_name=os.environ["PVE_TOKEN"],
                 token_value=os.environ["PVE_SECRET"], verify_ssl=False, service="PVE")

def wait(upid):
    for _ in range(50):
        st = pve.nodes(node).tasks(upid).status.get()
        if st["status"] == "stopped":
            assert st["exitstatus"] == "OK", st
            return
        time.sleep(0.1)
    sys.exit("task %s did not finish" % upid)

assert pve.version.get()["release"], "version"
nodes = sorted(n["node"] for n in pve.nodes.get())
assert node in nodes, nodes
assert pve.nodes(node).status.get()["pveversion"].startswith("pve-manager/")
vms = pve.nodes(node).qemu.get()
assert [v for v in vms if v["vmid"] == template and v.get("template") == 1], vms

newid = int(pve.cluster.nextid.get())
wait(pve.nodes(node).qemu(template).clone.post(newid=newid, name="bc-proxmoxer", full=1, storage="local-lvm"))
keys = urllib.parse.quote("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample op@example", safe="")
pve.nodes(node).qemu(newid).config.put(ciuser="bc", sshkeys=keys, ipconfig0="ip=dhcp", tags="bc;test")
cfg = pve.nodes(node).qemu(newid).config.get()
assert cfg["name"] == "bc-proxmoxer" and cfg["ciuser"] == "bc" and cfg["ipconfig0"] == "ip=dhcp", cfg
assert cfg["sshkeys"] == keys and "template" not in cfg, cfg
assert cfg["scsi0"].startswith("local-lvm:vm-%d-disk-0" % newid), cfg

try:
    pve.nodes(node).qemu(newid).config.put(sshkeys="ssh-ed25519 not encoded")
    sys.exit("an unencoded sshkeys was accepted")
except ResourceException as e:
    # proxmoxer 1.2 reads "errors" from inside "data", which PVE sends null.
    assert e.status_code == 400 and "Parameter verification failed" in str(e), e

wait(pve.nodes(node).qemu(newid).status.start.post())
assert pve.nodes(node).qemu(newid).status.current.get()["status"] == "running"
wait(pve.nodes(node).qemu(newid).status.stop.post())
wait(pve.nodes(node).qemu(newid).delete())
try:
    pve.nodes(node).qemu(newid).config.get()
    sys.exit("the deleted VM is still there")
except ResourceException as e:
    assert e.status_code == 500 and "does not exist" in str(e), e
print("proxmoxer: ok")
`
