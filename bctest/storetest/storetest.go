// Package storetest is the store conformance suite: one suite that every
// backend (SQLite, PostgreSQL) must pass, covering migrations, the shared
// clock, time handling, error classification, transactions and River's
// transactional enqueue.
//
// It must never be imported outside tests, and must never skip a check on
// one backend that it runs on another.
package storetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/jobs"
	"github.com/better-compute/better-compute/internal/store"
)

// advancer is the part of bctest.SimClock the suite needs.
type advancer interface {
	Now() time.Time
	Advance(d time.Duration) time.Time
}

// Run runs the suite. open must return a fresh database, with the store core
// migrated, whose clock can Advance (a *bctest.SimClock), closed at test
// cleanup; bctest.NewDB does all of that.
func Run(t *testing.T, open func(t *testing.T) *store.DB) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s *suite)
	}{
		{"MigrationsApplyOnce", testMigrationsApplyOnce},
		{"MigrationsTooNew", testMigrationsTooNew},
		{"MigrationsBadInput", testMigrationsBadInput},
		{"ComputeNowFollowsClock", testComputeNowFollowsClock},
		{"TimeRoundTrip", testTimeRoundTrip},
		{"TimeOrdering", testTimeOrdering},
		{"BoolRoundTrip", testBoolRoundTrip},
		{"UniqueViolation", testUniqueViolation},
		{"ConstraintViolations", testConstraintViolations},
		{"NotFound", testNotFound},
		{"RollbackOnError", testRollbackOnError},
		{"RollbackOnPanic", testRollbackOnPanic},
		{"AfterCommit", testAfterCommit},
		{"RetryOnSerialization", testRetryOnSerialization},
		{"ConcurrentWriters", testConcurrentWriters},
		{"ReadSeesCommitted", testReadSeesCommitted},
		{"JobsInsertTx", testJobsInsertTx},
		{"JobsUniqueCoalesce", testJobsUniqueCoalesce},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := open(t)
			clk, ok := db.Clock().(advancer)
			require.True(t, ok, "storetest: open must give the DB a clock that can Advance, got %T", db.Clock())
			tt.fn(t, &suite{db: db, clk: clk})
		})
	}
}

type suite struct {
	db  *store.DB
	clk advancer
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// ddl runs the dialect's version of a schema statement.
func (s *suite) ddl(t *testing.T, sqlite, postgres string) {
	t.Helper()
	q := sqlite
	if s.db.Dialect() == store.Postgres {
		q = postgres
	}
	s.exec(t, q)
}

func (s *suite) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	err := s.db.Write(ctxT(t), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, q, args...)
		return err
	})
	require.NoError(t, err, q)
}

func (s *suite) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	err := s.db.Read(ctxT(t), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, q, args...).Scan(&n)
	})
	require.NoError(t, err, q)
	return n
}

func migrationFS(files map[string]string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for name, body := range files {
		fsys["sqlite/"+name] = &fstest.MapFile{Data: []byte(body)}
		fsys["postgres/"+name] = &fstest.MapFile{Data: []byte(body)}
	}
	return fsys
}

