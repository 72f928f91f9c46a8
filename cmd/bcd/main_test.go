package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent/cgroups"
	"github.com/better-compute/better-compute/internal/release"
)

func noenv(string) string { return "" }

func TestTokenNeverFromArgv(t *testing.T) {
	t.Parallel()
	tok := "bcjt_" + strings.Repeat("a", 64) + ".jwe"
	for _, args := range [][]string{
		{"--server", "127.0.0.1:1", "--token", tok},
		{"--server", "127.0.0.1:1", "--token=" + tok},
		{"--server", "127.0.0.1:1", tok},
		{"--server", "127.0.0.1:1", "-token", "x"},
	} {
		err := run(context.Background(), args, noenv, strings.NewReader(""), &bytes.Buffer{})
		require.ErrorIs(t, err, errTokenInArgv, args)
	}
}

func TestConfigFileMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "config.toml")
	require.NoError(t, os.WriteFile(p, []byte("server = \"gw.example:7443\"\nstate_dir = \"/tmp/x\"\n"), 0o644))
	require.NoError(t, os.Chmod(p, 0o644))
	_, err := loadConfigFile(p)
	require.ErrorIs(t, err, errConfigMode)
	err = run(context.Background(), []string{"--config", p}, noenv, strings.NewReader(""), &bytes.Buffer{})
	require.ErrorIs(t, err, errConfigMode)

	require.NoError(t, os.Chmod(p, 0o600))
	fc, err := loadConfigFile(p)
	require.NoError(t, err)
	require.Equal(t, "gw.example:7443", fc.Server)

	y := filepath.Join(dir, "config.yaml")
	require.NoError(t, os.WriteFile(y, []byte("server: gw:1\nhardware: fake:dgxa100\n"), 0o600))
	fc, err = loadConfigFile(y)
	require.NoError(t, err)
	require.Equal(t, "fake:dgxa100", fc.Hardware)

	bad := filepath.Join(dir, "bad.toml")
	require.NoError(t, os.WriteFile(bad, []byte("token = \"bcjt_x\"\n"), 0o600))
	_, err = loadConfigFile(bad)
	require.Error(t, err, "unknown keys (a token) are refused")
}

func TestFlagsOverrideFile(t *testing.T) {
	t.Parallel()
	var o options
	o.server, o.hardware = "flag:1", "nvml"
	o.merge(&fileConfig{Server: "file:1", Hardware: "fake:dgxh100", Mode: "site"}, map[string]bool{"server": true})
	require.Equal(t, "flag:1", o.server)
	require.Equal(t, "fake:dgxh100", o.hardware)
	require.Equal(t, "site", o.mode)
}

func TestNotJoinedNeedsToken(t *testing.T) {
	t.Parallel()
	args := []string{"--server", "127.0.0.1:1", "--state-dir", t.TempDir(), "--hardware", "fake:dgxh100", "--metrics-listen", ""}
	err := run(context.Background(), args, noenv, strings.NewReader(""), &bytes.Buffer{})
	require.ErrorContains(t, err, "not joined")
	err = run(context.Background(), append(args, "--token-stdin"), noenv, strings.NewReader("garbage\n"), &bytes.Buffer{})
	require.ErrorContains(t, err, "malformed join token")
	err = run(context.Background(), args, func(k string) string {
		if k == "BCD_JOIN_TOKEN" {
			return "garbage"
		}
		return ""
	}, strings.NewReader(""), &bytes.Buffer{})
	require.ErrorContains(t, err, "malformed join token")
}

// TestServerList: --server takes several gateways; a malformed list is
// refused at start, naming the flag.
func TestServerList(t *testing.T) {
	t.Parallel()
	base := []string{"--state-dir", t.TempDir(), "--hardware", "fake:dgxh100", "--metrics-listen", ""}
	err := run(context.Background(), append([]string{"--server", "127.0.0.1:1,gw.example:7443"}, base...), noenv, strings.NewReader(""), &bytes.Buffer{})
	require.ErrorContains(t, err, "not joined")
	for _, bad := range []string{"127.0.0.1:1,,127.0.0.1:2", "127.0.0.1:1,gw.example"} {
		err := run(context.Background(), append([]string{"--server", bad}, base...), noenv, strings.NewReader(""), &bytes.Buffer{})
		require.ErrorContains(t, err, "--server: ", bad)
	}
}

