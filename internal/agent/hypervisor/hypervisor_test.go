package hypervisor_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent/hypervisor"
	"github.com/better-compute/better-compute/internal/agent/runtime"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// fakeRuntime keeps instances in memory and volumes and snapshots as
// files, and records calls; startErr makes Start fail.
type fakeRuntime struct {
	mu        sync.Mutex
	instances map[string]*runtime.Info
	// disks are the root disks' contents: a fresh overlay names its base,
	// one made from a FromDisk holds that file's bytes.
	disks     map[string]string
	calls     []string
	startErr  error
	hugePages bool
	// holdDetach: running guests never release a detached volume.
	holdDetach bool
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{instances: map[string]*runtime.Info{}, disks: map[string]string{}}
}

func (f *fakeRuntime) disk(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.disks[id]
}

func (f *fakeRuntime) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

func (f *fakeRuntime) count(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == prefix {
			n++
		}
	}
	return n
}

func (f *fakeRuntime) Create(_ context.Context, spec runtime.Spec) error {
	f.record("create")
	if err := spec.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.instances[spec.ID]; ok {
		return runtime.ErrExists
	}
	disk := "overlay on " + spec.Image.Disk
	if spec.FromDisk != "" {
		b, err := os.ReadFile(spec.FromDisk)
		if err != nil {
			return err
		}
		disk = string(b)
	}
	// The stored spec is what the real runtime reads back: JSON, without
	// the create-only FromDisk.
	spec.FromDisk = ""
	b, _ := json.Marshal(spec)
	var stored runtime.Spec
	_ = json.Unmarshal(b, &stored)
	f.instances[spec.ID] = &runtime.Info{ID: spec.ID, State: runtime.StateCreated, Spec: stored}
	f.disks[spec.ID] = disk
	return nil
}

func (f *fakeRuntime) set(id string, from []runtime.State, to runtime.State) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.instances[id]
	if !ok {
		return fmt.Errorf("%w: %q", runtime.ErrNotFound, id)
	}
	if from != nil && !slices.Contains(from, in.State) {
		return fmt.Errorf("%w: %q", runtime.ErrNotRunning, id)
	}
	in.State = to
	if to == runtime.StateRunning || to == runtime.StatePaused {
		in.Accel, in.PID = "tcg", 4242
	}
	return nil
}

func (f *fakeRuntime) Start(_ context.Context, id string) error {
	f.record("start")
	if f.startErr != nil {
		return f.startErr
	}
	return f.set(id, nil, runtime.StateRunning)
}

func (f *fakeRuntime) Stop(_ context.Context, id string) error {
	f.record("stop")
	return f.set(id, nil, runtime.StateStopped)
}

func (f *fakeRuntime) Pause(_ context.Context, id string) error {
	f.record("pause")
	return f.set(id, []runtime.State{runtime.StateRunning, runtime.StatePaused}, runtime.StatePaused)
}

func (f *fakeRuntime) Resume(_ context.Context, id string) error {
	f.record("resume")
	return f.set(id, []runtime.State{runtime.StateRunning, runtime.StatePaused}, runtime.StateRunning)
}

func (f *fakeRuntime) Reboot(_ context.Context, id string) error {
	f.record("reboot")
	return f.set(id, []runtime.State{runtime.StateRunning}, runtime.StateRunning)
}

func (f *fakeRuntime) Delete(_ context.Context, id string) error {
	f.record("delete")
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.instances[id]; !ok {
		return fmt.Errorf("%w: %q", runtime.ErrNotFound, id)
	}
	delete(f.instances, id)
	delete(f.disks, id)
	return nil
}

func (f *fakeRuntime) Snapshot(_ context.Context, id, dir string) error {
	f.record("snapshot")
	if err := f.set(id, []runtime.State{runtime.StateRunning, runtime.StatePaused}, runtime.StateRunning); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	// What the real runtime writes: the disk's copy and the spec.
	f.mu.Lock()
	spec, disk := f.instances[id].Spec, f.disks[id]
	f.mu.Unlock()
	if err := os.WriteFile(filepath.Join(dir, "disk.qcow2"), []byte(disk), 0o600); err != nil {
		return err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "spec.json"), b, 0o600)
}

func (f *fakeRuntime) Restore(_ context.Context, id, _ string) error {
	f.record("restore")
	return f.set(id, nil, runtime.StateRunning)
}

func (f *fakeRuntime) Get(_ context.Context, id string) (runtime.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.instances[id]
	if !ok {
		return runtime.Info{}, fmt.Errorf("%w: %q", runtime.ErrNotFound, id)
	}
	return *in, nil
}

func (f *fakeRuntime) List(ctx context.Context) []runtime.Info {
	f.mu.Lock()
	ids := make([]string, 0, len(f.instances))
	for id := range f.instances {
		ids = append(ids, id)
	}
	f.mu.Unlock()
	slices.Sort(ids)
	var out []runtime.Info
	for _, id := range ids {
		in, _ := f.Get(ctx, id)
		out = append(out, in)
	}
	return out
}

func (f *fakeRuntime) Adopt(ctx context.Context) ([]runtime.Info, error) {
	f.record("adopt")
	return f.List(ctx), nil
}

func (f *fakeRuntime) CreateVolume(_ context.Context, path, format string, sizeMiB int) error {
	f.record("create-volume")
	if _, err := os.Stat(path); err == nil {
		return &runtime.SpecError{Field: "path", Reason: "exists"}
	}
	return os.WriteFile(path, []byte(fmt.Sprintf("%s %d", format, sizeMiB)), 0o600)
}

func (f *fakeRuntime) DeleteVolume(_ context.Context, path string) error {
	f.record("delete-volume")
	return os.Remove(path)
}

// AttachVolume adds the volume to the spec, as the real runtime does
// after hot-plugging it into a running guest.
func (f *fakeRuntime) AttachVolume(_ context.Context, id string, v runtime.Volume) error {
	f.record("attach-volume")
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.instances[id]
	if !ok {
		return fmt.Errorf("%w: %q", runtime.ErrNotFound, id)
	}
	next := in.Spec
	next.Volumes = append(slices.Clone(in.Spec.Volumes), v)
	if err := next.Validate(); err != nil {
		return err
	}
	in.Spec = next
	return nil
}