func testMigrationsApplyOnce(t *testing.T, s *suite) {
	ctx := ctxT(t)
	set := store.Migrations{Module: "mtest", FS: migrationFS(map[string]string{
		"0001_create.sql": `CREATE TABLE mt_a (id INTEGER PRIMARY KEY, v TEXT NOT NULL);`,
		// Two statements in one file; the INSERT shows the file ran once.
		"0002_seed.sql": `CREATE TABLE mt_b (id INTEGER PRIMARY KEY);
INSERT INTO mt_a (id, v) VALUES (1, 'seed');`,
	})}
	require.NoError(t, s.db.Migrate(ctx, set))
	require.NoError(t, s.db.Migrate(ctx, set), "second Migrate must be a no-op")
	assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM mt_a`))
	assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM mt_b`))
	assert.Equal(t, 2, s.count(t, `SELECT count(*) FROM schema_migrations WHERE module = $1`, "mtest"))
	assert.Equal(t, 2, s.count(t, `SELECT count(*) FROM schema_migrations WHERE module = $1`, store.CoreModule))

	var name string
	var applied time.Time
	err := s.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT name, applied_at FROM schema_migrations WHERE module = $1 AND version = $2`,
			"mtest", 2).Scan(&name, &applied)
	})
	require.NoError(t, err)
	assert.Equal(t, "seed", name)
	assert.True(t, applied.Equal(s.clk.Now()), "applied_at %v, clock %v", applied, s.clk.Now())

	// A later binary adds a version: only it is applied.
	set.FS.(fstest.MapFS)["sqlite/0003_more.sql"] = &fstest.MapFile{Data: []byte(`INSERT INTO mt_b (id) VALUES (7);`)}
	set.FS.(fstest.MapFS)["postgres/0003_more.sql"] = &fstest.MapFile{Data: []byte(`INSERT INTO mt_b (id) VALUES (7);`)}
	require.NoError(t, s.db.Migrate(ctx, set))
	assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM mt_a`))
	assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM mt_b`))

	// A failing file leaves neither its changes nor its version behind.
	bad := store.Migrations{Module: "mbad", FS: migrationFS(map[string]string{
		"0001_half.sql": `CREATE TABLE mbad_t (id INTEGER PRIMARY KEY);
INSERT INTO no_such_table (id) VALUES (1);`,
	})}
	require.Error(t, s.db.Migrate(ctx, bad))
	assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM schema_migrations WHERE module = $1`, "mbad"))
	require.NoError(t, s.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE mbad_t (id INTEGER PRIMARY KEY)`)
		return err
	}), "the failed migration's table must have been rolled back")
}

func testMigrationsTooNew(t *testing.T, s *suite) {
	ctx := ctxT(t)
	v2 := store.Migrations{Module: "mnew", FS: migrationFS(map[string]string{
		"0001_a.sql": `CREATE TABLE mn_a (id INTEGER PRIMARY KEY);`,
		"0002_b.sql": `CREATE TABLE mn_b (id INTEGER PRIMARY KEY);`,
	})}
	require.NoError(t, s.db.Migrate(ctx, v2))
	v1 := store.Migrations{Module: "mnew", FS: migrationFS(map[string]string{
		"0001_a.sql": `CREATE TABLE mn_a (id INTEGER PRIMARY KEY);`,
	})}
	other := store.Migrations{Module: "mother", FS: migrationFS(map[string]string{
		"0001_a.sql": `CREATE TABLE mo_a (id INTEGER PRIMARY KEY);`,
	})}
	err := s.db.Migrate(ctx, other, v1)
	require.ErrorIs(t, err, store.ErrSchemaTooNew)
	msg := err.Error()
	assert.Contains(t, msg, `"mnew"`)
	assert.Contains(t, msg, "version 2")
	assert.Contains(t, msg, "version 1")
	assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM schema_migrations WHERE module = $1`, "mother"),
		"refusal must come before anything is applied")
}

func testMigrationsBadInput(t *testing.T, s *suite) {
	ctx := ctxT(t)
	tests := []struct {
		name string
		set  store.Migrations
	}{
		{"no module", store.Migrations{FS: migrationFS(nil)}},
		{"no fs", store.Migrations{Module: "x"}},
		{"bad name", store.Migrations{Module: "x", FS: migrationFS(map[string]string{"first.sql": "SELECT 1;"})}},
		{"duplicate version", store.Migrations{Module: "x", FS: migrationFS(map[string]string{
			"0001_a.sql": "SELECT 1;", "1_b.sql": "SELECT 1;",
		})}},
		{"missing dialect", store.Migrations{Module: "x", FS: fstest.MapFS{
			"other/0001_a.sql": &fstest.MapFile{Data: []byte("SELECT 1;")},
		}}},
		{"core given again", store.Migrations{Module: store.CoreModule, FS: migrationFS(nil)}},
	}
	for _, tt := range tests {
		assert.Error(t, s.db.Migrate(ctx, tt.set), tt.name)
	}
}

