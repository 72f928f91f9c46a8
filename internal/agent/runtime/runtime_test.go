package runtime_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/better-compute/better-compute/internal/agent/runtime"
	"github.com/better-compute/better-compute/internal/sshca"
)

func need(t *testing.T, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("needs %s (.ci/run installs it)", c)
		}
	}
}

// files is a base image (a real qcow2), a kernel file and a volume: what a
// spec points at, for tests that do not boot.
type files struct {
	dir, base, kernel, vol string
}

func setupFiles(t *testing.T) files {
	t.Helper()
	need(t, "qemu-img")
	dir := t.TempDir()
	f := files{dir: dir, base: filepath.Join(dir, "base.qcow2"), kernel: filepath.Join(dir, "vmlinuz"), vol: filepath.Join(dir, "vol.raw")}
	out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", f.base, "64M").CombinedOutput()
	require.NoError(t, err, string(out))
	require.NoError(t, os.WriteFile(f.kernel, []byte("kernel"), 0o644))
	require.NoError(t, os.WriteFile(f.vol, make([]byte, 1<<20), 0o644))
	return f
}

func validSeed(t *testing.T) *runtime.Seed {
	t.Helper()
	ca, err := sshca.New(nil)
	require.NoError(t, err)
	hk, err := sshca.NewHostKey()
	require.NoError(t, err)
	cert, err := ca.SignHost(hk.Signer.PublicKey(), []string{"10.0.0.2"}, time.Hour)
	require.NoError(t, err)
	return &runtime.Seed{
		Hostname: "web-1", User: "alice",
		TrustedUserCAKeys: []string{ca.AuthorizedKey()}, AuthorizedPrincipals: []string{"ins_01jd5x"},
		HostKey: string(hk.PrivatePEM), HostCertificate: sshca.MarshalCert(cert),
		Address: "10.0.0.2/24", Gateway: "10.0.0.1", DNS: []string{"10.0.0.53", "9.9.9.9"},
	}
}

func validSpec(t *testing.T, f files) runtime.Spec {
	t.Helper()
	return runtime.Spec{
		ID: "vm-1", VCPUs: 2, MemoryMiB: 256,
		Image:   runtime.Image{Disk: f.base, Kernel: f.kernel},
		DiskMiB: 128,
		Volumes: []runtime.Volume{{ID: "data", Path: f.vol, Format: "raw"}},
		MAC:     "52:54:00:12:34:56",
		Network: &runtime.Network{Bridge: "bcbr0"},
		Seed:    validSeed(t),
	}
}

