package dirversion

import (
	"context"
	"sync"

	"github.com/better-compute/better-compute/internal/store"
)

// Directory holds one process's cached directory entries for one database:
// every Cache's entries, all made at one version. Each control plane (each
// app on its database handle) has its own.
type Directory struct {
	db *store.DB

	mu      sync.Mutex
	version int64
	tables  map[any]any // *Cache[K, V] → map[K]V, all made at version
	stats   map[string]*Stats
}

// Stats counts a cache's answers.
type Stats struct {
	// Hits were answered from memory; Misses went to the database.
	Hits, Misses uint64
}

// New returns an empty directory cache over db.
func New(db *store.DB) *Directory {
	return &Directory{db: db, tables: map[any]any{}, stats: map[string]*Stats{}}
}

type stampKey struct{}

// stamp is the version a request read, and the directory it read it for.
type stamp struct {
	dir     *Directory
	version int64
}

// Begin reads the directory version and returns ctx carrying it: the
// caches answer for that request from entries of that version only. Call it
// once per short request, before anything reads the directory; never for a
// stream or a job, whose context outlives the version it read.
func (d *Directory) Begin(ctx context.Context) (context.Context, error) {
	var v int64
	if err := d.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		v, err = Read(ctx, tx)
		return err
	}); err != nil {
		return ctx, err
	}
	return context.WithValue(ctx, stampKey{}, stamp{dir: d, version: v}), nil
}

// Stats returns the counts of the cache named name.
func (d *Directory) Stats(name string) Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.stats[name]; s != nil {
		return *s
	}
	return Stats{}
}

// atLocked makes v the version of every entry: entries of any other version
// are dropped. Versions are not compared for order: a request that read an
// older one (it began before the write) drops the newer entries, which the
// next request reads again; a counter that went back (a restored database)
// drops everything.
func (d *Directory) atLocked(v int64) {
	if v != d.version {
		d.version = v
		clear(d.tables)
	}
}

func (d *Directory) statsLocked(name string) *Stats {
	s := d.stats[name]
	if s == nil {
		s = &Stats{}
		d.stats[name] = s
	}
	return s
}

// Cache is one kind of directory entry (API keys by hash, tenants by
// reference, …). Declare one per kind at package level; its entries live in
// each request's Directory. Values are shared between requests: never
// modify one that Get returned or that was given to Put.
type Cache[K comparable, V any] struct {
	name string
	max  int
}

// NewCache returns a kind of entry; max bounds its entries per directory
// (past it, the kind's entries are dropped and refilled).
func NewCache[K comparable, V any](name string, max int) *Cache[K, V] {
	return &Cache[K, V]{name: name, max: max}
}

// Get returns the entry for k made at the version ctx carries. ok is false
// when there is none, or ctx carries no version: the caller reads the
// database.
func (c *Cache[K, V]) Get(ctx context.Context, k K) (v V, ok bool) {
	s, stamped := ctx.Value(stampKey{}).(stamp)
	if !stamped {
		return v, false
	}
	d := s.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	d.atLocked(s.version)
	m, _ := d.tables[c].(map[K]V)
	v, ok = m[k]
	if st := d.statsLocked(c.name); ok {
		st.Hits++
	} else {
		st.Misses++
	}
	return v, ok
}

// Put keeps v for k at the version ctx carries; without one it keeps
// nothing. v must have been read from the database during this request —
// after Begin read the version — so it is at least as new as that version.
// Cache only what was found: a miss is read again each time, so nothing a
// cache holds can hide a row.
func (c *Cache[K, V]) Put(ctx context.Context, k K, v V) {
	s, stamped := ctx.Value(stampKey{}).(stamp)
	if !stamped {
		return
	}
	d := s.dir
	d.mu.Lock()
	defer d.mu.Unlock()
	d.atLocked(s.version)
	m, _ := d.tables[c].(map[K]V)
	if m == nil || len(m) >= c.max {
		m = make(map[K]V)
		d.tables[c] = m
	}
	m[k] = v
}
