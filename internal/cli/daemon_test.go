package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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