func TestHardwareSpec(t *testing.T) {
	t.Parallel()
	b, err := openHardware("fake:dgxb200", "s", "")
	require.NoError(t, err)
	require.NoError(t, b.Close())
	_, err = openHardware("fake:dgx9", "s", "")
	require.Error(t, err)
	_, err = openHardware("quantum", "", "")
	require.Error(t, err)
}

// TestCgroupRootMustBeCgroup2: outside the fake hardware mode a cgroup root
// that is a plain directory is refused at start, naming the flag; the fake
// mode still keeps its cgroups in any directory.
func TestCgroupRootMustBeCgroup2(t *testing.T) {
	t.Parallel()
	cg := filepath.Join(t.TempDir(), "bettercompute")
	base := []string{"--server", "127.0.0.1:1", "--state-dir", t.TempDir(), "--metrics-listen", "", "--cgroup-root", cg}

	err := run(context.Background(), append(base, "--hardware", "none"), noenv, strings.NewReader(""), &bytes.Buffer{})
	require.ErrorIs(t, err, cgroups.ErrNotCgroup2)
	require.ErrorContains(t, err, "--cgroup-root "+cg)
	require.NoDirExists(t, cg, "nothing written")

	err = run(context.Background(), append(base, "--hardware", "fake:dgxh100"), noenv, strings.NewReader(""), &bytes.Buffer{})
	require.ErrorContains(t, err, "not joined", "fake mode gets past the cgroup check")
}

func TestLivenessFlags(t *testing.T) {
	t.Parallel()
	base := []string{"--server", "127.0.0.1:1", "--state-dir", t.TempDir(), "--hardware", "fake:dgxh100", "--metrics-listen", ""}
	err := run(context.Background(), append(base, "--keepalive", "5s"), noenv, strings.NewReader(""), &bytes.Buffer{})
	require.ErrorContains(t, err, "--keepalive 5s: must be at least 10s")
	err = run(context.Background(), append(base, "--hello-timeout", "0s"), noenv, strings.NewReader(""), &bytes.Buffer{})
	require.ErrorContains(t, err, "--hello-timeout 0s: must be positive")
}

// TestRamdiskModeReadsKernelCmdline: in ramdisk mode the gateway and the
// discovery token come from the kernel command line, and a discovery token
// on bcd's own command line is refused like a join token.
func TestRamdiskModeReadsKernelCmdline(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "proc"), 0o755))
	tok := "bcdt_" + strings.Repeat("a", 64) + ".secret"
	require.NoError(t, os.WriteFile(filepath.Join(root, "proc/cmdline"), []byte("console=ttyS0 bc.server=127.0.0.1:1 bc.token="+tok+"\n"), 0o644))
	err := run(context.Background(), []string{"--mode", "ramdisk", "--sysfs-root", root, "--state-dir", t.TempDir(), "--metrics-listen", ""},
		noenv, strings.NewReader(""), &bytes.Buffer{})
	// The server came from the command line (no "--server is required"):
	// the join dials it and is refused there.
	require.ErrorContains(t, err, "join")
	require.NotContains(t, err.Error(), "--server")

	err = run(context.Background(), []string{"--mode", "ramdisk", "--server", "127.0.0.1:1", tok}, noenv, strings.NewReader(""), &bytes.Buffer{})
	require.ErrorIs(t, err, errTokenInArgv)
}

// TestInstanceFlags: the instance flags are checked before anything starts,
// and a config file sets them like the flags.
func TestInstanceFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base := []string{"--server", "127.0.0.1:1", "--state-dir", filepath.Join(dir, "state"), "--hardware", "fake:dgxh100"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--instances-dir", "rel/dir", "--guest-images", dir}, "--instances-dir \"rel/dir\": must be an absolute path"},
		{[]string{"--instances-dir", dir}, "--guest-images \"\": an absolute path is required with --instances-dir"},
		{[]string{"--instances-dir", dir, "--guest-images", dir, "--mode", "site"}, "only --mode node runs instances"},
		{[]string{"--instances-dir", dir, "--guest-images", dir, "--instance-accel", "hvf"}, "--instance-accel \"hvf\": must be kvm, tcg or empty"},
		{[]string{"--instances-dir", dir, "--guest-images", dir, "--instance-bridge", "a-very-long-bridge-name"}, "is not an interface name"},
	} {
		err := run(context.Background(), append(append([]string{}, base...), c.args...), noenv, strings.NewReader(""), &bytes.Buffer{})
		require.ErrorContains(t, err, c.want, c.args)
	}

	p := filepath.Join(dir, "config.yaml")
	require.NoError(t, os.WriteFile(p, []byte("server: gw:1\ninstances_dir: /var/lib/bcd/instances\nguest_images: /var/lib/bcd/images\n"+
		"instance_bridge: br9\ninstance_bridge_address: 10.9.0.1/24\ninstance_netns: vms\ninstance_accel: tcg\n"), 0o600))
	fc, err := loadConfigFile(p)
	require.NoError(t, err)
	var o options
	o.inst.bridge = "bcbr0"
	o.merge(fc, map[string]bool{})
	require.Equal(t, instanceOptions{dir: "/var/lib/bcd/instances", images: "/var/lib/bcd/images", bridge: "br9",
		bridgeAddress: "10.9.0.1/24", netns: "vms", accel: "tcg"}, o.inst)
}