// DetachVolume removes the volume from the spec; with holdDetach set a
// running guest never releases the device, so the wait ends with ctx.
func (f *fakeRuntime) DetachVolume(ctx context.Context, id, volumeID string) error {
	f.record("detach-volume")
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.instances[id]
	if !ok {
		return fmt.Errorf("%w: %q", runtime.ErrNotFound, id)
	}
	i := slices.IndexFunc(in.Spec.Volumes, func(v runtime.Volume) bool { return v.ID == volumeID })
	if i < 0 {
		return &runtime.SpecError{Field: "volume_id", Reason: "not attached"}
	}
	if f.holdDetach && in.State == runtime.StateRunning {
		f.mu.Unlock()
		<-ctx.Done()
		f.mu.Lock()
		return fmt.Errorf("guest did not release the device: %w", ctx.Err())
	}
	in.Spec.Volumes = slices.Delete(slices.Clone(in.Spec.Volumes), i, i+1)
	return nil
}

func (f *fakeRuntime) Capabilities(context.Context) runtime.Capabilities {
	return runtime.Capabilities{Accel: "tcg", AccelReason: "fake", HugePages: f.hugePages, HugePagesReason: "fake"}
}

// fakePolicy records the rules applied, by tap.
type fakePolicy struct {
	mu    sync.Mutex
	rules map[string]vmcmd.Rule
}

func (p *fakePolicy) Supported(context.Context) bool { return true }

func (p *fakePolicy) Apply(_ context.Context, r vmcmd.Rule) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules[r.Tap] = r
	return nil
}

func (p *fakePolicy) Remove(_ context.Context, tap string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.rules, tap)
	return nil
}

func (p *fakePolicy) get(tap string) (vmcmd.Rule, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.rules[tap]
	return r, ok
}

type rig struct {
	hv     *hypervisor.Hypervisor
	rt     *fakeRuntime
	pol    *fakePolicy
	state  string
	images string
	sysfs  string
	digest string
}

// newRig is a hypervisor over the fake runtime, a guest image "debian-12"
// (files as make guest-image writes them) and a sysfs with CPUs 0-3 and
// NUMA node 0.
func newRig(t *testing.T, withPolicy bool) *rig {
	t.Helper()
	dir := t.TempDir()
	r := &rig{rt: newFakeRuntime(), state: filepath.Join(dir, "state"), images: filepath.Join(dir, "images"), sysfs: filepath.Join(dir, "sysfs")}
	img := filepath.Join(r.images, "debian-12")
	require.NoError(t, os.MkdirAll(img, 0o755))
	disk := []byte("qcow2 bytes")
	sum := sha256.Sum256(disk)
	r.digest = hex.EncodeToString(sum[:])
	for name, body := range map[string]string{"rootfs.qcow2": string(disk), "vmlinuz": "kernel", "initrd.img": "initrd",
		"cmdline": "root=/dev/vda rw console=ttyS0\n", "SHA256SUMS": r.digest + "  rootfs.qcow2\n"} {
		require.NoError(t, os.WriteFile(filepath.Join(img, name), []byte(body), 0o644))
	}
	for _, d := range []string{"sys/devices/system/cpu/cpu0", "sys/devices/system/cpu/cpu1", "sys/devices/system/cpu/cpu2",
		"sys/devices/system/cpu/cpu3", "sys/devices/system/node/node0"} {
		require.NoError(t, os.MkdirAll(filepath.Join(r.sysfs, d), 0o755))
	}
	if withPolicy {
		r.pol = &fakePolicy{rules: map[string]vmcmd.Rule{}}
	}
	r.hv = r.start(t)
	return r
}

// start is a new Hypervisor on the rig's state and runtime: a bcd
// (re)start.
func (r *rig) start(t *testing.T) *hypervisor.Hypervisor {
	t.Helper()
	cfg := hypervisor.Config{StateDir: r.state, Images: r.images, SysfsRoot: r.sysfs, Runtime: r.rt, BridgeAddress: "10.77.0.1/24",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if r.pol != nil {
		cfg.NetPolicy = r.pol
	}
	hv, err := hypervisor.New(cfg)
	require.NoError(t, err)
	// Every guest's sshd answers at once (TestWarmGuestBootsBeforePause
	// sets its own).
	hv.SetDial(func(context.Context, string) (net.Conn, error) { return bannerConn(), nil })
	require.NoError(t, hv.Start(context.Background()))
	return hv
}

// bannerConn is a connection whose far end greets as sshd does.
func bannerConn() net.Conn {
	c, s := net.Pipe()
	go func() {
		_, _ = s.Write([]byte("SSH-2.0-OpenSSH_9.2 rig\r\n"))
		_ = s.Close()
	}()
	return c
}

// TestWarmGuestBootsBeforePause: a create asking for a paused guest (a
// warm sandbox) lets it run until its sshd answers, and only then pauses
// it, so a claim resumes a booted guest.
func TestWarmGuestBootsBeforePause(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	var (
		mu     sync.Mutex
		states []runtime.State
		addrs  []string
	)
	r.hv.SetDial(func(ctx context.Context, addr string) (net.Conn, error) {
		info, err := r.rt.Get(ctx, "web-1")
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		states = append(states, info.State)
		addrs = append(addrs, addr)
		if len(states) < 3 { // still booting: nothing listens yet
			return nil, errors.New("connect: connection refused")
		}
		return bannerConn(), nil
	})
	p := createParams("web-1")
	p.Paused = true
	require.Equal(t, "paused", r.must(t, vmcmd.KindInstanceCreate, p)["state"])
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []runtime.State{runtime.StateRunning, runtime.StateRunning, runtime.StateRunning}, states,
		"the guest runs while it boots, and is asked until its sshd answers")
	require.Equal(t, strings.Split(p.Network.Address, "/")[0]+":22", addrs[0])
	require.Equal(t, runtime.StatePaused, r.rt.instances["web-1"].State)
}

func createParams(id string) vmcmd.CreateParams {
	return vmcmd.CreateParams{
		InstanceID: id, VCPUs: 2, MemoryMiB: 512, DiskMiB: 2048,
		Image: vmcmd.Image{Name: "debian-12"},
		Network: vmcmd.Network{MAC: "52:54:00:77:00:05", Address: "10.77.0.5/24", Gateway: "10.77.0.1",
			DNS: []string{"10.77.0.1"}, Policy: vmcmd.PolicyEgress},
		Seed: vmcmd.Seed{Hostname: "web-1", User: "bc", AuthorizedKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOQ test"}},
	}
}

func (r *rig) apply(t *testing.T, kind string, params any) (map[string]any, error) {
	t.Helper()
	b, err := json.Marshal(params)
	require.NoError(t, err)
	res, err := r.hv.Apply(context.Background(), kind, b)
	if err != nil {
		return nil, err
	}
	out, err := json.Marshal(res)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(out, &m))
	return m, nil
}

