package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/release"
)

func TestDaemonInstallScript(t *testing.T) {
	t.Parallel()
	sum := strings.Repeat("ab", 32)
	root := NewRootCommand("test")
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"daemon", "install-script", "--server-url", "https://bc.example.com", "--gateway", "gw.example.com:7443",
		"--version", "v1.2.3", "--sha256-amd64", sum})
	require.NoError(t, root.Execute())
	s := out.String()
	require.True(t, strings.HasPrefix(s, "#!/bin/sh\n"))
	require.Contains(t, s, `SHA256_AMD64='`+sum+`'`)
	require.Contains(t, s, `[ "$GOT" != "$WANT" ]`)
	require.Contains(t, s, "refusing to install")
	require.Contains(t, s, "/downloads/bcd/$VERSION/linux-$ARCH")
	require.Contains(t, s, "BCD_JOIN_TOKEN")
	require.Contains(t, s, "chmod 0600 /etc/bcd/config.toml")
	require.Contains(t, s, bcdUnit)

	p := filepath.Join(t.TempDir(), "install.sh")
	require.NoError(t, os.WriteFile(p, out.Bytes(), 0o600))
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	b, err := exec.Command(sh, "-n", p).CombinedOutput()
	require.NoError(t, err, string(b))
	if sc, err := exec.LookPath("shellcheck"); err == nil {
		b, err := exec.Command(sc, "-s", "sh", p).CombinedOutput()
		require.NoError(t, err, string(b))
	}
}

func TestDaemonInstallScriptRefusesBadInput(t *testing.T) {
	t.Parallel()
	good := installScriptFlags{serverURL: "https://x", gateway: "gw:1", version: "v1", shaAMD64: strings.Repeat("0", 64)}
	_, err := installScript(good)
	require.NoError(t, err)
	for _, mut := range []func(*installScriptFlags){
		func(f *installScriptFlags) { f.serverURL = "https://x/'$(reboot)'" },
		func(f *installScriptFlags) { f.serverURL = "ftp://x" },
		func(f *installScriptFlags) { f.gateway = "gw" },
		func(f *installScriptFlags) { f.version = "v1;rm" },
		func(f *installScriptFlags) { f.shaAMD64 = "zz" },
		func(f *installScriptFlags) { f.shaAMD64 = "" },
	} {
		f := good
		mut(&f)
		_, err := installScript(f)
		require.Error(t, err, f)
	}
}

func TestDaemonUnitMatchesDeploy(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../deploy/systemd/bcd.service")
	require.NoError(t, err)
	require.Equal(t, string(b), bcdUnit)
}

// TestInstallScriptReadsTheReleaseManifest runs the script's own
// release_sha256 with sh over a manifest as the control plane serves it
// (release sign's envelope, and the same re-indented, which verifies too).
func TestInstallScriptReadsTheReleaseManifest(t *testing.T) {
	t.Parallel()
	s, err := installScript(installScriptFlags{serverURL: "https://x", gateway: "gw:1", version: "v1.4.0", fromRelease: true})
	require.NoError(t, err)
	require.Contains(t, s, "FROM_RELEASE='1'")
	fn := regexp.MustCompile(`(?m)^release_sha256\(\) .*$`).FindString(s)
	require.NotEmpty(t, fn)

	key, _, err := release.GenerateKey(release.AlgEd25519)
	require.NoError(t, err)
	sha := map[string]string{"linux-amd64": strings.Repeat("a1", 32)}
	m := release.Manifest{Schema: release.Schema, Version: "v1.4.0", MinControlPlaneVersion: "v1.0.0", CreatedAt: time.Now(),
		Binaries: []release.Binary{{Platform: "linux-amd64", Name: "bcd-linux-amd64", SHA256: sha["linux-amd64"], Size: 10,
			SBOM: release.File{Name: "bcd-linux-amd64.sbom.json", SHA256: strings.Repeat("b2", 32), Size: 5}}}}
	env, err := release.Sign(m, key)
	require.NoError(t, err)
	var compact bytes.Buffer
	require.NoError(t, json.Compact(&compact, env))
	_, _, err = release.Verify(compact.Bytes(), []release.PublicKey{key.Public})
	require.NoError(t, err)
	dir := t.TempDir()
	for name, text := range map[string][]byte{"indented": env, "compact": compact.Bytes()} {
		p := filepath.Join(dir, name+".json")
		require.NoError(t, os.WriteFile(p, text, 0o600))
		for arch, want := range map[string]string{"amd64": sha["linux-amd64"], "arm64": ""} {
			out, err := exec.Command("sh", "-c", fn+"\nrelease_sha256 \"$1\" \"$2\"", "sh", p, arch).Output()
			require.NoError(t, err)
			require.Equal(t, want, strings.TrimSpace(string(out)), "%s %s", name, arch)
		}
	}

	_, err = installScript(installScriptFlags{serverURL: "https://x", gateway: "gw:1", version: "v1.4", fromRelease: true})
	require.Error(t, err)
	_, err = installScript(installScriptFlags{serverURL: "https://x", gateway: "gw:1", version: "v1.4.0"})
	require.Error(t, err, "without --from-release a pin is required")
}