func testComputeNowFollowsClock(t *testing.T, s *suite) {
	ctx := ctxT(t)
	s.ddl(t,
		`CREATE TABLE cn_ev (id INTEGER PRIMARY KEY, at TIMESTAMP NOT NULL)`,
		`CREATE TABLE cn_ev (id INTEGER PRIMARY KEY, at TIMESTAMPTZ NOT NULL)`)

	t1 := s.clk.Now()
	s.exec(t, `INSERT INTO cn_ev (id, at) VALUES (1, compute_now())`)
	t2 := s.clk.Advance(90*time.Minute + 1500*time.Microsecond)
	s.exec(t, `INSERT INTO cn_ev (id, at) VALUES (2, compute_now())`)

	got := map[int]time.Time{}
	err := s.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, at FROM cn_ev ORDER BY id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id int
			var at time.Time
			if err := rows.Scan(&id, &at); err != nil {
				return err
			}
			got[id] = at
		}
		return rows.Err()
	})
	require.NoError(t, err)
	assert.True(t, got[1].Equal(t1), "row 1 at %v, want %v", got[1], t1)
	assert.True(t, got[2].Equal(t2), "row 2 at %v, want %v", got[2], t2)

	// Read transactions see the same clock, and SQL compares against it.
	var now time.Time
	var past int
	s.clk.Advance(time.Hour)
	err = s.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT compute_now()`).Scan(&now); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM cn_ev WHERE at < compute_now()`).Scan(&past)
	})
	require.NoError(t, err)
	assert.True(t, now.Equal(s.clk.Now()), "compute_now() %v, clock %v", now, s.clk.Now())
	assert.Equal(t, 2, past)
}

func testTimeRoundTrip(t *testing.T, s *suite) {
	ctx := ctxT(t)
	s.ddl(t,
		`CREATE TABLE tr (id INTEGER PRIMARY KEY, a TIMESTAMP NOT NULL, b TEXT, c TIMESTAMP)`,
		`CREATE TABLE tr (id INTEGER PRIMARY KEY, a TIMESTAMPTZ NOT NULL, b TIMESTAMPTZ, c TIMESTAMPTZ)`)
	// A non-UTC zone and microseconds: both must survive; nanoseconds are
	// beyond both databases' precision and are not promised.
	want := time.Date(2026, 3, 4, 5, 6, 7, 123456000, time.FixedZone("plus1", 3600))
	wantB := want.Add(-48 * time.Hour)
	err := s.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO tr (id, a, b, c) VALUES ($1, $2, $3, $4)`, 1, want, &wantB, (*time.Time)(nil)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO tr (id, a, b, c) VALUES ($1, $2, $3, $4)`, 2, want, sql.NullTime{}, sql.NullTime{Time: want, Valid: true})
		return err
	})
	require.NoError(t, err)

	var a time.Time
	var b *time.Time
	var c sql.NullTime
	err = s.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT a, b, c FROM tr WHERE id = $1`, 1).Scan(&a, &b, &c)
	})
	require.NoError(t, err)
	assert.True(t, a.Equal(want), "a = %v, want %v", a, want)
	require.NotNil(t, b)
	assert.True(t, b.Equal(wantB), "b = %v, want %v", *b, wantB)
	assert.False(t, c.Valid)

	err = s.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT b, c FROM tr WHERE id = $1`, 2).Scan(&b, &c)
	})
	require.NoError(t, err)
	assert.Nil(t, b)
	require.True(t, c.Valid)
	assert.True(t, c.Time.Equal(want))

	// Equality on a bound time finds the row.
	assert.Equal(t, 2, s.count(t, `SELECT count(*) FROM tr WHERE a = $1`, want))
}

