package hypervisor

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/internal/agent/runtime"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// Files of one guest image, as tools/guest-image/build.sh writes them.
const (
	imageDisk    = "rootfs.qcow2"
	imageKernel  = "vmlinuz"
	imageInitrd  = "initrd.img"
	imageCmdline = "cmdline"
	imageSums    = "SHA256SUMS"
)

var (
	imageNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	sha256RE    = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// images resolves vmcmd.Image in the guest image directory.
type images struct {
	dir string

	mu sync.Mutex
	// verified remembers disks whose content was hashed, by size and
	// modification time, so a digest is computed once per image file, not
	// once per create.
	verified map[string]fileStamp
}

type fileStamp struct {
	size   int64
	mtime  time.Time
	sha256 string
}

// resolve finds the image's files; a digest in img must be the disk's, by
// the image's SHA256SUMS and by the disk's content.
func (im *images) resolve(img vmcmd.Image) (runtime.Image, error) {
	if !imageNameRE.MatchString(img.Name) || strings.Contains(img.Name, "..") {
		return runtime.Image{}, invalid("image.name", "%q is not an image name (1-63 of a-z, 0-9, '.', '_' and '-')", img.Name)
	}
	if img.Sha256 != "" && !sha256RE.MatchString(img.Sha256) {
		return runtime.Image{}, invalid("image.sha256", "%q is not a hex SHA-256", img.Sha256)
	}
	dir := filepath.Join(im.dir, img.Name)
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		return runtime.Image{}, failf(vmcmd.FailImage, "guest image %q is not on this host (no directory %s)", img.Name, dir)
	}
	// The real directory: an image name that is a symlink is resolved
	// once, so the runtime's spec names the files themselves.
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		return runtime.Image{}, failf(vmcmd.FailImage, "guest image %q: %v", img.Name, err)
	}
	out := runtime.Image{Disk: filepath.Join(dir, imageDisk), Kernel: filepath.Join(dir, imageKernel)}
	for _, f := range []string{out.Disk, out.Kernel} {
		if st, err := os.Stat(f); err != nil || !st.Mode().IsRegular() {
			return runtime.Image{}, failf(vmcmd.FailImage, "guest image %q is incomplete: no %s", img.Name, filepath.Base(f))
		}
	}
	if st, err := os.Stat(filepath.Join(dir, imageInitrd)); err == nil && st.Mode().IsRegular() {
		out.Initrd = filepath.Join(dir, imageInitrd)
	}
	if b, err := os.ReadFile(filepath.Join(dir, imageCmdline)); err == nil {
		out.Cmdline = strings.TrimSpace(string(b))
	}
	if img.Sha256 == "" {
		return out, nil
	}
	listed, err := listedSum(filepath.Join(dir, imageSums), imageDisk)
	if err != nil {
		return runtime.Image{}, failf(vmcmd.FailImage, "guest image %q: %v", img.Name, err)
	}
	if listed != img.Sha256 {
		return runtime.Image{}, failf(vmcmd.FailImage, "guest image %q on this host is sha256:%s, not sha256:%s", img.Name, listed, img.Sha256)
	}
	actual, err := im.digest(out.Disk)
	if err != nil {
		return runtime.Image{}, failf(vmcmd.FailImage, "guest image %q: %v", img.Name, err)
	}
	if actual != listed {
		return runtime.Image{}, failf(vmcmd.FailImage, "guest image %q: %s is sha256:%s, its SHA256SUMS says sha256:%s (corrupt or replaced)",
			img.Name, imageDisk, actual, listed)
	}
	return out, nil
}

// listedSum reads name's digest from a sha256sum(1) file.
func listedSum(path, name string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("no %s to check the digest against: %w", filepath.Base(path), err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, file, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if ok && strings.TrimLeft(strings.TrimSpace(file), "*") == name && sha256RE.MatchString(sum) {
			return sum, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return "", fmt.Errorf("%s lists no %s", filepath.Base(path), name)
}

func (im *images) digest(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	if v, ok := im.verified[path]; ok && v.size == st.Size() && v.mtime.Equal(st.ModTime()) {
		return v.sha256, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	im.verified[path] = fileStamp{size: st.Size(), mtime: st.ModTime(), sha256: sum}
	return sum, nil
}