func (r *rig) must(t *testing.T, kind string, params any) map[string]any {
	t.Helper()
	m, err := r.apply(t, kind, params)
	require.NoError(t, err)
	return m
}

func requireCode(t *testing.T, err error, code, contains string) {
	t.Helper()
	require.Error(t, err)
	var he *hypervisor.Error
	require.True(t, errors.As(err, &he), "error %v has no failure code", err)
	require.Equal(t, code, he.FailureCode(), err.Error())
	require.Contains(t, err.Error(), contains)
}

// requireNothing: no instance, no volume, no metadata, no snapshot left.
func (r *rig) requireNothing(t *testing.T) {
	t.Helper()
	require.Empty(t, r.rt.List(context.Background()))
	for _, d := range []string{"volumes", "meta", "snapshots"} {
		entries, err := os.ReadDir(filepath.Join(r.state, d))
		require.NoError(t, err)
		require.Empty(t, entries, d)
	}
	if r.pol != nil {
		require.Empty(t, r.pol.rules)
	}
}

func TestCreateRefusesBadParamsNamingTheField(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	cases := []struct {
		field  string
		code   string
		mutate func(p *vmcmd.CreateParams)
	}{
		{"instance_id", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.InstanceID = "Web/1" }},
		{"vcpus", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.VCPUs = 0 }},
		{"memory_mib", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.MemoryMiB = 8 }},
		{"disk_mib", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.DiskMiB = -1 }},
		{"image.name", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.Image.Name = "../etc" }},
		{"image.sha256", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.Image.Sha256 = "abc" }},
		{"network.mac", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.Network.MAC = "01:00:5e:00:00:01" }},
		{"network.address", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.Network.Address = "10.77.0.5" }},
		{"network.gateway", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.Network.Gateway = "10.78.0.1" }},
		{"network.dns[0]", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.Network.DNS = []string{"dns.example"} }},
		{"network.policy", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.Network.Policy = "open" }},
		{"network.peers[0]", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.Network.Peers = []string{"x"} }},
		{"volumes[0].format", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) {
			p.Volumes = []vmcmd.VolumeRef{{VolumeID: "data", Format: "vmdk", SizeMiB: 10}}
		}},
		{"volumes[1].volume_id", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) {
			p.Volumes = []vmcmd.VolumeRef{{VolumeID: "data", Format: "raw", SizeMiB: 10}, {VolumeID: "data", Format: "raw", SizeMiB: 10}}
		}},
		{"placement.host_cpus[0]", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.Placement.HostCPUs = []int{-1} }},
		{"seed.user", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.Seed.User = "root" }},
		{"seed.hostname", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.Seed.Hostname = "Web_1" }},
		{"seed.authorized_keys", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) { p.Seed.AuthorizedKeys = nil }},
		// A CA trusted for any principal would admit every guest's
		// certificates (the seed of a control plane from before principals).
		{"seed.authorized_principals", vmcmd.FailInvalid, func(p *vmcmd.CreateParams) {
			p.Seed.TrustedUserCAKeys = []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOQ ca"}
		}},
		{"placement.gpu_uuids", vmcmd.FailUnsupported, func(p *vmcmd.CreateParams) { p.Placement.GPUUUIDs = []string{"GPU-1"} }},
		{"network.policy", vmcmd.FailUnsupported, func(p *vmcmd.CreateParams) { p.Network.Policy = vmcmd.PolicyPrivate }},
	}
	for _, c := range cases {
		p := createParams("web-1")
		c.mutate(&p)
		_, err := r.apply(t, vmcmd.KindInstanceCreate, p)
		requireCode(t, err, c.code, c.field+":")
	}
	// Unknown fields (a newer control plane's ask) are refused, not
	// half-applied.
	_, err := r.hv.Apply(context.Background(), vmcmd.KindInstanceCreate, []byte(`{"instance_id":"web-1","gpus":2}`))
	requireCode(t, err, vmcmd.FailInvalid, `unknown field "gpus"`)
	_, err = r.apply(t, vmcmd.KindInstanceStop, vmcmd.InstanceRef{InstanceID: ""})
	requireCode(t, err, vmcmd.FailInvalid, "instance_id:")
	_, err = r.apply(t, vmcmd.KindInstanceSnapshot, vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "S"})
	requireCode(t, err, vmcmd.FailInvalid, "snapshot_id:")
	_, err = r.apply(t, vmcmd.KindVolumeCreate, vmcmd.VolumeParams{VolumeID: "v", Format: "raw"})
	requireCode(t, err, vmcmd.FailInvalid, "size_mib:")
	require.Zero(t, r.rt.count("create"))
	r.requireNothing(t)
}

func TestCreateImage(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	p := createParams("web-1")
	p.Image.Name = "ubuntu-24"
	_, err := r.apply(t, vmcmd.KindInstanceCreate, p)
	requireCode(t, err, vmcmd.FailImage, `guest image "ubuntu-24" is not on this host`)

	p.Image = vmcmd.Image{Name: "debian-12", Sha256: hex.EncodeToString(make([]byte, 32))}
	_, err = r.apply(t, vmcmd.KindInstanceCreate, p)
	requireCode(t, err, vmcmd.FailImage, "not sha256:0000")

	// SHA256SUMS agrees with the ask, the disk does not: corrupt.
	img := filepath.Join(r.images, "debian-12")
	require.NoError(t, os.WriteFile(filepath.Join(img, "SHA256SUMS"), []byte(hex.EncodeToString(make([]byte, 32))+"  rootfs.qcow2\n"), 0o644))
	_, err = r.apply(t, vmcmd.KindInstanceCreate, p)
	requireCode(t, err, vmcmd.FailImage, "corrupt or replaced")
	require.Zero(t, r.rt.count("create"))
	r.requireNothing(t)

	require.NoError(t, os.WriteFile(filepath.Join(img, "SHA256SUMS"), []byte(r.digest+"  rootfs.qcow2\n"), 0o644))
	p.Image.Sha256 = r.digest
	st := r.must(t, vmcmd.KindInstanceCreate, p)
	require.Equal(t, vmcmd.StateRunning, st["state"])
	info, err := r.rt.Get(context.Background(), "web-1")
	require.NoError(t, err)
	require.Equal(t, filepath.Join(img, "rootfs.qcow2"), info.Spec.Image.Disk)
	require.Equal(t, filepath.Join(img, "vmlinuz"), info.Spec.Image.Kernel)
	require.Equal(t, filepath.Join(img, "initrd.img"), info.Spec.Image.Initrd)
	require.Equal(t, "root=/dev/vda rw console=ttyS0", info.Spec.Image.Cmdline)
}