func TestSpecValidation(t *testing.T) {
	t.Parallel()
	f := setupFiles(t)
	neg := -1
	cases := []struct {
		name   string
		mutate func(s *runtime.Spec)
		field  string
		reason string
	}{
		{"id with capitals", func(s *runtime.Spec) { s.ID = "VM" }, "id", "must be 1-63"},
		{"no vcpus", func(s *runtime.Spec) { s.VCPUs = 0 }, "vcpus", "must be 1..256"},
		{"tiny memory", func(s *runtime.Spec) { s.MemoryMiB = 16 }, "memory_mib", "must be 64.."},
		{"missing image", func(s *runtime.Spec) { s.Image.Disk = filepath.Join(f.dir, "nope.qcow2") }, "image.disk", "no such file"},
		{"relative kernel", func(s *runtime.Spec) { s.Image.Kernel = "vmlinuz" }, "image.kernel", "clean absolute path"},
		{"comma in path", func(s *runtime.Spec) { s.Image.Disk = f.dir + "/a,b" }, "image.disk", "clean absolute path"},
		{"directory as initrd", func(s *runtime.Spec) { s.Image.Initrd = f.dir }, "image.initrd", "not a regular file"},
		{"two-line cmdline", func(s *runtime.Spec) { s.Image.Cmdline = "a\nb" }, "image.cmdline", "one line"},
		{"volume format", func(s *runtime.Spec) { s.Volumes[0].Format = "vmdk" }, "volumes[0].format", "qcow2 or raw"},
		{"volume twice", func(s *runtime.Spec) { s.Volumes = append(s.Volumes, s.Volumes[0]) }, "volumes[1].id", "used twice"},
		{"negative cpu", func(s *runtime.Spec) { s.HostCPUs = []int{0, -2} }, "host_cpus[1]", "negative"},
		{"negative numa", func(s *runtime.Spec) { s.NUMANode = &neg }, "numa_node", "negative"},
		{"bad mac", func(s *runtime.Spec) { s.MAC = "52:54:00" }, "mac", "not a MAC"},
		{"multicast mac", func(s *runtime.Spec) { s.MAC = "01:00:5e:00:00:01" }, "mac", "multicast"},
		{"network without mac", func(s *runtime.Spec) { s.MAC = "" }, "mac", "required with a network"},
		{"long bridge", func(s *runtime.Spec) { s.Network.Bridge = "a-very-long-bridge-name" }, "network.bridge", "interface name"},
		{"bridge address", func(s *runtime.Spec) { s.Network.BridgeAddress = "10.0.0.1" }, "network.bridge_address", "address/prefix"},
		{"hostname", func(s *runtime.Spec) { s.Seed.Hostname = "Web_1" }, "seed.hostname", "DNS label"},
		{"root login", func(s *runtime.Spec) { s.Seed.User = "root" }, "seed.user", "not an allowed account"},
		{"no way in", func(s *runtime.Spec) { s.Seed.TrustedUserCAKeys = nil }, "seed.authorized_keys", "required to log in"},
		{"CA without principals", func(s *runtime.Spec) { s.Seed.AuthorizedPrincipals = nil }, "seed.authorized_principals", "required with a trusted user CA"},
		{"principals without CA", func(s *runtime.Spec) {
			s.Seed.TrustedUserCAKeys, s.Seed.AuthorizedKeys = nil, []string{"ssh-ed25519 AAAA"}
		}, "seed.authorized_principals", "need a trusted user CA"},
		{"principal with a space", func(s *runtime.Spec) { s.Seed.AuthorizedPrincipals = []string{"ins_1", "a b"} }, "seed.authorized_principals[1]", "not a principal"},
		{"principal with options", func(s *runtime.Spec) { s.Seed.AuthorizedPrincipals = []string{`from="*",x`} }, "seed.authorized_principals[0]", "not a principal"},
		{"key with newline", func(s *runtime.Spec) { s.Seed.AuthorizedKeys = []string{"ssh-ed25519 AAAA\nssh-rsa B"} }, "seed.authorized_keys", "one authorized_keys line"},
		{"host key alone", func(s *runtime.Spec) { s.Seed.HostCertificate = "" }, "seed.host_certificate", "come together"},
		{"host cert not a cert", func(s *runtime.Spec) { s.Seed.HostCertificate = "ssh-ed25519 AAAA" }, "seed.host_certificate", "OpenSSH certificate"},
		{"address", func(s *runtime.Spec) { s.Seed.Address = "10.0.0.2" }, "seed.address", "IPv4 address/prefix"},
		{"gateway outside", func(s *runtime.Spec) { s.Seed.Gateway = "10.0.1.1" }, "seed.gateway", "outside 10.0.0.0/24"},
		{"dns", func(s *runtime.Spec) { s.Seed.DNS = []string{"dns.example"} }, "seed.dns[0]", "not an IP"},
		{"dns without address", func(s *runtime.Spec) { s.Seed.Address, s.Seed.Gateway = "", "" }, "seed.address", "required with a gateway or DNS"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := validSpec(t, f)
			tc.mutate(&s)
			err := s.Validate()
			var se *runtime.SpecError
			require.True(t, errors.As(err, &se), "got %v", err)
			require.Equal(t, tc.field, se.Field)
			require.Contains(t, se.Reason, tc.reason)
		})
	}
	s := validSpec(t, f)
	require.NoError(t, s.Validate())
}