func testTimeOrdering(t *testing.T, s *suite) {
	ctx := ctxT(t)
	s.ddl(t,
		`CREATE TABLE tord (id INTEGER PRIMARY KEY, at TIMESTAMP NOT NULL)`,
		`CREATE TABLE tord (id INTEGER PRIMARY KEY, at TIMESTAMPTZ NOT NULL)`)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// Inserted out of order, spanning digits that naive text would misorder
	// (9 vs 10 seconds, sub-second, a zone that shifts the day).
	times := []time.Time{
		base.Add(10 * time.Second),
		base.Add(9 * time.Second),
		base.Add(9*time.Second + 999999*time.Microsecond),
		base.Add(-time.Microsecond),
		base.In(time.FixedZone("minus5", -5*3600)).Add(time.Hour),
		base.AddDate(1, 0, 0),
	}
	err := s.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		for i, at := range times {
			if _, err := tx.Exec(ctx, `INSERT INTO tord (id, at) VALUES ($1, $2)`, i, at); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)

	var got []int
	err = s.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id FROM tord ORDER BY at`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id int
			if err := rows.Scan(&id); err != nil {
				return err
			}
			got = append(got, id)
		}
		return rows.Err()
	})
	require.NoError(t, err)
	assert.Equal(t, []int{3, 1, 2, 0, 4, 5}, got)
	assert.Equal(t, 4, s.count(t, `SELECT count(*) FROM tord WHERE at > $1`, base.Add(9*time.Second+500*time.Millisecond)))
}

func testBoolRoundTrip(t *testing.T, s *suite) {
	s.ddl(t,
		`CREATE TABLE bl (id INTEGER PRIMARY KEY, on_ INTEGER NOT NULL)`,
		`CREATE TABLE bl (id INTEGER PRIMARY KEY, on_ BOOLEAN NOT NULL)`)
	s.exec(t, `INSERT INTO bl (id, on_) VALUES (1, $1), (2, $2)`, true, false)
	var a, b bool
	err := s.db.Read(ctxT(t), func(ctx context.Context, tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT on_ FROM bl WHERE id = 1`).Scan(&a); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT on_ FROM bl WHERE id = 2`).Scan(&b)
	})
	require.NoError(t, err)
	assert.True(t, a)
	assert.False(t, b)
	assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM bl WHERE on_ = $1`, true))
}

func testUniqueViolation(t *testing.T, s *suite) {
	s.exec(t, `CREATE TABLE uq (id INTEGER PRIMARY KEY, name TEXT NOT NULL)`)
	s.exec(t, `CREATE UNIQUE INDEX uq_name ON uq (name)`)
	s.exec(t, `INSERT INTO uq (id, name) VALUES (1, 'a')`)

	wantConstraint := map[store.Dialect]string{store.SQLite: "uq.name", store.Postgres: "uq_name"}[s.db.Dialect()]
	err := s.db.Write(ctxT(t), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO uq (id, name) VALUES (2, 'a')`)
		return err
	})
	require.ErrorIs(t, err, store.ErrUnique)
	assert.Equal(t, wantConstraint, store.ConstraintOf(err))
	assert.Equal(t, strings.ToLower(err.Error()[:1]), err.Error()[:1], "errors are lower-case")

	err = s.db.Write(ctxT(t), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO uq (id, name) VALUES (1, 'b')`)
		return err
	})
	require.ErrorIs(t, err, store.ErrUnique, "primary key")
	assert.NotErrorIs(t, err, store.ErrConstraint)
}

func testConstraintViolations(t *testing.T, s *suite) {
	s.exec(t, `CREATE TABLE cv_parent (id INTEGER PRIMARY KEY)`)
	s.exec(t, `CREATE TABLE cv (id INTEGER PRIMARY KEY, n INTEGER NOT NULL CONSTRAINT cv_n_nonneg CHECK (n >= 0),
		parent_id INTEGER REFERENCES cv_parent (id))`)
	s.ddl(t,
		`CREATE TRIGGER cv_n_max BEFORE INSERT ON cv WHEN NEW.n > 100 BEGIN SELECT RAISE(ABORT, 'cv n too big'); END`,
		`CREATE FUNCTION cv_n_max() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.n > 100 THEN RAISE EXCEPTION 'cv n too big'; END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER cv_n_max BEFORE INSERT ON cv FOR EACH ROW EXECUTE FUNCTION cv_n_max();`)

	tests := []struct {
		name           string
		query          string
		wantConstraint string
	}{
		{"check", `INSERT INTO cv (id, n) VALUES (1, -1)`, "cv_n_nonneg"},
		{"trigger", `INSERT INTO cv (id, n) VALUES (2, 101)`, ""},
		{"foreign key", `INSERT INTO cv (id, n, parent_id) VALUES (3, 1, 42)`, ""},
		{"not null", `INSERT INTO cv (id) VALUES (4)`, ""},
	}
	for _, tt := range tests {
		err := s.db.Write(ctxT(t), func(ctx context.Context, tx store.Tx) error {
			_, err := tx.Exec(ctx, tt.query)
			return err
		})
		require.ErrorIs(t, err, store.ErrConstraint, tt.name)
		assert.NotErrorIs(t, err, store.ErrUnique, tt.name)
		if tt.wantConstraint != "" {
			assert.Equal(t, tt.wantConstraint, store.ConstraintOf(err), tt.name)
		}
	}
	assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM cv`))
}

func testNotFound(t *testing.T, s *suite) {
	s.exec(t, `CREATE TABLE nf (id INTEGER PRIMARY KEY)`)
	var id int
	err := s.db.Read(ctxT(t), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT id FROM nf WHERE id = $1`, 1).Scan(&id)
	})
	require.ErrorIs(t, err, store.ErrNotFound)
}