func TestCreateIsIdempotentAndRefusesAnotherSpec(t *testing.T) {
	t.Parallel()
	r := newRig(t, true)
	p := createParams("web-1")
	p.Volumes = []vmcmd.VolumeRef{{VolumeID: "data", Format: "qcow2", SizeMiB: 64}}
	p.Network.Policy = vmcmd.PolicyPrivate
	p.Network.Peers = []string{"10.77.0.6"}
	st := r.must(t, vmcmd.KindInstanceCreate, p)
	require.Equal(t, map[string]any{"instance_id": "web-1", "state": "running", "accel": "tcg", "tap": st["tap"],
		"ssh_address": "10.77.0.5:22"}, st)
	tap := st["tap"].(string)
	require.Regexp(t, `^bct[0-9a-f]{12}$`, tap)
	info, err := r.rt.Get(context.Background(), "web-1")
	require.NoError(t, err)
	require.Equal(t, &runtime.Network{Bridge: "bcbr0", BridgeAddress: "10.77.0.1/24"}, info.Spec.Network)
	require.Equal(t, "10.77.0.5/24", info.Spec.Seed.Address)
	require.Equal(t, "10.77.0.1", info.Spec.Seed.Gateway)
	require.Equal(t, []string{"10.77.0.1"}, info.Spec.Seed.DNS)
	require.Equal(t, filepath.Join(r.state, "volumes", "data.qcow2"), info.Spec.Volumes[0].Path)
	require.FileExists(t, filepath.Join(r.state, "volumes", "data.qcow2"))
	rule, ok := r.pol.get(tap)
	require.True(t, ok)
	require.Equal(t, vmcmd.Rule{Bridge: "bcbr0", Tap: tap, MAC: p.Network.MAC, Address: "10.77.0.5", Gateway: "10.77.0.1",
		Policy: vmcmd.PolicyPrivate, Peers: []string{"10.77.0.6"}}, rule)

	// Redelivered, with another peer: the same instance, the rule updated.
	p.Network.Peers = []string{"10.77.0.6", "10.77.0.7"}
	again := r.must(t, vmcmd.KindInstanceCreate, p)
	require.Equal(t, st, again)
	require.Equal(t, 1, r.rt.count("create"))
	require.Equal(t, 1, r.rt.count("start"))
	rule, _ = r.pol.get(tap)
	require.Equal(t, []string{"10.77.0.6", "10.77.0.7"}, rule.Peers)

	// A different spec for the same id: refused, the instance untouched.
	p.MemoryMiB = 1024
	_, err = r.apply(t, vmcmd.KindInstanceCreate, p)
	requireCode(t, err, vmcmd.FailExists, `"web-1" exists on this host with a different spec`)
	info, err = r.rt.Get(context.Background(), "web-1")
	require.NoError(t, err)
	require.Equal(t, 512, info.Spec.MemoryMiB)

	// A user stop is not undone by a redelivered create.
	p.MemoryMiB = 512
	require.Equal(t, "stopped", r.must(t, vmcmd.KindInstanceStop, vmcmd.InstanceRef{InstanceID: "web-1"})["state"])
	require.Equal(t, "stopped", r.must(t, vmcmd.KindInstanceCreate, p)["state"])

	// The attached volume cannot go; after the instance it can.
	_, err = r.apply(t, vmcmd.KindVolumeDelete, vmcmd.VolumeParams{VolumeID: "data"})
	requireCode(t, err, vmcmd.FailBusy, `attached to instance "web-1"`)
	require.Equal(t, "deleted", r.must(t, vmcmd.KindInstanceDelete, vmcmd.InstanceRef{InstanceID: "web-1"})["state"])
	r.must(t, vmcmd.KindVolumeDelete, vmcmd.VolumeParams{VolumeID: "data"})
	r.must(t, vmcmd.KindVolumeDelete, vmcmd.VolumeParams{VolumeID: "data"})
	r.requireNothing(t)
}

func TestCreateThatFailsLeavesNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, true)
	r.rt.startErr = errors.New("qemu: could not open /dev/kvm")
	p := createParams("web-1")
	p.Volumes = []vmcmd.VolumeRef{{VolumeID: "data", Format: "raw", SizeMiB: 8}}
	_, err := r.apply(t, vmcmd.KindInstanceCreate, p)
	requireCode(t, err, vmcmd.FailRuntime, "could not open /dev/kvm")
	r.requireNothing(t)

	// A volume that existed before the create is not the create's to
	// remove.
	r.must(t, vmcmd.KindVolumeCreate, vmcmd.VolumeParams{VolumeID: "data", Format: "raw", SizeMiB: 8})
	_, err = r.apply(t, vmcmd.KindInstanceCreate, p)
	requireCode(t, err, vmcmd.FailRuntime, "could not open /dev/kvm")
	require.FileExists(t, filepath.Join(r.state, "volumes", "data.raw"))
	_, err = r.apply(t, vmcmd.KindVolumeCreate, vmcmd.VolumeParams{VolumeID: "data", Format: "qcow2", SizeMiB: 8})
	requireCode(t, err, vmcmd.FailExists, "exists on this host as raw")

	r.rt.startErr = nil
	require.Equal(t, "running", r.must(t, vmcmd.KindInstanceCreate, p)["state"])
}

func TestDeleteIsIdempotentAndLeavesNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, true)
	p := createParams("web-1")
	r.must(t, vmcmd.KindInstanceCreate, p)
	r.must(t, vmcmd.KindInstanceSnapshot, vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "s1"})
	require.DirExists(t, filepath.Join(r.state, "snapshots", "web-1", "s1"))
	for range 2 {
		require.Equal(t, map[string]any{"instance_id": "web-1", "state": "deleted"},
			r.must(t, vmcmd.KindInstanceDelete, vmcmd.InstanceRef{InstanceID: "web-1"}))
	}
	r.requireNothing(t)
	// Other commands for a gone instance: not found.
	for _, kind := range []string{vmcmd.KindInstanceStart, vmcmd.KindInstanceStop, vmcmd.KindInstanceReboot} {
		_, err := r.apply(t, kind, vmcmd.InstanceRef{InstanceID: "web-1"})
		requireCode(t, err, vmcmd.FailNotFound, "no such instance")
	}
	_, err := r.apply(t, vmcmd.KindInstanceRestore, vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "s1"})
	requireCode(t, err, vmcmd.FailNotFound, "no such instance")
}

func TestPowerSnapshotAndList(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	p := createParams("web-1")
	p.Paused = true
	require.Equal(t, "paused", r.must(t, vmcmd.KindInstanceCreate, p)["state"])
	ref := vmcmd.InstanceRef{InstanceID: "web-1"}
	require.Equal(t, "running", r.must(t, vmcmd.KindInstanceResume, ref)["state"])
	require.Equal(t, "running", r.must(t, vmcmd.KindInstanceResume, ref)["state"], "resume converges")
	require.Equal(t, "paused", r.must(t, vmcmd.KindInstancePause, ref)["state"])
	require.Equal(t, "running", r.must(t, vmcmd.KindInstanceStart, ref)["state"], "start of a paused guest resumes it")
	require.Equal(t, "running", r.must(t, vmcmd.KindInstanceReboot, ref)["state"])
	require.Equal(t, "stopped", r.must(t, vmcmd.KindInstanceStop, ref)["state"])
	_, err := r.apply(t, vmcmd.KindInstanceReboot, ref)
	requireCode(t, err, vmcmd.FailBusy, "not running")
	_, err = r.apply(t, vmcmd.KindInstanceSnapshot, vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "s1"})
	requireCode(t, err, vmcmd.FailBusy, "not running")
	require.NoDirExists(t, filepath.Join(r.state, "snapshots", "web-1", "s1"))
	require.Equal(t, "running", r.must(t, vmcmd.KindInstanceStart, ref)["state"])

	snap := vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "s1"}
	before := r.rt.count("snapshot")
	r.must(t, vmcmd.KindInstanceSnapshot, snap)
	r.must(t, vmcmd.KindInstanceSnapshot, snap)
	require.Equal(t, before+1, r.rt.count("snapshot"), "a redelivered snapshot is not taken twice")
	r.must(t, vmcmd.KindInstanceRestore, snap)
	_, err = r.apply(t, vmcmd.KindInstanceRestore, vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "s2"})
	requireCode(t, err, vmcmd.FailNotFound, `no snapshot "s2"`)

	q := createParams("web-2")
	q.Network.MAC, q.Network.Address = "52:54:00:77:00:06", "10.77.0.6/24"
	r.must(t, vmcmd.KindInstanceCreate, q)
	list := r.must(t, vmcmd.KindInstanceList, struct{}{})["instances"].([]any)
	require.Len(t, list, 2)
	require.Equal(t, "web-1", list[0].(map[string]any)["instance_id"])
	require.Equal(t, "10.77.0.6:22", list[1].(map[string]any)["ssh_address"])
}

func TestPlacementDegradedWhereTheHostCannot(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	require.NotContains(t, r.hv.Capabilities(), vmcmd.CapPlacement, "no hugepages: placement is not fully enforced")
	p := createParams("web-1")
	node := 0
	p.Placement = vmcmd.Placement{HostCPUs: []int{2, 3}, NUMANode: &node, HugePages: true}
	st := r.must(t, vmcmd.KindInstanceCreate, p)
	require.Equal(t, []any{"huge_pages"}, st["degraded"])
	info, err := r.rt.Get(context.Background(), "web-1")
	require.NoError(t, err)
	require.Equal(t, []int{2, 3}, info.Spec.HostCPUs)
	require.Equal(t, &node, info.Spec.NUMANode)
	require.False(t, info.Spec.HugePages)

	q := createParams("web-2")
	other := 3
	q.Placement = vmcmd.Placement{HostCPUs: []int{2, 64}, NUMANode: &other}
	st = r.must(t, vmcmd.KindInstanceCreate, q)
	require.Equal(t, []any{"host_cpus", "numa_node"}, st["degraded"])
	info, err = r.rt.Get(context.Background(), "web-2")
	require.NoError(t, err)
	require.Empty(t, info.Spec.HostCPUs)
	require.Nil(t, info.Spec.NUMANode)
	// The list says so too (the degraded asks outlive the command).
	list := r.must(t, vmcmd.KindInstanceList, struct{}{})["instances"].([]any)
	require.Equal(t, []any{"host_cpus", "numa_node"}, list[1].(map[string]any)["degraded"])

	// With hugepages, the same ask is applied in full and placement is
	// advertised.
	r.rt.hugePages = true
	hv := r.start(t)
	require.Contains(t, hv.Capabilities(), vmcmd.CapPlacement)
}

func TestRestartAdoptsInstances(t *testing.T) {
	t.Parallel()
	r := newRig(t, true)
	r.must(t, vmcmd.KindInstanceCreate, createParams("web-1"))
	require.ElementsMatch(t, []string{vmcmd.CapInstances, vmcmd.CapVolumes, vmcmd.CapSnapshot, vmcmd.CapNetworkPolicy}, r.hv.Capabilities())

	// bcd restarts: a new hypervisor adopts what the runtime has, and
	// a redelivered create is the same instance.
	r.hv = r.start(t)
	require.Equal(t, 2, r.rt.count("adopt"))
	list := r.must(t, vmcmd.KindInstanceList, struct{}{})["instances"].([]any)
	require.Len(t, list, 1)
	require.Equal(t, "running", list[0].(map[string]any)["state"])
	require.Equal(t, "running", r.must(t, vmcmd.KindInstanceCreate, createParams("web-1"))["state"])
	require.Equal(t, 1, r.rt.count("create"))

	// Metadata whose instance is gone (a delete that died half-way) is
	// dropped at start.
	require.NoError(t, os.WriteFile(filepath.Join(r.state, "meta", "gone-1.json"), []byte(`{}`), 0o600))
	r.hv = r.start(t)
	require.NoFileExists(t, filepath.Join(r.state, "meta", "gone-1.json"))
	require.FileExists(t, filepath.Join(r.state, "meta", "web-1.json"))
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct {
		cfg  hypervisor.Config
		want string
	}{
		{hypervisor.Config{StateDir: "rel", Images: dir}, "state dir must be an absolute path"},
		{hypervisor.Config{StateDir: dir}, "guest image directory must be an absolute path"},
		{hypervisor.Config{StateDir: dir, Images: dir, Bridge: "a-very-long-bridge-name"}, "is not an interface name"},
		{hypervisor.Config{StateDir: dir, Images: dir, BridgeAddress: "10.0.0.1"}, "is not an IPv4 address/prefix"},
	} {
		_, err := hypervisor.New(c.cfg)
		require.ErrorContains(t, err, c.want)
	}
}

