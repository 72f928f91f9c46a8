package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// readTar returns a tar's regular files and directories by name.
func readTar(t *testing.T, b []byte) map[string]*tar.Header {
	t.Helper()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		require.NotContains(t, out, h.Name, "entry twice")
		out[h.Name] = h
	}
}

func tarFiles(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		if h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			require.NoError(t, err)
			out[h.Name] = data
		}
	}
}

// blob returns the blob a descriptor names, checking its digest and size.
func blob(t *testing.T, files map[string][]byte, d descriptor) []byte {
	t.Helper()
	hexSum, ok := bytes.CutPrefix([]byte(d.Digest), []byte("sha256:"))
	require.True(t, ok, d.Digest)
	b, ok := files["blobs/sha256/"+string(hexSum)]
	require.True(t, ok, "blob %s missing", d.Digest)
	sum := sha256.Sum256(b)
	require.Equal(t, string(hexSum), hex.EncodeToString(sum[:]), "blob content does not match its digest")
	require.Equal(t, d.Size, int64(len(b)), "blob size")
	return b
}

// checkImage checks an archive the way the loaders read it and returns
// the layer's files.
func checkImage(t *testing.T, img []byte, wantName string, wantEntrypoint []string) map[string][]byte {
	t.Helper()
	files := tarFiles(t, img)
	require.JSONEq(t, `{"imageLayoutVersion":"1.0.0"}`, string(files["oci-layout"]))

	// OCI: index.json → manifest → config and layer (ctr import, podman).
	var idx index
	require.NoError(t, json.Unmarshal(files["index.json"], &idx))
	require.Equal(t, 2, idx.SchemaVersion)
	require.Len(t, idx.Manifests, 1)
	require.Equal(t, mediaManifest, idx.Manifests[0].MediaType)
	require.Equal(t, "docker.io/"+wantName, idx.Manifests[0].Annotations["io.containerd.image.name"])
	var man manifest
	require.NoError(t, json.Unmarshal(blob(t, files, idx.Manifests[0]), &man))
	require.Equal(t, mediaConfig, man.Config.MediaType)
	var cfg imageConfig
	require.NoError(t, json.Unmarshal(blob(t, files, man.Config), &cfg))
	require.Equal(t, wantEntrypoint, cfg.Config.Entrypoint)
	require.Equal(t, "linux", cfg.OS)
	require.Len(t, man.Layers, 1)
	require.Equal(t, mediaLayer, man.Layers[0].MediaType)
	zr, err := gzip.NewReader(bytes.NewReader(blob(t, files, man.Layers[0])))
	require.NoError(t, err)
	layerTar, err := io.ReadAll(zr)
	require.NoError(t, err)
	// The diff id is the uncompressed layer's digest: docker load and
	// containerd both check it.
	require.Equal(t, []string{digest(layerTar)}, cfg.RootFS.DiffIDs)

	// Docker: manifest.json names the same config and layer (docker load).
	var dm []dockerManifest
	require.NoError(t, json.Unmarshal(files["manifest.json"], &dm))
	require.Len(t, dm, 1)
	require.Equal(t, []string{wantName}, dm[0].RepoTags)
	require.Equal(t, "blobs/sha256/"+man.Config.Digest[len("sha256:"):], dm[0].Config)
	require.Equal(t, []string{"blobs/sha256/" + man.Layers[0].Digest[len("sha256:"):]}, dm[0].Layers)

	hdrs := readTar(t, layerTar)
	require.Equal(t, int64(0o1777), hdrs["tmp/"].Mode)
	return tarFiles(t, layerTar)
}

func TestImageArchive(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bcd")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\necho bcd\n"), 0o755))
	out := filepath.Join(dir, "image.tar")
	require.NoError(t, run([]string{"-o", out, "-name", "better-compute/bcd:latest", "-entrypoint", "/usr/local/bin/bcd",
		"-add", bin + ":/usr/local/bin/bcd"}))
	img, err := os.ReadFile(out)
	require.NoError(t, err)
	layer := checkImage(t, img, "better-compute/bcd:latest", []string{"/usr/local/bin/bcd"})
	require.Equal(t, "#!/bin/sh\necho bcd\n", string(layer["usr/local/bin/bcd"]))

	// The same inputs give the same bytes, so the digest names the content.
	again, err := Build(Spec{Name: "better-compute/bcd:latest", Entrypoint: []string{"/usr/local/bin/bcd"}, Arch: "amd64",
		Files: []file{{src: bin, dst: "/usr/local/bin/bcd", mode: 0o755}}})
	require.NoError(t, err)
	require.Equal(t, img, again)
}

// TestImageLibraries: -libs brings a dynamically linked program's loader
// and libraries from this host, at the paths its loader looks in.
func TestImageLibraries(t *testing.T) {
	t.Parallel()
	prog, err := exec.LookPath("true")
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "image.tar")
	require.NoError(t, run([]string{"-o", out, "-name", "example/true:v1", "-entrypoint", "/bin/true", "-libs", "-add", prog + ":/bin/true"}))
	img, err := os.ReadFile(out)
	require.NoError(t, err)
	layer := checkImage(t, img, "example/true:v1", []string{"/bin/true"})
	interp := ""
	for name := range layer {
		if filepath.Base(name) == "libc.so.6" {
			interp = name
		}
	}
	require.NotEmpty(t, interp, "libc.so.6 is in the image; files: %v", keys(layer))
}

func TestImageRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bcd")
	require.NoError(t, os.WriteFile(bin, []byte("x"), 0o755))
	out := filepath.Join(dir, "image.tar")
	for name, args := range map[string][]string{
		"entrypoint not added": {"-o", out, "-name", "a/b:c", "-entrypoint", "/bin/other", "-add", bin + ":/bin/bcd"},
		"no tag":               {"-o", out, "-name", "a/b", "-entrypoint", "/bin/bcd", "-add", bin + ":/bin/bcd"},
		"relative dst":         {"-o", out, "-name", "a/b:c", "-entrypoint", "/bin/bcd", "-add", bin + ":bin/bcd"},
		"added twice":          {"-o", out, "-name", "a/b:c", "-entrypoint", "/bin/bcd", "-add", bin + ":/bin/bcd", "-add", bin + ":/bin/bcd"},
	} {
		require.Error(t, run(args), name)
	}
	_, err := os.Stat(out)
	require.ErrorIs(t, err, os.ErrNotExist, "a refused build writes nothing")
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
