package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/pki"
)

// TestReleaseKeygenSignVerify drives the offline release commands end to
// end on a real Go binary: keygen, sign, verify; then a tampered binary, a
// tampered manifest, another release key and the command-signing root's
// own key files are each refused, naming what is wrong.
func TestReleaseKeygenSignVerify(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skipf("releases carry linux binaries; this test builds one for the host, %s", runtime.GOOS)
	}
	if os.Getenv(pki.SecretEnv) != "" {
		t.Fatalf("unset %s to run this test: pki init reads the secret from the state directory", pki.SecretEnv)
	}
	dir := t.TempDir()
	platform := "linux-" + runtime.GOARCH
	bin := filepath.Join(dir, "bcd-"+platform)
	build := exec.Command("go", "build", "-buildvcs=false", "-o", bin, "./internal/release/testdata/sbomprobe")
	build.Dir = filepath.Join("..", "..")
	b, err := build.CombinedOutput()
	require.NoError(t, err, "%s", b)

	keys, out := filepath.Join(dir, "keys"), filepath.Join(dir, "out")
	r := runPKI(t, "release", "keygen", "--out", keys)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `key id: release:[0-9a-f]{64}\n`, r.stdout)
	st, err := os.Stat(filepath.Join(keys, "release.key"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	r = runPKI(t, "release", "keygen", "--out", keys)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "exists")

	sign := func(key, outDir string, extra ...string) result {
		return runPKI(t, append([]string{"release", "sign", "--key", key, "--version", "v1.4.0", "--min-control-plane", "v1.3.0",
			"--binary", platform + "=" + bin, "--out", outDir}, extra...)...)
	}
	r = sign(filepath.Join(keys, "release.key"), out)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "release v1.4.0 (min control plane v1.3.0) signed by release:")
	entries, err := os.ReadDir(out)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, []string{"manifest.json", "bcd-" + platform + ".sbom.json"}, names, "sign writes the manifest and SBOMs, and copies nothing else")
	sbom, err := os.ReadFile(filepath.Join(out, "bcd-"+platform+".sbom.json"))
	require.NoError(t, err)
	require.Contains(t, string(sbom), `"purl": "pkg:golang/github.com/spf13/pflag@v`)

	manifest, pub := filepath.Join(out, "manifest.json"), filepath.Join(keys, "release.pub")
	verify := func(extra ...string) result {
		return runPKI(t, append([]string{"release", "verify", "--manifest", manifest, "--pubkey", pub}, extra...)...)
	}
	r = verify("--binary", platform+"="+bin)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, platform+"\t"+bin+"\tok: sha256 ")
	require.Contains(t, r.stdout, ".sbom.json\tok: sha256 ")

	// Signing again into the same directory overwrites nothing.
	r = sign(filepath.Join(keys, "release.key"), out)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "exists")
	r = verify()
	require.Equal(t, 0, r.code, r.stderr)

	// A tampered binary.
	tampered := filepath.Join(dir, "tampered")
	data, err := os.ReadFile(bin)
	require.NoError(t, err)
	data[len(data)/2] ^= 1
	require.NoError(t, os.WriteFile(tampered, data, 0o755))
	r = verify("--binary", platform+"="+tampered)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "binaries["+platform+"].sha256: digest mismatch")

	// A tampered SBOM beside the manifest.
	sbomPath := filepath.Join(out, "bcd-"+platform+".sbom.json")
	require.NoError(t, os.WriteFile(sbomPath, append(sbom, ' '), 0o644))
	r = verify()
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "binaries["+platform+"].sbom.size: digest mismatch")
	require.NoError(t, os.WriteFile(sbomPath, sbom, 0o644))

	// A tampered manifest.
	env, err := os.ReadFile(manifest)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(manifest, []byte(strings.Replace(string(env), `"v1.3.0"`, `"v1.0.0"`, 1)), 0o644))
	r = verify()
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "signature: signature does not verify")
	require.NoError(t, os.WriteFile(manifest, env, 0o644))

	// Another release key.
	otherKeys := filepath.Join(dir, "other")
	require.Equal(t, 0, runPKI(t, "release", "keygen", "--out", otherKeys, "--algorithm", "ecdsa-p256").code)
	r = runPKI(t, "release", "verify", "--manifest", manifest, "--pubkey", filepath.Join(otherKeys, "release.pub"))
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "key_id: signed by a key that is not trusted")
	r = runPKI(t, "release", "verify", "--manifest", manifest, "--pubkey", filepath.Join(otherKeys, "release.pub"), "--pubkey", pub)
	require.Equal(t, 0, r.code, r.stderr)

	// The command-signing root's offline key and certificate, as pki init
	// writes them, are no release key.
	rootOut := t.TempDir()
	r = runPKI(t, "pki", "init", "--state-dir", pkiStateDir(t), "--offline-root", "--root-out", rootOut)
	require.Equal(t, 0, r.code, r.stderr)
	r = sign(filepath.Join(rootOut, "command-root-1.key"), filepath.Join(dir, "by-root"))
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "INVALID_ARGUMENT: invalid --key: not a release key")
	_, err = os.Stat(filepath.Join(dir, "by-root"))
	require.ErrorIs(t, err, os.ErrNotExist, "a refused sign writes nothing")
	r = runPKI(t, "release", "verify", "--manifest", manifest, "--pubkey", filepath.Join(rootOut, "command-root-1.crt"))
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "invalid --pubkey")
	require.Contains(t, r.stderr, "not a release key")

	// Bad flags name themselves.
	for _, c := range []struct {
		argv []string
		want string
	}{
		{[]string{"release", "sign", "--key", filepath.Join(keys, "release.key"), "--version", "1.4", "--min-control-plane", "v1.3.0", "--binary", platform + "=" + bin, "--out", filepath.Join(dir, "x")}, "invalid --version"},
		{[]string{"release", "sign", "--key", filepath.Join(keys, "release.key"), "--version", "v1.4.0", "--min-control-plane", "latest", "--binary", platform + "=" + bin, "--out", filepath.Join(dir, "x")}, "invalid --min-control-plane"},
		{[]string{"release", "sign", "--key", filepath.Join(keys, "release.key"), "--version", "v1.4.0", "--min-control-plane", "v1.3.0", "--binary", bin, "--out", filepath.Join(dir, "x")}, "invalid --binary"},
		{[]string{"release", "sign", "--key", filepath.Join(keys, "release.key"), "--version", "v1.4.0", "--min-control-plane", "v1.3.0", "--out", filepath.Join(dir, "x")}, "invalid --binary"},
		{[]string{"release", "verify", "--manifest", manifest}, "invalid --pubkey"},
		{[]string{"release", "verify", "--manifest", manifest, "--pubkey", pub, "--binary", "linux-riscv64=" + bin}, "invalid --binary"},
	} {
		r := runPKI(t, c.argv...)
		require.Equal(t, 1, r.code, c.argv)
		require.Contains(t, r.stderr, c.want, c.argv)
	}
}
