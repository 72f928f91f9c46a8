// Command mkimage writes a container image as an OCI image-layout tar
// archive that also carries Docker's manifest.json, so `podman load`,
// `docker load` and `ctr images import` all read it: one layer of the
// files it is given, a config naming the entrypoint, no registry and no
// container daemon. `make image` builds bcd's image with it.
//
// With -libs it also adds, from the build host, the dynamic loader and the
// shared libraries an ELF file needs (transitively): bcd built with cgo
// (for NVML) needs glibc, which an image of one file would lack.
//
// It writes the same bytes for the same inputs (sorted entries, zero
// times), so the image's digest changes only when a file does.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// fileList is repeated -add SRC:DST[:MODE].
type fileList []file

type file struct {
	src, dst string
	mode     int64
}

func (l *fileList) String() string { return fmt.Sprint(*l) }

func (l *fileList) Set(v string) error {
	parts := strings.Split(v, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !path.IsAbs(parts[1]) {
		return fmt.Errorf("%q: want SRC:/ABSOLUTE/DST[:MODE]", v)
	}
	f := file{src: parts[0], dst: path.Clean(parts[1]), mode: 0o755}
	if len(parts) == 3 {
		m, err := strconv.ParseInt(parts[2], 8, 32)
		if err != nil {
			return fmt.Errorf("%q: mode %q is not octal", v, parts[2])
		}
		f.mode = m
	}
	*l = append(*l, f)
	return nil
}

func run(args []string) error {
	fset := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	var (
		files      fileList
		out        = fset.String("o", "", "the image archive to write (required)")
		name       = fset.String("name", "", "the image's name and tag, e.g. better-compute/bcd:latest (required)")
		entrypoint = fset.String("entrypoint", "", "the entrypoint, a path in the image (required)")
		libs       = fset.Bool("libs", false, "add the dynamic loader and shared libraries of every ELF file added, from this host")
		libDirs    = fset.String("lib-dirs", "/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib64:/usr/lib64:/lib:/usr/lib", "where -libs looks for libraries")
		arch       = fset.String("arch", runtime.GOARCH, "the image's architecture")
	)
	fset.Var(&files, "add", "SRC:/DST[:MODE] a file to put in the image (repeatable; mode octal, default 0755)")
	if err := fset.Parse(args); err != nil {
		return err
	}
	switch {
	case *out == "" || *name == "" || *entrypoint == "":
		return errors.New("-o, -name and -entrypoint are required")
	case len(files) == 0:
		return errors.New("no -add: an image needs at least its entrypoint")
	case !slices.ContainsFunc(files, func(f file) bool { return f.dst == *entrypoint }):
		return fmt.Errorf("-entrypoint %s is not one of the files added", *entrypoint)
	}
	if *libs {
		var err error
		if files, err = withLibraries(files, filepath.SplitList(*libDirs)); err != nil {
			return err
		}
	}
	img, err := Build(Spec{Name: *name, Entrypoint: []string{*entrypoint}, Arch: *arch, Files: files})
	if err != nil {
		return err
	}
	return os.WriteFile(*out, img, 0o644)
}

// Spec is what an image holds.
type Spec struct {
	// Name is NAME:TAG, as docker tags it (docker.io/ is implied by a
	// name without a registry).
	Name       string
	Entrypoint []string
	Arch       string
	Files      []file
}

// Media types: OCI's for the index, manifest, config and layer; Docker's
// manifest.json beside them for docker load.
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		Entrypoint []string `json:"Entrypoint"`
		Env        []string `json:"Env"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
	History []struct {
		CreatedBy string `json:"created_by"`
	} `json:"history"`
}

// dockerManifest is one entry of docker save's manifest.json.
type dockerManifest struct {
	Config   string   `json:"Config"`
	RepoTags []string `json:"RepoTags"`
	Layers   []string `json:"Layers"`
}

// Build returns the image archive.
func Build(s Spec) ([]byte, error) {
	repo, tag, err := splitName(s.Name)
	if err != nil {
		return nil, err
	}
	layerTar, err := layer(s.Files)
	if err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz) // no name, no time: the same bytes each build
	if _, err := zw.Write(layerTar); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	layerBlob := gz.Bytes()

	var cfg imageConfig
	cfg.Architecture, cfg.OS = s.Arch, "linux"
	cfg.Config.Entrypoint = s.Entrypoint
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = []string{digest(layerTar)}
	cfg.History = append(cfg.History, struct {
		CreatedBy string `json:"created_by"`
	}{"mkimage " + strings.Join(s.Entrypoint, " ")})
	cfgBlob, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	man := manifest{
		SchemaVersion: 2, MediaType: mediaManifest,
		Config: descriptor{MediaType: mediaConfig, Digest: digest(cfgBlob), Size: int64(len(cfgBlob))},
		Layers: []descriptor{{MediaType: mediaLayer, Digest: digest(layerBlob), Size: int64(len(layerBlob))}},
	}
	manBlob, err := json.Marshal(man)
	if err != nil {
		return nil, err
	}
	full := fullName(repo) + ":" + tag
	idx := index{SchemaVersion: 2, MediaType: mediaIndex, Manifests: []descriptor{{
		MediaType: mediaManifest, Digest: digest(manBlob), Size: int64(len(manBlob)),
		Platform: &platform{Architecture: s.Arch, OS: "linux"},
		// What docker save writes: containerd's import takes the full
		// name, the OCI annotation the tag.
		Annotations: map[string]string{"io.containerd.image.name": full, "org.opencontainers.image.ref.name": tag},
	}}}
	idxBlob, err := json.Marshal(idx)
	if err != nil {
		return nil, err
	}
	dm, err := json.Marshal([]dockerManifest{{Config: blobPath(cfgBlob), RepoTags: []string{repo + ":" + tag}, Layers: []string{blobPath(layerBlob)}}})
	if err != nil {
		return nil, err
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", idxBlob},
		{"manifest.json", dm},
	}
	// Blobs in a fixed order: config, layer, manifest.
	for _, b := range [][]byte{cfgBlob, layerBlob, manBlob} {
		entries = append(entries, struct {
			name string
			data []byte
		}{blobPath(b), b})
	}
	for _, e := range entries {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// layer is the uncompressed tar of files, with their parent directories
// and /tmp, sorted by path.
func layer(files []file) ([]byte, error) {
	byDst := map[string]file{}
	dirs := map[string]bool{"tmp": true, "etc": true}
	for _, f := range files {
		rel := strings.TrimPrefix(f.dst, "/")
		if _, dup := byDst[rel]; dup {
			return nil, fmt.Errorf("%s is added twice", f.dst)
		}
		byDst[rel] = f
		for d := path.Dir(rel); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for d := range dirs {
			if !yield(d + "/") {
				return
			}
		}
		for n := range byDst {
			if !yield(n) {
				return
			}
		}
	})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		h := &tar.Header{Name: n, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if strings.HasSuffix(n, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
			if n == "tmp/" {
				h.Mode = 0o1777
			}
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			continue
		}
		f := byDst[n]
		data, err := os.ReadFile(f.src)
		if err != nil {
			return nil, err
		}
		h.Typeflag, h.Mode, h.Size = tar.TypeReg, f.mode, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// withLibraries adds to files the interpreter and the shared libraries
// (transitively) of each ELF file among them, each at the path the loader
// will look for it by, read from the first of dirs that has it.
func withLibraries(files []file, dirs []string) ([]file, error) {
	have := map[string]bool{}
	for _, f := range files {
		have[f.dst] = true
	}
	queue := slices.Clone(files)
	for len(queue) > 0 {
		f := queue[0]
		queue = queue[1:]
		e, err := elf.Open(f.src)
		if err != nil {
			continue // not an ELF file: nothing to add
		}
		needed, err := e.ImportedLibraries()
		interp := interpreter(e)
		_ = e.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.src, err)
		}
		var add []file
		if interp != "" && !have[interp] {
			add = append(add, file{src: interp, dst: interp, mode: 0o755})
		}
		for _, lib := range needed {
			src, err := findLib(lib, dirs)
			if err != nil {
				return nil, fmt.Errorf("%s needs %s: %w", f.src, lib, err)
			}
			// At the directory it was found in, under its SONAME.
			dst := path.Join(filepath.ToSlash(filepath.Dir(src)), lib)
			if !have[dst] {
				add = append(add, file{src: src, dst: dst, mode: 0o755})
			}
		}
		for _, a := range add {
			have[a.dst] = true
			files = append(files, a)
			queue = append(queue, a)
		}
	}
	return files, nil
}

func interpreter(e *elf.File) string {
	for _, p := range e.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err == nil {
				return strings.TrimRight(string(b), "\x00")
			}
		}
	}
	return ""
}

func findLib(name string, dirs []string) (string, error) {
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("not found in %s", strings.Join(dirs, ":"))
}

// splitName splits NAME:TAG; the tag is required, so nobody loads an
// image they did not mean to name "latest".
func splitName(s string) (repo, tag string, err error) {
	i := strings.LastIndex(s, ":")
	if i <= 0 || strings.Contains(s[i:], "/") || i == len(s)-1 {
		return "", "", fmt.Errorf("-name %q: want NAME:TAG", s)
	}
	return s[:i], s[i+1:], nil
}

// fullName is the name with docker's implied registry, as containerd
// stores it.
func fullName(repo string) string {
	first, _, ok := strings.Cut(repo, "/")
	if ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return repo
	}
	if !ok {
		return "docker.io/library/" + repo
	}
	return "docker.io/" + repo
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(b []byte) string {
	sum := sha256.Sum256(b)
	return "blobs/sha256/" + hex.EncodeToString(sum[:])
}