var errBoom = errors.New("boom")

func testRollbackOnError(t *testing.T, s *suite) {
	s.exec(t, `CREATE TABLE rb (id INTEGER PRIMARY KEY)`)
	err := s.db.Write(ctxT(t), func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO rb (id) VALUES (1)`); err != nil {
			return err
		}
		return errBoom
	})
	require.ErrorIs(t, err, errBoom, "fn's error comes back unchanged")
	assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM rb`))
}

func testRollbackOnPanic(t *testing.T, s *suite) {
	s.exec(t, `CREATE TABLE rp (id INTEGER PRIMARY KEY)`)
	func() {
		defer func() { assert.Equal(t, "boom", recover()) }()
		_ = s.db.Write(ctxT(t), func(ctx context.Context, tx store.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO rp (id) VALUES (1)`); err != nil {
				return err
			}
			panic("boom")
		})
	}()
	assert.Equal(t, 0, s.count(t, `SELECT count(*) FROM rp`))
	// The writer must have been released: a new write goes through.
	s.exec(t, `INSERT INTO rp (id) VALUES (2)`)
	assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM rp`))
}

func testAfterCommit(t *testing.T, s *suite) {
	s.exec(t, `CREATE TABLE ac (id INTEGER PRIMARY KEY)`)
	var ran []string
	seen := -1
	err := s.db.Write(ctxT(t), func(ctx context.Context, tx store.Tx) error {
		tx.AfterCommit(func() {
			ran = append(ran, "first")
			// By the time it runs, the row is visible to others.
			seen = s.count(t, `SELECT count(*) FROM ac`)
		})
		tx.AfterCommit(func() { ran = append(ran, "second") })
		_, err := tx.Exec(ctx, `INSERT INTO ac (id) VALUES (1)`)
		require.Empty(t, ran, "nothing runs before commit")
		return err
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"first", "second"}, ran)
	assert.Equal(t, 1, seen)

	ran = nil
	err = s.db.Write(ctxT(t), func(ctx context.Context, tx store.Tx) error {
		tx.AfterCommit(func() { ran = append(ran, "rolled back") })
		return errBoom
	})
	require.ErrorIs(t, err, errBoom)
	assert.Empty(t, ran)
}

func testRetryOnSerialization(t *testing.T, s *suite) {
	s.exec(t, `CREATE TABLE rs (id INTEGER PRIMARY KEY)`)
	attempts := 0
	var ran []int
	err := s.db.Write(ctxT(t), func(ctx context.Context, tx store.Tx) error {
		attempts++
		a := attempts
		tx.AfterCommit(func() { ran = append(ran, a) })
		if _, err := tx.Exec(ctx, `INSERT INTO rs (id) VALUES ($1)`, attempts); err != nil {
			return err
		}
		if attempts == 1 {
			return fmt.Errorf("conflict: %w", &store.Error{Kind: store.ErrSerialization})
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, 2, attempts)
	assert.Equal(t, []int{2}, ran, "only the committed attempt's callbacks run")
	assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM rs`))

	attempts = 0
	err = s.db.Write(ctxT(t), func(ctx context.Context, tx store.Tx) error {
		attempts++
		return &store.Error{Kind: store.ErrSerialization}
	})
	require.ErrorIs(t, err, store.ErrSerialization)
	assert.Equal(t, 4, attempts, "one try and three retries")
}

func testConcurrentWriters(t *testing.T, s *suite) {
	s.exec(t, `CREATE TABLE cw (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)`)
	s.exec(t, `INSERT INTO cw (id, n) VALUES (1, 0)`)
	const writers, increments = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, writers*increments)
	for range writers {
		wg.Go(func() {
			for range increments {
				errs <- s.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
					_, err := tx.Exec(ctx, `UPDATE cw SET n = n + 1 WHERE id = 1`)
					return err
				})
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, writers*increments, s.count(t, `SELECT n FROM cw WHERE id = 1`))
}

func testReadSeesCommitted(t *testing.T, s *suite) {
	ctx := ctxT(t)
	s.exec(t, `CREATE TABLE rsc (id INTEGER PRIMARY KEY)`)
	for i := range 3 {
		s.exec(t, `INSERT INTO rsc (id) VALUES ($1)`, i)
		assert.Equal(t, i+1, s.count(t, `SELECT count(*) FROM rsc`))
	}
	err := s.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		assert.Equal(t, s.db.Dialect(), tx.Dialect())
		_, err := tx.Exec(ctx, `INSERT INTO rsc (id) VALUES (99)`)
		return err
	})
	require.Error(t, err, "a read transaction must refuse writes")
	assert.Equal(t, 3, s.count(t, `SELECT count(*) FROM rsc`))
}

// noopArgs is the job the suite enqueues.
type noopArgs struct {
	Key string `json:"key"`
}

func (noopArgs) Kind() string { return "storetest_noop" }

func newInsertOnly(t *testing.T, s *suite) *jobs.Runtime {
	t.Helper()
	require.NoError(t, jobs.Migrations(ctxT(t), s.db))
	require.NoError(t, jobs.Migrations(ctxT(t), s.db), "river migrations are idempotent")
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[noopArgs]) error { return nil }))
	rt, err := jobs.New(s.db, workers, nil, jobs.Config{})
	require.NoError(t, err)
	return rt
}

func testJobsInsertTx(t *testing.T, s *suite) {
	ctx := ctxT(t)
	rt := newInsertOnly(t, s)
	s.exec(t, `CREATE TABLE ji (id INTEGER PRIMARY KEY)`)
	jobCount := func() int {
		return s.count(t, `SELECT count(*) FROM river_job WHERE kind = $1`, noopArgs{}.Kind())
	}

	err := s.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO ji (id) VALUES (1)`); err != nil {
			return err
		}
		return rt.InsertTx(ctx, tx, noopArgs{Key: "committed"}, nil)
	})
	require.NoError(t, err)
	assert.Equal(t, 1, jobCount())
	assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM ji`))

	err = s.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO ji (id) VALUES (2)`); err != nil {
			return err
		}
		if err := rt.InsertTx(ctx, tx, noopArgs{Key: "rolled back"}, nil); err != nil {
			return err
		}
		return errBoom
	})
	require.ErrorIs(t, err, errBoom)
	assert.Equal(t, 1, jobCount(), "the job rolls back with the caller's rows")
	assert.Equal(t, 1, s.count(t, `SELECT count(*) FROM ji`))
}

func testJobsUniqueCoalesce(t *testing.T, s *suite) {
	ctx := ctxT(t)
	rt := newInsertOnly(t, s)
	unique := &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
	var skipped []bool
	for _, key := range []string{"a", "a", "b", "a"} {
		err := s.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			res, err := rt.InsertTxResult(ctx, tx, noopArgs{Key: key}, unique)
			if err != nil {
				return err
			}
			skipped = append(skipped, res.UniqueSkippedAsDuplicate)
			return nil
		})
		require.NoError(t, err)
	}
	assert.Equal(t, []bool{false, true, false, true}, skipped)
	assert.Equal(t, 2, s.count(t, `SELECT count(*) FROM river_job WHERE kind = $1`, noopArgs{}.Kind()))
}
