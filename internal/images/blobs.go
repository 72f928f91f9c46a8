package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/better-compute/better-compute/internal/store"
)

// Blobs is the content-addressed blob directory: <dir>/sha256/<hex> holds
// the bytes, <dir>/uploads holds pushes in flight. A blob is written once
// and never changed; the database's rows say which blobs are wanted.
//
// Replicas that serve pushes must share the directory (one host, or a
// shared file system): the digest lock below is per process.
type Blobs struct {
	dir      string
	mu       sync.Mutex
	locks    map[string]*digestLock
	counters []Counter
}

// Counter counts one module's rows that name a blob. The image catalog's
// is always there; another module that keeps blobs here (published
// releases) adds its own, so no module removes a blob another still names.
type Counter func(ctx context.Context, q store.Querier, sha string) (int, error)

type digestLock struct {
	mu   sync.Mutex
	refs int
}

// OpenBlobs creates the directory layout if needed.
func OpenBlobs(dir string) (*Blobs, error) {
	if dir == "" {
		return nil, errors.New("images: blob directory is required")
	}
	for _, d := range []string{filepath.Join(dir, "sha256"), filepath.Join(dir, "uploads")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("images: blob directory: %w", err)
		}
	}
	return &Blobs{dir: dir, locks: map[string]*digestLock{}, counters: []Counter{ImageCountBySHA256}}, nil
}

// AddCounter adds a module's Counter: Referenced consults it from now on.
func (b *Blobs) AddCounter(c Counter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.counters = append(b.counters, c)
}

// Referenced reports whether any module's rows name the blob. The caller
// holds the digest's Lock when it is about to Remove the blob.
func (b *Blobs) Referenced(ctx context.Context, q store.Querier, sha string) (bool, error) {
	b.mu.Lock()
	counters := append([]Counter(nil), b.counters...)
	b.mu.Unlock()
	for _, c := range counters {
		n, err := c(ctx, q, sha)
		if err != nil {
			return false, err
		}
		if n > 0 {
			return true, nil
		}
	}
	return false, nil
}

// Path is where a blob lives.
func (b *Blobs) Path(sha string) string { return filepath.Join(b.dir, "sha256", sha) }

// Open opens a blob for reading.
func (b *Blobs) Open(sha string) (*os.File, error) { return os.Open(b.Path(sha)) }

// Lock serializes placing, committing and collecting one digest, so a push
// never commits a row for a blob a concurrent delete is removing.
func (b *Blobs) Lock(sha string) (unlock func()) {
	b.mu.Lock()
	l := b.locks[sha]
	if l == nil {
		l = &digestLock{}
		b.locks[sha] = l
	}
	l.refs++
	b.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		b.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(b.locks, sha)
		}
		b.mu.Unlock()
	}
}

// Staged is an upload written to the uploads directory whose size and
// digest matched.
type Staged struct {
	path string
	SHA  string
	Size int64
}

// Discard removes a staged upload that will not be placed.
func (s *Staged) Discard() { _ = os.Remove(s.path) }

// errDigestMismatch carries what the upload turned out to be.
type errDigestMismatch struct {
	gotSize int64
	gotSHA  string
	tooLong bool
}

func (e *errDigestMismatch) Error() string {
	if e.tooLong {
		return fmt.Sprintf("the content is longer than size_bytes (more than %d bytes arrived)", e.gotSize-1)
	}
	return fmt.Sprintf("the content has %d bytes with sha256 %s", e.gotSize, e.gotSHA)
}

// Stage writes r to a new file in the uploads directory, hashing as it
// goes, and keeps it only if exactly wantSize bytes with sha256 wantSHA
// arrived. It reads at most wantSize+1 bytes. The file is synced before it
// is returned, so a placed blob survives a crash that the row does.
func (b *Blobs) Stage(r io.Reader, wantSHA string, wantSize int64) (*Staged, error) {
	f, err := os.CreateTemp(filepath.Join(b.dir, "uploads"), "push-*")
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if !keep {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, wantSize+1))
	if err != nil {
		return nil, err
	}
	got := hex.EncodeToString(h.Sum(nil))
	if n != wantSize || got != wantSHA {
		return nil, &errDigestMismatch{gotSize: n, gotSHA: got, tooLong: n > wantSize}
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	keep = true
	return &Staged{path: f.Name(), SHA: wantSHA, Size: n}, nil
}

// Place moves a staged upload into place under its digest, unless the blob
// is there already (the same bytes pushed before): then the upload is
// dropped. It reports whether it created the blob. The caller holds the
// digest's Lock.
func (b *Blobs) Place(s *Staged) (created bool, err error) {
	dst := b.Path(s.SHA)
	if _, err := os.Stat(dst); err == nil {
		s.Discard()
		return false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		s.Discard()
		return false, err
	}
	if err := os.Rename(s.path, dst); err != nil {
		s.Discard()
		return false, err
	}
	return true, nil
}

// Remove deletes a blob; a missing one is not an error. The caller holds
// the digest's Lock and has checked that no row names it.
func (b *Blobs) Remove(sha string) error {
	if err := os.Remove(b.Path(sha)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
