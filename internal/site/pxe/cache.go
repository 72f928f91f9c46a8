package pxe

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// ErrDigestMismatch: upstream sent content whose sha256 is not the one asked
// for. Nothing is cached.
var ErrDigestMismatch = errors.New("content does not match its digest")

// ErrNotCached: a blob is not in the cache and there is no upstream.
var ErrNotCached = errors.New("blob not cached and no upstream configured")

// parseDigest accepts "sha256:<64 lower-case hex>" and returns the hex.
func parseDigest(d string) (string, error) {
	hexPart, ok := strings.CutPrefix(d, "sha256:")
	if !ok {
		return "", fmt.Errorf("digest %q: want sha256:<hex>", d)
	}
	if !validHex64(hexPart) {
		return "", fmt.Errorf("digest %q: want 64 lower-case hex digits", d)
	}
	return hexPart, nil
}

func validHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// cache keeps blobs under dir/sha256/<hex>. A blob is written to a temporary
// file while hashed and renamed into place only when its digest matches, so a
// reader never sees a partial or wrong blob.
type cache struct {
	dir      string
	upstream FetchFunc

	mu       sync.Mutex
	inflight map[string]*fetch // one upstream fetch per digest at a time
}

type fetch struct {
	done chan struct{}
	err  error
}

func newCache(dir string, upstream FetchFunc) (*cache, error) {
	for _, d := range []string{filepath.Join(dir, "sha256"), filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("cache dir: %w", err)
		}
	}
	return &cache{dir: dir, upstream: upstream, inflight: map[string]*fetch{}}, nil
}

func (c *cache) path(hexDigest string) string { return filepath.Join(c.dir, "sha256", hexDigest) }

// Open returns the cached blob, fetching it through from upstream first if
// it is missing.
func (c *cache) Open(ctx context.Context, hexDigest string) (*os.File, error) {
	if f, err := os.Open(c.path(hexDigest)); err == nil {
		return f, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := c.ensure(ctx, hexDigest); err != nil {
		return nil, err
	}
	return os.Open(c.path(hexDigest))
}

// ensure fetches the blob once however many requests wait for it.
func (c *cache) ensure(ctx context.Context, hexDigest string) error {
	if c.upstream == nil {
		return ErrNotCached
	}
	c.mu.Lock()
	f, running := c.inflight[hexDigest]
	if !running {
		f = &fetch{done: make(chan struct{})}
		c.inflight[hexDigest] = f
		go func() {
			// Detached from the first caller: its client hanging up must not
			// fail the others waiting on the same blob.
			f.err = c.fetch(context.WithoutCancel(ctx), hexDigest)
			c.mu.Lock()
			delete(c.inflight, hexDigest)
			c.mu.Unlock()
			close(f.done)
		}()
	}
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *cache) fetch(ctx context.Context, hexDigest string) error {
	if _, err := os.Stat(c.path(hexDigest)); err == nil {
		return nil
	}
	rc, err := c.upstream(ctx, "sha256:"+hexDigest)
	if err != nil {
		return fmt.Errorf("fetch sha256:%s: %w", hexDigest, err)
	}
	defer rc.Close()
	tmp, err := os.CreateTemp(filepath.Join(c.dir, "tmp"), hexDigest+".*")
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), rc); err != nil {
		return fmt.Errorf("fetch sha256:%s: %w", hexDigest, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != hexDigest {
		return fmt.Errorf("fetch sha256:%s: got sha256:%s: %w", hexDigest, got, ErrDigestMismatch)
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), c.path(hexDigest)); err != nil {
		return err
	}
	committed = true
	return nil
}

// Prefetch fetches a "sha256:<hex>" blob into the cache from upstream if it
// is not there yet, as a request for it would (one fetch per digest).
func (s *Server) Prefetch(ctx context.Context, digest string) error {
	hexDigest, err := parseDigest(digest)
	if err != nil {
		return err
	}
	if s.cache == nil {
		return errors.New("prefetch: no cache configured")
	}
	f, err := s.cache.Open(ctx, hexDigest)
	if err != nil {
		return err
	}
	return f.Close()
}