// TestPeersReappliesThePolicy: instance.peers replaces a private guest's
// peer list in its network policy rule (the rest of the rule as create
// made it, the guest untouched); an egress guest and bad params are
// answered without a rule change, a missing instance is not found.
func TestPeersReappliesThePolicy(t *testing.T) {
	t.Parallel()
	r := newRig(t, true)
	p := createParams("web-1")
	p.Network.Policy = vmcmd.PolicyPrivate
	p.Network.Peers = []string{"10.77.0.6"}
	tap := r.must(t, vmcmd.KindInstanceCreate, p)["tap"].(string)

	st := r.must(t, vmcmd.KindInstancePeers, vmcmd.PeersParams{InstanceID: "web-1", Peers: []string{"10.77.0.6", "10.77.0.7"}})
	require.Equal(t, "running", st["state"])
	rule, ok := r.pol.get(tap)
	require.True(t, ok)
	require.Equal(t, vmcmd.Rule{Bridge: "bcbr0", Tap: tap, MAC: p.Network.MAC, Address: "10.77.0.5", Gateway: "10.77.0.1",
		Policy: vmcmd.PolicyPrivate, Peers: []string{"10.77.0.6", "10.77.0.7"}}, rule)
	// A peer went: the list shrinks (it replaces, it does not add).
	r.must(t, vmcmd.KindInstancePeers, vmcmd.PeersParams{InstanceID: "web-1", Peers: []string{"10.77.0.7"}})
	rule, _ = r.pol.get(tap)
	require.Equal(t, []string{"10.77.0.7"}, rule.Peers)
	r.must(t, vmcmd.KindInstancePeers, vmcmd.PeersParams{InstanceID: "web-1"})
	rule, _ = r.pol.get(tap)
	require.Empty(t, rule.Peers)
	require.Equal(t, 1, r.rt.count("create"), "the guest is not recreated")
	require.Equal(t, 1, r.rt.count("start"))

	_, err := r.apply(t, vmcmd.KindInstancePeers, vmcmd.PeersParams{InstanceID: "web-1", Peers: []string{"not-an-ip"}})
	requireCode(t, err, vmcmd.FailInvalid, "peers[0]")
	rule, _ = r.pol.get(tap)
	require.Empty(t, rule.Peers, "a refused list changes nothing")
	_, err = r.apply(t, vmcmd.KindInstancePeers, vmcmd.PeersParams{InstanceID: "web-2", Peers: []string{"10.77.0.6"}})
	requireCode(t, err, vmcmd.FailNotFound, "web-2")

	// An egress guest admits by no peer list: its rule stays as created.
	e := createParams("web-3")
	e.Network.MAC, e.Network.Address = "52:54:00:77:00:08", "10.77.0.8/24"
	etap := r.must(t, vmcmd.KindInstanceCreate, e)["tap"].(string)
	before, ok := r.pol.get(etap)
	require.True(t, ok)
	r.must(t, vmcmd.KindInstancePeers, vmcmd.PeersParams{InstanceID: "web-3", Peers: []string{"10.77.0.5"}})
	after, _ := r.pol.get(etap)
	require.Equal(t, before, after)
}

