package release

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// buildProbe builds testdata/sbomprobe, a real Go program with two module
// dependencies, and returns its path.
func buildProbe(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the SBOM test builds a Go binary")
	out := filepath.Join(t.TempDir(), "bcd-"+runtime.GOOS+"-"+runtime.GOARCH)
	cmd := exec.Command(goTool, "build", "-buildvcs=false", "-o", out, "./testdata/sbomprobe")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	return out
}

func TestSBOMFromARealBinary(t *testing.T) {
	t.Parallel()
	bin := buildProbe(t)
	sum, _, err := digestFile(bin)
	require.NoError(t, err)
	data, info, err := SBOM(bin, SBOMInput{Name: "bcd", Version: "v1.4.0", SHA256: sum, Created: time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)})
	require.NoError(t, err)
	require.Equal(t, "github.com/better-compute/better-compute/internal/release/testdata/sbomprobe", info.Path)

	var bom struct {
		BOMFormat    string `json:"bomFormat"`
		SpecVersion  string `json:"specVersion"`
		SerialNumber string `json:"serialNumber"`
		Version      int    `json:"version"`
		Metadata     struct {
			Timestamp string       `json:"timestamp"`
			Component cdxComponent `json:"component"`
		} `json:"metadata"`
		Components   []cdxComponent  `json:"components"`
		Dependencies []cdxDependency `json:"dependencies"`
	}
	require.NoError(t, json.Unmarshal(data, &bom))
	require.Equal(t, "CycloneDX", bom.BOMFormat)
	require.Equal(t, "1.5", bom.SpecVersion)
	require.Regexp(t, `^urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, bom.SerialNumber)
	require.Equal(t, 1, bom.Version)
	require.Equal(t, "2026-12-05T08:00:00Z", bom.Metadata.Timestamp)

	main := bom.Metadata.Component
	require.Equal(t, "application", main.Type)
	require.Equal(t, "bcd", main.Name)
	require.Equal(t, "v1.4.0", main.Version)
	require.Equal(t, "pkg:golang/github.com/better-compute/better-compute@v1.4.0#internal/release/testdata/sbomprobe", main.PURL)
	require.Equal(t, []cdxHash{{Alg: "SHA-256", Content: sum}}, main.Hashes)
	props := map[string]string{}
	for _, p := range main.Properties {
		props[p.Name] = p.Value
	}
	require.Equal(t, runtime.Version(), props["go:toolchain"])
	require.Equal(t, "github.com/better-compute/better-compute", props["go:main-module"])
	require.Equal(t, runtime.GOOS, props["go:build:GOOS"])
	require.Equal(t, runtime.GOARCH, props["go:build:GOARCH"])

	byName := map[string]cdxComponent{}
	for _, c := range bom.Components {
		require.Equal(t, "library", c.Type)
		require.Equal(t, c.PURL, c.BOMRef)
		byName[c.Name] = c
	}
	for _, mod := range []string{"github.com/spf13/pflag", "golang.org/x/mod"} {
		c, ok := byName[mod]
		require.True(t, ok, "the SBOM lists %s: %s", mod, data)
		require.Regexp(t, `^v\d+\.\d+\.\d+`, c.Version)
		require.Equal(t, "pkg:golang/"+mod+"@"+c.Version, c.PURL)
		require.Len(t, c.Properties, 1)
		require.Equal(t, "go:module:h1", c.Properties[0].Name)
		require.True(t, strings.HasPrefix(c.Properties[0].Value, "h1:"), c.Properties[0].Value)
	}
	require.Len(t, bom.Dependencies, 1)
	require.Equal(t, main.BOMRef, bom.Dependencies[0].Ref)
	require.Len(t, bom.Dependencies[0].DependsOn, len(bom.Components))

	// Not a Go binary.
	text := filepath.Join(t.TempDir(), "bcd")
	require.NoError(t, os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755))
	_, _, err = SBOM(text, SBOMInput{Name: "bcd", Version: "v1.4.0", SHA256: sum})
	require.Error(t, err)
}

func TestPURLEscapes(t *testing.T) {
	t.Parallel()
	require.Equal(t, "github.com/Azure/go-autorest", purlPath("github.com/Azure/go-autorest"))
	require.Equal(t, "v2.0.0%2Bincompatible", purlEscape("v2.0.0+incompatible"))
	require.Equal(t, "a%20b/c%40d", purlPath("a b/c@d"))
}

func digestFile(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	return Digest(f)
}

// TestAssembleSignVerifyARealBinary: the whole offline path on a real
// binary: assemble (SBOM, digests), sign, verify, check the binary and
// its SBOM; and a binary handed in under the wrong platform is refused.
func TestAssembleSignVerifyARealBinary(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skipf("releases carry linux binaries; this test builds one for the host, %s", runtime.GOOS)
	}
	f := setup(t)
	bin := buildProbe(t)
	platform := "linux-" + runtime.GOARCH
	m, sboms, err := Assemble("v1.4.0", "v1.3.0", time.Now(), []Input{{Platform: platform, Path: bin}})
	require.NoError(t, err)
	require.Len(t, sboms, 1)
	b, ok := m.Binary(platform)
	require.True(t, ok)
	require.Equal(t, filepath.Base(bin), b.Name)
	require.Equal(t, SBOMName(b.Name), sboms[0].Name)

	env, err := Sign(m, f.key)
	require.NoError(t, err)
	got, _, err := Verify(env, f.trusted)
	require.NoError(t, err)
	gb, _ := got.Binary(platform)
	file, err := os.Open(bin)
	require.NoError(t, err)
	defer file.Close()
	require.NoError(t, CheckBinary(file, gb))
	require.NoError(t, CheckSBOM(strings.NewReader(string(sboms[0].Data)), gb))

	other := "linux-arm64"
	if platform == other {
		other = "linux-amd64"
	}
	_, _, err = Assemble("v1.4.0", "v1.3.0", time.Now(), []Input{{Platform: other, Path: bin}})
	requireRefused(t, err, ErrInvalid, "binary["+other+"]")
	_, _, err = Assemble("v1.4.0", "v1.3.0", time.Now(), []Input{{Platform: "windows-amd64", Path: bin}})
	requireRefused(t, err, ErrInvalid, "binary[windows-amd64]")
	_, _, err = Assemble("v1.4", "v1.3.0", time.Now(), []Input{{Platform: platform, Path: bin}})
	requireRefused(t, err, ErrInvalid, "version")
	_, _, err = Assemble("v1.4.0", "v1.3.0", time.Now(), nil)
	requireRefused(t, err, ErrInvalid, "binary")
}