func TestExecIDs(t *testing.T) {
	t.Parallel()
	first, count, err := parseExecIDs("1879048192:65536")
	require.NoError(t, err)
	require.Equal(t, [2]uint32{1879048192, 65536}, [2]uint32{first, count})
	for _, bad := range []string{"", "100", "0:10", "10:0", "x:1", "1:y", "4294967000:1000", "-1:5"} {
		_, _, err := parseExecIDs(bad)
		require.Error(t, err, bad)
	}
}

func TestSecretGetUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var out bytes.Buffer
	require.ErrorContains(t, runSecret(ctx, nil, &out, &out), "usage: bcd secret get")
	require.ErrorContains(t, runSecret(ctx, []string{"put", "secret://x"}, &out, &out), "usage: bcd secret get")
	require.ErrorContains(t, runSecret(ctx, []string{"get"}, &out, &out), "takes one secret://NAME")
	// Joined nowhere: no identity to fetch as, and nothing printed.
	err := runSecret(ctx, []string{"get", "--server", "127.0.0.1:1", "--state-dir", t.TempDir(), "secret://x"}, &out, &out)
	require.ErrorContains(t, err, "no node identity")
	require.Empty(t, out.String())
}

// --release-pubkey repeats and pairs with the config key release_pubkeys
// (the flag wins); a file that is not a release public key stops bcd
// before it starts, naming the file.
func TestReleasePubkeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key, _, err := release.GenerateKey(release.AlgEd25519)
	require.NoError(t, err)
	pub := filepath.Join(dir, "release.pub")
	require.NoError(t, os.WriteFile(pub, key.Public.PEM(), 0o644))

	fs := flag.NewFlagSet("bcd", flag.ContinueOnError)
	var o options
	o.register(fs)
	require.NoError(t, fs.Parse([]string{"--release-pubkey", pub, "--release-pubkey", pub}))
	require.Equal(t, stringList{pub, pub}, o.releaseKeys)
	keys, err := loadReleaseKeys(o.releaseKeys)
	require.NoError(t, err)
	require.Len(t, keys, 2)
	require.Equal(t, key.Public.ID, keys[0].ID)

	p := filepath.Join(dir, "config.yaml")
	require.NoError(t, os.WriteFile(p, []byte("server: gw:1\nrelease_pubkeys: [/etc/bcd/a.pub, /etc/bcd/b.pub]\n"), 0o600))
	fc, err := loadConfigFile(p)
	require.NoError(t, err)
	var fromFile options
	fromFile.merge(fc, map[string]bool{})
	require.Equal(t, stringList{"/etc/bcd/a.pub", "/etc/bcd/b.pub"}, fromFile.releaseKeys)
	o.merge(fc, map[string]bool{"release-pubkey": true})
	require.Equal(t, stringList{pub, pub}, o.releaseKeys, "flags override the file")

	notRelease := filepath.Join(dir, "image.pub")
	require.NoError(t, os.WriteFile(notRelease, []byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"), 0o644))
	_, err = loadReleaseKeys([]string{notRelease})
	require.ErrorContains(t, err, "--release-pubkey "+notRelease)
	require.ErrorIs(t, err, release.ErrWrongPurpose)
	err = run(context.Background(), []string{"--server", "127.0.0.1:1", "--state-dir", dir, "--release-pubkey", filepath.Join(dir, "missing.pub")},
		noenv, strings.NewReader(""), &bytes.Buffer{})
	require.ErrorContains(t, err, "--release-pubkey")
}