// TestVolumeAttachAndDetach: volume.attach plugs a host volume into a
// running or stopped guest and volume.detach takes it out; both are
// idempotent, and a volume another instance holds, one not on the host,
// an unknown instance and a guest that keeps the device are refused with
// their codes.
func TestVolumeAttachAndDetach(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	r.must(t, vmcmd.KindInstanceCreate, createParams("web-1"))
	q := createParams("web-2")
	q.Network.MAC, q.Network.Address = "52:54:00:77:00:06", "10.77.0.6/24"
	r.must(t, vmcmd.KindInstanceCreate, q)
	r.must(t, vmcmd.KindVolumeCreate, vmcmd.VolumeParams{VolumeID: "data", Format: "qcow2", SizeMiB: 64})
	att := vmcmd.AttachParams{InstanceID: "web-1", VolumeID: "data", Format: "qcow2"}
	vols := func(id string) []string {
		info, err := r.rt.Get(context.Background(), id)
		require.NoError(t, err)
		var out []string
		for _, v := range info.Spec.Volumes {
			out = append(out, v.ID)
		}
		return out
	}

	require.Equal(t, "running", r.must(t, vmcmd.KindVolumeAttach, att)["state"])
	require.Equal(t, []string{"data"}, vols("web-1"))
	r.must(t, vmcmd.KindVolumeAttach, att)
	require.Equal(t, 1, r.rt.count("attach-volume"), "attaching an attached volume changes nothing")

	_, err := r.apply(t, vmcmd.KindVolumeAttach, vmcmd.AttachParams{InstanceID: "web-2", VolumeID: "data", Format: "qcow2"})
	requireCode(t, err, vmcmd.FailBusy, `attached to instance "web-1"`)
	_, err = r.apply(t, vmcmd.KindVolumeDelete, vmcmd.VolumeParams{VolumeID: "data"})
	requireCode(t, err, vmcmd.FailBusy, "attached")
	_, err = r.apply(t, vmcmd.KindVolumeAttach, vmcmd.AttachParams{InstanceID: "web-2", VolumeID: "nope", Format: "raw"})
	requireCode(t, err, vmcmd.FailNotFound, "not on this host")
	_, err = r.apply(t, vmcmd.KindVolumeAttach, vmcmd.AttachParams{InstanceID: "gone", VolumeID: "data", Format: "qcow2"})
	requireCode(t, err, vmcmd.FailNotFound, "gone")
	_, err = r.apply(t, vmcmd.KindVolumeAttach, vmcmd.AttachParams{InstanceID: "web-1", VolumeID: "data"})
	requireCode(t, err, vmcmd.FailInvalid, "format")
	_, err = r.apply(t, vmcmd.KindVolumeDetach, vmcmd.AttachParams{InstanceID: "web-1", VolumeID: "Bad/Id"})
	requireCode(t, err, vmcmd.FailInvalid, "volume_id")

	det := vmcmd.AttachParams{InstanceID: "web-1", VolumeID: "data"}
	r.must(t, vmcmd.KindVolumeDetach, det)
	require.Empty(t, vols("web-1"))
	r.must(t, vmcmd.KindVolumeDetach, det)
	require.Equal(t, 1, r.rt.count("detach-volume"), "detaching a detached volume changes nothing")

	// A stopped guest gets it in its spec, for its next start.
	require.Equal(t, "stopped", r.must(t, vmcmd.KindInstanceStop, vmcmd.InstanceRef{InstanceID: "web-2"})["state"])
	att.InstanceID = "web-2"
	require.Equal(t, "stopped", r.must(t, vmcmd.KindVolumeAttach, att)["state"])
	require.Equal(t, []string{"data"}, vols("web-2"))
	require.Equal(t, "running", r.must(t, vmcmd.KindInstanceStart, vmcmd.InstanceRef{InstanceID: "web-2"})["state"])

	// A running guest that keeps the device: busy, and still attached.
	r.rt.mu.Lock()
	r.rt.holdDetach = true
	r.rt.mu.Unlock()
	hv, err := hypervisor.New(hypervisor.Config{StateDir: r.state, Images: r.images, SysfsRoot: r.sysfs, Runtime: r.rt,
		DetachWait: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, hv.Start(context.Background()))
	b, err := json.Marshal(vmcmd.AttachParams{InstanceID: "web-2", VolumeID: "data"})
	require.NoError(t, err)
	_, err = hv.Apply(context.Background(), vmcmd.KindVolumeDetach, b)
	requireCode(t, err, vmcmd.FailBusy, "did not release")
	require.Equal(t, []string{"data"}, vols("web-2"))
}

// TestCreateFromSnapshot: a create with from_snapshot seeds the new
// instance's disk with a kept snapshot's disk (its owner deleted) and
// boots it with its own spec; a redelivery converges even once the
// snapshot is gone; a missing snapshot, one of another image or with a
// larger disk, and bad ids are refused naming from_snapshot, before
// anything is made.
func TestCreateFromSnapshot(t *testing.T) {
	t.Parallel()
	r := newRig(t, true)
	ctx := context.Background()
	r.must(t, vmcmd.KindInstanceCreate, createParams("web-1"))
	r.rt.mu.Lock()
	r.rt.disks["web-1"] = "web-1's files"
	r.rt.mu.Unlock()
	r.must(t, vmcmd.KindInstanceSnapshot, vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "s1"})
	r.must(t, vmcmd.KindInstanceDelete, vmcmd.DeleteParams{InstanceID: "web-1", KeepSnapshots: []string{"s1"}})
	require.FileExists(t, filepath.Join(r.state, "snapshots", "web-1", "s1", "disk.qcow2"))

	p := createParams("web-2")
	p.Network.MAC, p.Network.Address, p.Seed.Hostname = "52:54:00:77:00:06", "10.77.0.6/24", "web-2"
	p.DiskMiB = 4096
	p.FromSnapshot = &vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "s1"}
	st := r.must(t, vmcmd.KindInstanceCreate, p)
	require.Equal(t, "running", st["state"])
	require.Equal(t, "10.77.0.6:22", st["ssh_address"])
	require.Equal(t, "web-1's files", r.rt.disk("web-2"), "the disk is the snapshot's")
	info, err := r.rt.Get(ctx, "web-2")
	require.NoError(t, err)
	require.Empty(t, info.Spec.FromDisk, "the stored spec does not name the source")
	require.Equal(t, "web-2", info.Spec.Seed.Hostname)
	require.Equal(t, "10.77.0.6/24", info.Spec.Seed.Address)
	require.Equal(t, 4096, info.Spec.DiskMiB)
	require.DirExists(t, filepath.Join(r.state, "snapshots", "web-1", "s1"), "the snapshot is not consumed")

	// Redelivered: the same instance, also after the snapshot went.
	require.Equal(t, st, r.must(t, vmcmd.KindInstanceCreate, p))
	r.must(t, vmcmd.KindSnapshotDelete, vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "s1"})
	require.Equal(t, st, r.must(t, vmcmd.KindInstanceCreate, p))
	require.Equal(t, 2, r.rt.count("create"), "web-1 and web-2 only")

	// Refusals leave nothing: no instance, metadata, volume or rule.
	r.must(t, vmcmd.KindInstanceSnapshot, vmcmd.SnapshotParams{InstanceID: "web-2", SnapshotID: "s2"})
	other := filepath.Join(r.images, "ubuntu-24")
	require.NoError(t, os.CopyFS(other, os.DirFS(filepath.Join(r.images, "debian-12"))))
	cases := []struct {
		code, contains string
		mutate         func(q *vmcmd.CreateParams)
	}{
		{vmcmd.FailNotFound, `instance "web-1" has no snapshot "s1" on this host`, func(q *vmcmd.CreateParams) {
			q.FromSnapshot = &vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "s1"}
		}},
		{vmcmd.FailNotFound, `instance "nope" has no snapshot "s2"`, func(q *vmcmd.CreateParams) {
			q.FromSnapshot = &vmcmd.SnapshotParams{InstanceID: "nope", SnapshotID: "s2"}
		}},
		{vmcmd.FailInvalid, "from_snapshot: snapshot \"s2\" of \"web-2\" is of the image disk", func(q *vmcmd.CreateParams) {
			q.Image.Name = "ubuntu-24"
		}},
		{vmcmd.FailInvalid, "from_snapshot: snapshot \"s2\" of \"web-2\" has a 4096 MiB disk, larger than disk_mib (2048)", func(q *vmcmd.CreateParams) {
			q.DiskMiB = 2048
		}},
		{vmcmd.FailInvalid, "from_snapshot.instance_id:", func(q *vmcmd.CreateParams) { q.FromSnapshot.InstanceID = "Web/2" }},
		{vmcmd.FailInvalid, "from_snapshot.snapshot_id:", func(q *vmcmd.CreateParams) { q.FromSnapshot.SnapshotID = "" }},
	}
	for _, c := range cases {
		q := createParams("web-3")
		q.Network.MAC, q.Network.Address, q.Seed.Hostname = "52:54:00:77:00:07", "10.77.0.7/24", "web-3"
		q.DiskMiB = 4096
		q.Volumes = []vmcmd.VolumeRef{{VolumeID: "data-3", Format: "raw", SizeMiB: 8}}
		q.FromSnapshot = &vmcmd.SnapshotParams{InstanceID: "web-2", SnapshotID: "s2"}
		c.mutate(&q)
		_, err := r.apply(t, vmcmd.KindInstanceCreate, q)
		requireCode(t, err, c.code, c.contains)
		_, err = r.rt.Get(ctx, "web-3")
		require.ErrorIs(t, err, runtime.ErrNotFound, c.contains)
		require.NoFileExists(t, filepath.Join(r.state, "meta", "web-3.json"))
		require.NoFileExists(t, filepath.Join(r.state, "volumes", "data-3.raw"))
		require.Len(t, r.pol.rules, 1, "only web-2's rule")
	}
	// A snapshot directory without its disk is the host's fault.
	require.NoError(t, os.Remove(filepath.Join(r.state, "snapshots", "web-2", "s2", "disk.qcow2")))
	q := createParams("web-3")
	q.Network.MAC, q.Network.Address = "52:54:00:77:00:07", "10.77.0.7/24"
	q.DiskMiB = 4096
	q.FromSnapshot = &vmcmd.SnapshotParams{InstanceID: "web-2", SnapshotID: "s2"}
	_, err = r.apply(t, vmcmd.KindInstanceCreate, q)
	requireCode(t, err, vmcmd.FailRuntime, "incomplete: no disk.qcow2")
	require.Equal(t, 2, r.rt.count("create"), "web-1 and web-2 only")

	r.must(t, vmcmd.KindInstanceDelete, vmcmd.DeleteParams{InstanceID: "web-2"})
	r.requireNothing(t)
}