func TestRenderSeed(t *testing.T) {
	t.Parallel()
	seed := validSeed(t)
	got, err := runtime.RenderSeed(seed, "vm-1", "52:54:00:AB:CD:EF")
	require.NoError(t, err)
	require.Equal(t, "instance-id: vm-1\nlocal-hostname: web-1\n", string(got["meta-data"]))

	ud := string(got["user-data"])
	require.True(t, strings.HasPrefix(ud, "#cloud-config\n"))
	for _, want := range []string{
		"hostname: web-1", "name: alice", "lock_passwd: true", "ssh_deletekeys: false",
		"path: /etc/ssh/ssh_host_ed25519_key\n", "permissions: \"0600\"", "OPENSSH PRIVATE KEY",
		"path: /etc/ssh/ssh_host_ed25519_key-cert.pub", "ssh-ed25519-cert-v01@openssh.com ",
		"TrustedUserCAKeys /etc/ssh/better_compute_user_ca.pub", "HostCertificate /etc/ssh/ssh_host_ed25519_key-cert.pub",
		"AuthorizedPrincipalsFile /etc/ssh/better_compute_principals/%u",
		"PasswordAuthentication no", "nameserver 10.0.0.53\n", "nameserver 9.9.9.9\n",
	} {
		require.Contains(t, ud, want)
	}
	// The CA's certificates log in as the account only for the instance's
	// own principal: sshd reads it from the account's principals file.
	var cc struct {
		WriteFiles []struct{ Path, Content, Permissions, Owner string } `yaml:"write_files"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(ud), &cc))
	principals := map[string]string{}
	for _, f := range cc.WriteFiles {
		if strings.HasPrefix(f.Path, "/etc/ssh/better_compute_principals") {
			principals[f.Path] = f.Content + " " + f.Permissions + " " + f.Owner
		}
	}
	require.Equal(t, map[string]string{"/etc/ssh/better_compute_principals/alice": "ins_01jd5x\n 0644 root:root"}, principals)
	nc := string(got["network-config"])
	for _, want := range []string{"version: 1", "name: eth0", "mac_address: 52:54:00:ab:cd:ef", "address: 10.0.0.2/24", "gateway: 10.0.0.1", "- 10.0.0.53"} {
		require.Contains(t, nc, want)
	}

	// The tenant's user data rides along as a second MIME part.
	seed.UserData = "#!/bin/sh\necho hello > /tmp/hello\n"
	got, err = runtime.RenderSeed(seed, "vm-1", "")
	require.NoError(t, err)
	ud = string(got["user-data"])
	require.Contains(t, ud, "Content-Type: multipart/mixed")
	require.Contains(t, ud, "text/cloud-config")
	require.Contains(t, ud, "text/x-shellscript")
	require.Contains(t, ud, "echo hello > /tmp/hello")

	seed.UserData = "just text"
	_, err = runtime.RenderSeed(seed, "vm-1", "")
	require.ErrorContains(t, err, "seed.user_data: must start with #cloud-config or #!")

	// No address: no network-config (the image's default applies).
	seed = validSeed(t)
	seed.Address, seed.Gateway, seed.DNS = "", "", nil
	got, err = runtime.RenderSeed(seed, "vm-1", "")
	require.NoError(t, err)
	require.NotContains(t, got, "network-config")
}

func TestWriteSeedImage(t *testing.T) {
	t.Parallel()
	need(t, "mkfs.vfat", "mcopy", "mlabel")
	files, err := runtime.RenderSeed(validSeed(t), "vm-1", "52:54:00:12:34:56")
	require.NoError(t, err)
	img := filepath.Join(t.TempDir(), "seed.img")
	require.NoError(t, runtime.WriteSeedImage(context.Background(), img, files))

	label, err := exec.Command("mlabel", "-i", img, "-s", "::").CombinedOutput()
	require.NoError(t, err, string(label))
	require.Contains(t, string(label), "CIDATA")
	for name, want := range files {
		cmd := exec.Command("mcopy", "-i", img, "::"+name, "-")
		cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
		got, err := cmd.Output()
		require.NoError(t, err, name)
		require.Equal(t, string(want), string(got), name)
	}
	// Only the seed image is left in the directory.
	entries, err := os.ReadDir(filepath.Dir(img))
	require.NoError(t, err)
	require.Len(t, entries, 1)
}

func TestCreateAdoptDeleteWithoutBooting(t *testing.T) {
	t.Parallel()
	need(t, "mkfs.vfat", "mcopy")
	f := setupFiles(t)
	ctx := context.Background()
	state := filepath.Join(t.TempDir(), "state")
	rt, err := runtime.New(runtime.Config{StateDir: state, Accel: "tcg"})
	require.NoError(t, err)

	spec := validSpec(t, f)
	spec.Network = nil
	spec.MAC = ""
	require.NoError(t, rt.Create(ctx, spec))
	require.ErrorIs(t, rt.Create(ctx, spec), runtime.ErrExists)
	for _, name := range []string{"spec.json", "disk.qcow2", "seed.img"} {
		require.FileExists(t, filepath.Join(state, "vm-1", name))
	}
	out, err := exec.Command("qemu-img", "info", filepath.Join(state, "vm-1", "disk.qcow2")).CombinedOutput()
	require.NoError(t, err)
	require.Contains(t, string(out), "virtual size: 128 MiB")
	require.Contains(t, string(out), "backing file: "+f.base)

	// A smaller disk than the base is refused, and leaves nothing.
	small := spec
	small.ID, small.DiskMiB = "vm-2", 32
	var se *runtime.SpecError
	require.ErrorAs(t, rt.Create(ctx, small), &se)
	require.Equal(t, "disk_mib", se.Field)
	require.NoDirExists(t, filepath.Join(state, "vm-2"))

	// A Create that died before writing its spec (bcd was killed) left
	// a directory with an overlay and no spec.
	require.NoError(t, os.Mkdir(filepath.Join(state, "vm-3"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(state, "vm-3", "disk.qcow2"), []byte("half"), 0o600))

	// A second runtime on the same state directory sees the instance,
	// and removes the half-created one so it can be created again.
	rt2, err := runtime.New(runtime.Config{StateDir: state, Accel: "tcg"})
	require.NoError(t, err)
	list, err := rt2.Adopt(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.NoDirExists(t, filepath.Join(state, "vm-3"))
	require.Equal(t, runtime.StateCreated, list[0].State)
	require.Equal(t, spec.Volumes, list[0].Spec.Volumes)

	require.ErrorIs(t, rt2.Pause(ctx, "vm-1"), runtime.ErrNotRunning)
	require.ErrorContains(t, rt2.DeleteVolume(ctx, f.vol), "attached to \"vm-1\"")
	require.NoError(t, rt2.Delete(ctx, "vm-1"))
	require.NoDirExists(t, filepath.Join(state, "vm-1"))
	require.FileExists(t, f.vol, "volumes are the caller's")
	_, err = rt2.Get(ctx, "vm-1")
	require.ErrorIs(t, err, runtime.ErrNotFound)
	require.NoError(t, rt2.DeleteVolume(ctx, f.vol))
}

func TestVolumeHelpers(t *testing.T) {
	t.Parallel()
	need(t, "qemu-img")
	dir := t.TempDir()
	rt, err := runtime.New(runtime.Config{StateDir: filepath.Join(dir, "state"), Accel: "tcg"})
	require.NoError(t, err)
	ctx := context.Background()
	p := filepath.Join(dir, "v.qcow2")
	require.NoError(t, rt.CreateVolume(ctx, p, "qcow2", 10))
	out, err := exec.Command("qemu-img", "info", p).CombinedOutput()
	require.NoError(t, err)
	require.Contains(t, string(out), "file format: qcow2")
	require.Contains(t, string(out), "virtual size: 10 MiB")

	var se *runtime.SpecError
	require.ErrorAs(t, rt.CreateVolume(ctx, p, "qcow2", 10), &se)
	require.Equal(t, "path", se.Field)
	require.ErrorAs(t, rt.CreateVolume(ctx, p+"2", "vdi", 10), &se)
	require.Equal(t, "format", se.Field)
	require.ErrorAs(t, rt.CreateVolume(ctx, p+"3", "raw", 0), &se)
	require.Equal(t, "size_mib", se.Field)
	require.NoError(t, rt.DeleteVolume(ctx, p))
	require.NoFileExists(t, p)
}

// The probe itself, on TCG: the boot sector exits QEMU through
// isa-debug-exit. (KVM's outcome depends on the host.)
func TestProbeSectorBootsOnTCG(t *testing.T) {
	t.Parallel()
	need(t, "qemu-system-x86_64")
	rt, err := runtime.New(runtime.Config{StateDir: t.TempDir(), ProbeTimeout: 2 * time.Minute})
	require.NoError(t, err)
	require.NoError(t, runtime.BootProbe(rt, context.Background(), "tcg"))
	caps := rt.Capabilities(context.Background())
	require.Contains(t, []string{"kvm", "tcg"}, caps.Accel)
	require.NotEmpty(t, caps.AccelReason)
	require.NotEmpty(t, caps.HugePagesReason)
	if _, err := os.Stat("/dev/kvm"); err != nil {
		require.Equal(t, "tcg", caps.Accel)
		require.Contains(t, caps.AccelReason, "/dev/kvm")
	}
}

// TestCreateFromDisk: a spec with FromDisk gets a copy of that overlay as
// its root disk (its data, its backing file, grown to DiskMiB), and the
// stored spec does not name the source; a source on another base, a raw
// file, a missing one or one larger than DiskMiB is refused with the field
// and leaves nothing.
func TestCreateFromDisk(t *testing.T) {
	t.Parallel()
	need(t, "qemu-io", "mkfs.vfat", "mcopy")
	f := setupFiles(t)
	ctx := context.Background()
	state := filepath.Join(t.TempDir(), "state")
	rt, err := runtime.New(runtime.Config{StateDir: state, Accel: "tcg"})
	require.NoError(t, err)
	qemu := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		require.NoError(t, err, string(out))
		return string(out)
	}
	// The source: an overlay on the base with data of its own (what a
	// snapshot's disk.qcow2 is).
	src := filepath.Join(f.dir, "snap-disk.qcow2")
	qemu("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", f.base, src, "96M")
	qemu("qemu-io", "-c", "write -P 0xab 1M 64k", src)

	spec := validSpec(t, f)
	spec.Network, spec.MAC, spec.Volumes = nil, "", nil
	spec.FromDisk = src
	require.NoError(t, rt.Create(ctx, spec))
	disk := filepath.Join(state, "vm-1", "disk.qcow2")
	info := qemu("qemu-img", "info", disk)
	require.Contains(t, info, "virtual size: 128 MiB", "grown to DiskMiB")
	require.Contains(t, info, "backing file: "+f.base)
	require.Contains(t, qemu("qemu-io", "-c", "read -P 0xab 1M 64k", disk), "read 65536/65536")
	got, err := rt.Get(ctx, "vm-1")
	require.NoError(t, err)
	require.Empty(t, got.Spec.FromDisk)
	b, err := os.ReadFile(filepath.Join(state, "vm-1", "spec.json"))
	require.NoError(t, err)
	require.NotContains(t, string(b), "from_disk")
	require.FileExists(t, src, "the source is not consumed")

	// DiskMiB 0 keeps the source's size.
	zero := spec
	zero.ID, zero.DiskMiB = "vm-0", 0
	require.NoError(t, rt.Create(ctx, zero))
	require.Contains(t, qemu("qemu-img", "info", filepath.Join(state, "vm-0", "disk.qcow2")), "virtual size: 96 MiB")

	otherBase := filepath.Join(f.dir, "other.qcow2")
	qemu("qemu-img", "create", "-q", "-f", "qcow2", otherBase, "64M")
	foreign := filepath.Join(f.dir, "foreign.qcow2")
	qemu("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", otherBase, foreign, "64M")
	cases := []struct {
		name   string
		mutate func(s *runtime.Spec)
		field  string
		reason string
	}{
		{"another base", func(s *runtime.Spec) { s.FromDisk = foreign }, "from_disk", "not on the image's disk"},
		{"raw", func(s *runtime.Spec) { s.FromDisk = f.vol }, "from_disk", "not a qcow2 overlay"},
		{"missing", func(s *runtime.Spec) { s.FromDisk = filepath.Join(f.dir, "gone.qcow2") }, "from_disk", "no such file"},
		{"relative", func(s *runtime.Spec) { s.FromDisk = "snap-disk.qcow2" }, "from_disk", "clean absolute path"},
		{"smaller disk", func(s *runtime.Spec) { s.DiskMiB = 80 }, "disk_mib", "smaller than the disk of from_disk (96 MiB)"},
	}
	for _, tc := range cases {
		s := spec
		s.ID = "vm-2"
		tc.mutate(&s)
		var se *runtime.SpecError
		require.ErrorAs(t, rt.Create(ctx, s), &se, tc.name)
		require.Equal(t, tc.field, se.Field, tc.name)
		require.Contains(t, se.Reason, tc.reason, tc.name)
		require.NoDirExists(t, filepath.Join(state, "vm-2"), tc.name)
	}
}