// TestDeleteKeepsSnapshots: instance.delete with keep_snapshots leaves
// those snapshots (and only those) in the store; snapshot.delete removes
// one, with or without its instance, converges when repeated, and takes
// the instance's snapshot directory when it empties.
func TestDeleteKeepsSnapshots(t *testing.T) {
	t.Parallel()
	r := newRig(t, true)
	snaps := filepath.Join(r.state, "snapshots")
	r.must(t, vmcmd.KindInstanceCreate, createParams("web-1"))
	for _, s := range []string{"s1", "s2", "s3"} {
		r.must(t, vmcmd.KindInstanceSnapshot, vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: s})
	}
	_, err := r.apply(t, vmcmd.KindInstanceDelete, vmcmd.DeleteParams{InstanceID: "web-1", KeepSnapshots: []string{"s1", "S3"}})
	requireCode(t, err, vmcmd.FailInvalid, "keep_snapshots[1]:")
	_, err = r.rt.Get(context.Background(), "web-1")
	require.NoError(t, err, "a refused delete deletes nothing")

	del := vmcmd.DeleteParams{InstanceID: "web-1", KeepSnapshots: []string{"s1", "s3", "never-taken"}}
	for range 2 {
		require.Equal(t, map[string]any{"instance_id": "web-1", "state": "deleted"}, r.must(t, vmcmd.KindInstanceDelete, del))
	}
	entries, err := os.ReadDir(filepath.Join(snaps, "web-1"))
	require.NoError(t, err)
	var kept []string
	for _, e := range entries {
		kept = append(kept, e.Name())
	}
	require.Equal(t, []string{"s1", "s3"}, kept)
	_, err = r.rt.Get(context.Background(), "web-1")
	require.ErrorIs(t, err, runtime.ErrNotFound)
	require.NoFileExists(t, filepath.Join(r.state, "meta", "web-1.json"))
	require.Empty(t, r.pol.rules)

	_, err = r.apply(t, vmcmd.KindSnapshotDelete, vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "S1"})
	requireCode(t, err, vmcmd.FailInvalid, "snapshot_id:")
	_, err = r.hv.Apply(context.Background(), vmcmd.KindSnapshotDelete, []byte(`{"instance_id":"web-1","snapshot_id":"s1","all":true}`))
	requireCode(t, err, vmcmd.FailInvalid, `unknown field "all"`)
	require.DirExists(t, filepath.Join(snaps, "web-1", "s1"))
	for range 2 {
		require.Equal(t, map[string]any{"instance_id": "web-1", "snapshot_id": "s1"},
			r.must(t, vmcmd.KindSnapshotDelete, vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "s1"}))
	}
	require.NoDirExists(t, filepath.Join(snaps, "web-1", "s1"))
	require.DirExists(t, filepath.Join(snaps, "web-1", "s3"))
	r.must(t, vmcmd.KindSnapshotDelete, vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "s3"})
	require.NoDirExists(t, filepath.Join(snaps, "web-1"), "the emptied directory goes too")
	r.must(t, vmcmd.KindSnapshotDelete, vmcmd.SnapshotParams{InstanceID: "never-was", SnapshotID: "s1"})

	// A live instance's snapshot: only the snapshot goes.
	r.must(t, vmcmd.KindInstanceCreate, createParams("web-2"))
	r.must(t, vmcmd.KindInstanceSnapshot, vmcmd.SnapshotParams{InstanceID: "web-2", SnapshotID: "s1"})
	r.must(t, vmcmd.KindSnapshotDelete, vmcmd.SnapshotParams{InstanceID: "web-2", SnapshotID: "s1"})
	require.NoDirExists(t, filepath.Join(snaps, "web-2"))
	_, err = r.apply(t, vmcmd.KindInstanceRestore, vmcmd.SnapshotParams{InstanceID: "web-2", SnapshotID: "s1"})
	requireCode(t, err, vmcmd.FailNotFound, `no snapshot "s1"`)
	require.Equal(t, "running", r.must(t, vmcmd.KindInstanceStart, vmcmd.InstanceRef{InstanceID: "web-2"})["state"])
	r.must(t, vmcmd.KindInstanceDelete, vmcmd.DeleteParams{InstanceID: "web-2"})
	r.requireNothing(t)
}
