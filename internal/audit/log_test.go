package audit_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/audit"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
)

type fixture struct {
	db       *store.DB
	clk      *bctest.SimClock
	log      *audit.Log
	verifier string
	sealer   *pki.Sealer
	n        int
}

func setup(t testing.TB, cfg audit.LogConfig) *fixture {
	t.Helper()
	clk := bctest.NewSimClock(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
	db := bctest.NewDB(t, clk)
	ctx := context.Background()
	require.NoError(t, db.Migrate(ctx, audit.Migrations()))
	secret, err := pki.GenerateSecret()
	require.NoError(t, err)
	sealer, err := pki.NewSealer(secret)
	require.NoError(t, err)
	signer, verifier, created, err := audit.LoadOrInitSigner(ctx, db, sealer, "test.example/audit")
	require.NoError(t, err)
	require.True(t, created)
	cfg.DB, cfg.Signer, cfg.Verifier = db, signer, verifier
	l, err := audit.NewLog(cfg)
	require.NoError(t, err)
	return &fixture{db: db, clk: clk, log: l, verifier: verifier, sealer: sealer}
}

// entry returns a new audit row; ids sort by n.
func (f *fixture) entry(tenant string) envelope.AuditEntry {
	f.n++
	return envelope.AuditEntry{ID: fmt.Sprintf("aud_%06d", f.n), Time: f.clk.Now().Add(time.Duration(f.n) * 1500 * time.Nanosecond),
		TenantID: tenant, PrincipalID: "key_1", PrincipalKind: "service", Action: "projects.create", ResourceType: "Project",
		ResourceID: fmt.Sprintf("prj_%d", f.n), Decision: "allow", RequestID: "req", Result: "ok", Detail: "détail ✓"}
}

func (f *fixture) insert(t testing.TB, es ...envelope.AuditEntry) {
	t.Helper()
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return audit.Insert(ctx, tx, es...)
	}))
}

func (f *fixture) exec(t testing.TB, q string, args ...any) {
	t.Helper()
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, q, args...)
		return err
	}))
}

func (f *fixture) prove(t testing.TB, id string, size uint64) audit.InclusionProof {
	t.Helper()
	var p audit.InclusionProof
	require.NoError(t, f.db.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		p, err = f.log.ProveInclusion(ctx, tx, id, size)
		return err
	}))
	return p
}

// offline round-trips a bundle through its JSON, as a third party gets it.
func offline(t testing.TB, b audit.Bundle, key string) (audit.Verified, error) {
	t.Helper()
	raw, err := json.Marshal(b)
	require.NoError(t, err)
	parsed, err := audit.ParseBundle(raw)
	require.NoError(t, err)
	return audit.VerifyBundle(parsed, key)
}

// TestLeafEncodingIsCanonical: a row encodes to one byte string, which
// decodes back to the row; any other bytes are refused.
func TestLeafEncodingIsCanonical(t *testing.T) {
	t.Parallel()
	e := envelope.AuditEntry{ID: "aud_1", Time: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.FixedZone("x", 3600)), TenantID: "tnt_1",
		Action: "a", Decision: "allow", Detail: "d"}
	b := audit.EncodeLeaf(e)
	require.Equal(t, byte(1), b[0])
	got, err := audit.DecodeLeaf(b)
	require.NoError(t, err)
	require.Equal(t, "2026-01-02T02:04:05.000006Z", got.Time.Format("2006-01-02T15:04:05.000000Z"))
	require.Equal(t, b, audit.EncodeLeaf(got))
	for name, bad := range map[string][]byte{
		"empty": {}, "version": append([]byte{2}, b[1:]...), "trailing": append(b[:len(b):len(b)], 0), "truncated": b[:len(b)-1],
	} {
		_, err := audit.DecodeLeaf(bad)
		require.ErrorIs(t, err, audit.ErrLeaf, name)
	}
}

// TestSequenceProveAndVerifyOffline: rows committed out of id order all
// become leaves; every entry's proof and a consistency proof between two
// checkpoints verify offline with only the public key.
func TestSequenceProveAndVerifyOffline(t *testing.T) {
	t.Parallel()
	f := setup(t, audit.LogConfig{CheckpointEvery: 10})
	ctx := t.Context()
	a, b := f.entry("tnt_a"), f.entry("tnt_b")
	f.insert(t, b) // the higher id commits first
	res, err := f.log.Sequence(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Sequenced)
	require.Len(t, res.Checkpoints, 1, "the first checkpoint is due at once")
	first := res.Checkpoints[0]
	f.insert(t, a)
	var all []envelope.AuditEntry
	for range 6 {
		es := []envelope.AuditEntry{f.entry("tnt_a"), f.entry("tnt_b"), f.entry("tnt_a")}
		f.insert(t, es...)
		all = append(all, es...)
	}
	res, err = f.log.Sequence(ctx)
	require.NoError(t, err)
	require.Equal(t, 19, res.Sequenced)
	require.EqualValues(t, 20, res.Size)
	require.Len(t, res.Checkpoints, 1, "19 entries since the last checkpoint: one is due")
	latest := res.Checkpoints[0]
	require.EqualValues(t, 20, latest.Size)

	for _, e := range append([]envelope.AuditEntry{a, b}, all...) {
		p := f.prove(t, e.ID, 0)
		v, err := offline(t, p.Bundle(), f.verifier)
		require.NoError(t, err, e.ID)
		require.Equal(t, e.ID, v.Entry.ID)
		require.Equal(t, e.Detail, v.Entry.Detail)
		require.EqualValues(t, 20, v.Checkpoint.Size)
	}
	// b was sequenced before a, though a's id is lower.
	require.EqualValues(t, 0, f.prove(t, b.ID, 0).LeafIndex)
	require.EqualValues(t, 1, f.prove(t, a.ID, 0).LeafIndex)
	// A proof against the older checkpoint, by size.
	_, err = offline(t, f.prove(t, b.ID, 1).Bundle(), f.verifier)
	require.NoError(t, err)

	var cons audit.ConsistencyProof
	require.NoError(t, f.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		cons, err = f.log.ProveConsistency(ctx, tx, first.Size, 0)
		return err
	}))
	_, err = offline(t, audit.Bundle{Kind: audit.BundleConsistency, FromCheckpoint: string(first.Note), Checkpoint: string(cons.Checkpoint.Note), Proof: cons.Hashes}, f.verifier)
	require.NoError(t, err)

	rep, err := f.log.Check(ctx, f.verifier)
	require.NoError(t, err)
	require.Empty(t, rep.Problems)
	require.EqualValues(t, 20, rep.Entries)
	require.Equal(t, 2, rep.Checkpoints)
}

// TestCheckpointEveryNOrT: a checkpoint comes after CheckpointEvery
// entries, or after CheckpointInterval with entries since the last.
func TestCheckpointEveryNOrT(t *testing.T) {
	t.Parallel()
	f := setup(t, audit.LogConfig{CheckpointEvery: 5, CheckpointInterval: time.Minute})
	ctx := t.Context()
	sequence := func() audit.SequenceResult {
		t.Helper()
		res, err := f.log.Sequence(ctx)
		require.NoError(t, err)
		return res
	}
	f.insert(t, f.entry("t"))
	require.Len(t, sequence().Checkpoints, 1, "the first")
	f.insert(t, f.entry("t"), f.entry("t"))
	require.Empty(t, sequence().Checkpoints, "2 entries, 0 s since the last")
	f.clk.Advance(time.Minute)
	res := sequence()
	require.Len(t, res.Checkpoints, 1, "a minute old with entries since")
	require.EqualValues(t, 3, res.Checkpoints[0].Size)
	// N: with the clock still, the fifth entry since the last makes one.
	for range 4 {
		f.insert(t, f.entry("t"))
	}
	require.Empty(t, sequence().Checkpoints, "4 entries, 0 s since the last")
	f.insert(t, f.entry("t"))
	res = sequence()
	require.Len(t, res.Checkpoints, 1, "5 entries")
	require.EqualValues(t, 8, res.Checkpoints[0].Size)
	f.clk.Advance(time.Hour)
	require.Empty(t, sequence().Checkpoints, "nothing new: no checkpoint however old")
}

// TestProveRefusals: a missing entry, a queued one, and one past the
// latest checkpoint each say so.
func TestProveRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t, audit.LogConfig{CheckpointEvery: 100, CheckpointInterval: time.Hour})
	ctx := t.Context()
	first := f.entry("t")
	f.insert(t, first)
	_, err := f.log.Sequence(ctx)
	require.NoError(t, err)
	queued := f.entry("t")
	f.insert(t, queued)
	prove := func(id string) error {
		return f.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			_, err := f.log.ProveInclusion(ctx, tx, id, 0)
			return err
		})
	}
	require.ErrorIs(t, prove("aud_missing"), audit.ErrNoEntry)
	require.ErrorIs(t, prove(queued.ID), audit.ErrNotCheckpointed)
	_, err = f.log.Sequence(ctx)
	require.NoError(t, err)
	err = prove(queued.ID)
	require.ErrorIs(t, err, audit.ErrNotCheckpointed, "sequenced, not checkpointed")
	cp, err := f.log.CheckpointNow(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, cp.Size)
	require.NoError(t, prove(queued.ID))
	_, err = f.log.Checkpoint(ctx, 7)
	require.ErrorIs(t, err, audit.ErrNoCheckpoint)
}

// unguard drops the append-only triggers, as an attacker with the
// database's owner rights can: the tamper tests play that attacker.
func unguard(t testing.TB, db *store.DB) {
	t.Helper()
	q := `DROP FUNCTION audit_append_only() CASCADE`
	if db.Dialect() == store.SQLite {
		var drops []string
		for _, table := range []string{"audit_log", "audit_leaves", "audit_nodes", "audit_checkpoints"} {
			drops = append(drops, "DROP TRIGGER "+table+"_no_update", "DROP TRIGGER "+table+"_no_delete")
		}
		q = strings.Join(drops, "; ")
	}
	require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, q)
		return err
	}))
}

// TestAppendOnlyGuards: the database itself refuses to update or delete
// the log's rows and the tree's.
func TestAppendOnlyGuards(t *testing.T) {
	t.Parallel()
	f := setup(t, audit.LogConfig{})
	e := f.entry("t")
	f.insert(t, e)
	_, err := f.log.Sequence(t.Context())
	require.NoError(t, err)
	for _, q := range []string{
		`UPDATE audit_log SET decision = 'deny'`, `DELETE FROM audit_log`,
		`UPDATE audit_leaves SET seq = 7`, `DELETE FROM audit_leaves`,
		`UPDATE audit_checkpoints SET note = ''`, `DELETE FROM audit_checkpoints`,
	} {
		err := f.db.Write(t.Context(), func(ctx context.Context, tx store.Tx) error {
			_, err := tx.Exec(ctx, q)
			return err
		})
		require.ErrorIs(t, err, store.ErrConstraint, q)
		require.ErrorContains(t, err, "append-only", q)
	}
	rep, err := f.log.Check(t.Context(), f.verifier)
	require.NoError(t, err)
	require.Empty(t, rep.Problems)
}

// tampered builds a checkpointed log of 8 entries and returns it with them,
// its append-only guards dropped.
func tampered(t *testing.T) (*fixture, []envelope.AuditEntry) {
	t.Helper()
	f := setup(t, audit.LogConfig{CheckpointEvery: 4})
	var es []envelope.AuditEntry
	for range 8 {
		e := f.entry("tnt_a")
		f.insert(t, e)
		es = append(es, e)
	}
	res, err := f.log.Sequence(t.Context())
	require.NoError(t, err)
	require.Len(t, res.Checkpoints, 1)
	rep, err := f.log.Check(t.Context(), f.verifier)
	require.NoError(t, err)
	require.Empty(t, rep.Problems, "clean before the tampering")
	unguard(t, f.db)
	return f, es
}

func requireProblem(t *testing.T, f *fixture, contains string) audit.CheckReport {
	t.Helper()
	rep, err := f.log.Check(t.Context(), f.verifier)
	require.NoError(t, err)
	require.NotEmpty(t, rep.Problems)
	var reasons []string
	for _, p := range rep.Problems {
		reasons = append(reasons, p.Reason)
	}
	require.Contains(t, fmt.Sprint(reasons), contains)
	return rep
}

// TestTamperEditedRow: an edited row fails the full check and its own
// inclusion proof.
func TestTamperEditedRow(t *testing.T) {
	t.Parallel()
	f, es := tampered(t)
	f.exec(t, `UPDATE audit_log SET decision = 'deny' WHERE id = $1`, es[3].ID)
	rep := requireProblem(t, f, "edited or reordered")
	require.Equal(t, es[3].ID, rep.Problems[0].EntryID)
	require.Contains(t, fmt.Sprint(rep.Problems), "do not give the root signed at size 8")
	_, err := offline(t, f.prove(t, es[3].ID, 0).Bundle(), f.verifier)
	require.ErrorIs(t, err, audit.ErrProof)
	_, err = offline(t, f.prove(t, es[2].ID, 0).Bundle(), f.verifier)
	require.NoError(t, err, "an untouched entry still proves: its path does not cover the edit's leaf hash")
}

// TestTamperDeletedRow: a deleted row, with or without its leaf, is found.
func TestTamperDeletedRow(t *testing.T) {
	t.Parallel()
	f, es := tampered(t)
	f.exec(t, `DELETE FROM audit_log WHERE id = $1`, es[5].ID)
	rep := requireProblem(t, f, "missing from the audit log: deleted")
	require.Equal(t, es[5].ID, rep.Problems[0].EntryID)

	f2, es2 := tampered(t)
	f2.exec(t, `DELETE FROM audit_log WHERE id = $1`, es2[5].ID)
	f2.exec(t, `DELETE FROM audit_leaves WHERE audit_id = $1`, es2[5].ID)
	rep = requireProblem(t, f2, "leaves 5 to 5 are missing")
	require.Len(t, rep.Problems, 2, "the gap and the checkpoint: %v", rep.Problems)
	requireProblem(t, f2, "checkpoint of size 8 is past the 7 leaves")

	// The last leaf and its row gone: the checkpoint is past the tree.
	f3, es3 := tampered(t)
	f3.exec(t, `DELETE FROM audit_log WHERE id = $1`, es3[7].ID)
	f3.exec(t, `DELETE FROM audit_leaves WHERE audit_id = $1`, es3[7].ID)
	requireProblem(t, f3, "past the 7 leaves")
}

// TestTamperReorderedRows: two rows' contents swapped, or two leaves'
// entries swapped, are found.
func TestTamperReorderedRows(t *testing.T) {
	t.Parallel()
	f, es := tampered(t)
	// Swap everything but the ids: the log now says entry 2 did 6's action.
	f.exec(t, `UPDATE audit_log SET resource_id = $1 WHERE id = $2`, es[6].ResourceID, es[2].ID)
	f.exec(t, `UPDATE audit_log SET resource_id = $1 WHERE id = $2`, es[2].ResourceID, es[6].ID)
	rep := requireProblem(t, f, "edited or reordered")
	require.Equal(t, es[2].ID, rep.Problems[0].EntryID)
	require.Equal(t, es[6].ID, rep.Problems[1].EntryID)

	// Swap the order itself, leaf hashes and all: only the root can tell.
	f2, es2 := tampered(t)
	f2.exec(t, `UPDATE audit_leaves SET seq = -1 WHERE audit_id = $1`, es2[1].ID)
	f2.exec(t, `UPDATE audit_leaves SET seq = 1 WHERE audit_id = $1`, es2[4].ID)
	f2.exec(t, `UPDATE audit_leaves SET seq = 4 WHERE seq = -1`)
	requireProblem(t, f2, "do not give the root signed at size 8")
}

// TestForgedCheckpointRefused: a checkpoint signed by another key, even
// one of the same name, is refused offline, and so is a bundle built on it.
func TestForgedCheckpointRefused(t *testing.T) {
	t.Parallel()
	f, es := tampered(t)
	p := f.prove(t, es[0].ID, 0)
	_, err := offline(t, p.Bundle(), f.verifier)
	require.NoError(t, err, "the genuine proof verifies")

	skey, _, err := audit.NewLogKey("test.example/audit")
	require.NoError(t, err)
	forger := setup(t, audit.LogConfig{})
	forgerSigner, err := note.NewSigner(skey)
	require.NoError(t, err)
	forged, err := audit.SignCheckpoint(forgerSigner, p.Checkpoint.Size, p.Checkpoint.Root)
	require.NoError(t, err)
	_, err = audit.OpenCheckpoint(forged.Note, f.verifier)
	require.ErrorIs(t, err, audit.ErrCheckpointSignature)
	b := p.Bundle()
	b.Checkpoint = string(forged.Note)
	_, err = offline(t, b, f.verifier)
	require.ErrorIs(t, err, audit.ErrCheckpointSignature)
	_, err = offline(t, p.Bundle(), forger.verifier)
	require.ErrorIs(t, err, audit.ErrCheckpointSignature, "the genuine checkpoint under another log's key")
}

// TestConcurrentSequencers: writers and several sequencers at once; every
// row gets exactly one leaf and the tree checks clean.
func TestConcurrentSequencers(t *testing.T) {
	t.Parallel()
	f := setup(t, audit.LogConfig{CheckpointEvery: 7, BatchSize: 5})
	ctx := t.Context()
	var mu sync.Mutex
	next := func() envelope.AuditEntry {
		mu.Lock()
		defer mu.Unlock()
		return f.entry("t")
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 4 {
		wg.Go(func() {
			for range 10 {
				e := next()
				if err := f.db.Write(ctx, func(ctx context.Context, tx store.Tx) error { return audit.Insert(ctx, tx, e) }); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for range 3 {
		wg.Go(func() {
			for range 5 {
				if _, err := f.log.Sequence(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	cp, err := f.log.CheckpointNow(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 40, cp.Size)
	rep, err := f.log.Check(ctx, f.verifier)
	require.NoError(t, err)
	require.Empty(t, rep.Problems)
	require.EqualValues(t, 40, rep.Entries)
}

// mth is RFC 6962's Merkle Tree Hash written out from the RFC, with no
// library: what a third party in another language computes.
func mth(leaves [][]byte) []byte {
	switch len(leaves) {
	case 0:
		h := sha256.Sum256(nil)
		return h[:]
	case 1:
		h := sha256.Sum256(append([]byte{0}, leaves[0]...))
		return h[:]
	}
	k := 1
	for k*2 < len(leaves) {
		k *= 2
	}
	h := sha256.Sum256(append(append([]byte{1}, mth(leaves[:k])...), mth(leaves[k:])...))
	return h[:]
}

// TestRootIsRFC6962: the signed root is the RFC's Merkle Tree Hash of the
// rows' canonical encodings, computed here from the rows with nothing but
// SHA-256.
func TestRootIsRFC6962(t *testing.T) {
	t.Parallel()
	f := setup(t, audit.LogConfig{})
	var leaves [][]byte
	for range 13 {
		f.insert(t, f.entry("tnt_a"))
	}
	res, err := f.log.Sequence(t.Context())
	require.NoError(t, err)
	require.Len(t, res.Checkpoints, 1)
	// One batch: leaves are in id order. Read the rows back as stored.
	var rows []envelope.AuditEntry
	require.NoError(t, f.db.Read(t.Context(), func(ctx context.Context, tx store.Tx) (err error) {
		rows, err = audit.List(ctx, tx, audit.ListParams{AllTenants: true, Limit: 100})
		return err
	}))
	require.Len(t, rows, 13)
	for i := len(rows) - 1; i >= 0; i-- { // List is newest first
		leaves = append(leaves, audit.EncodeLeaf(rows[i]))
	}
	require.Equal(t, mth(leaves), res.Checkpoints[0].Root)
}

// TestSignerKeptAcrossStarts: the key is generated once and opened on every
// later start; another secret cannot open it.
func TestSignerKeptAcrossStarts(t *testing.T) {
	t.Parallel()
	f := setup(t, audit.LogConfig{})
	ctx := t.Context()
	signer, verifier, created, err := audit.LoadOrInitSigner(ctx, f.db, f.sealer, "renamed.example/audit")
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, f.verifier, verifier, "the stored key, with its own name")
	require.Equal(t, "test.example/audit", signer.Name())
	secret, err := pki.GenerateSecret()
	require.NoError(t, err)
	other, err := pki.NewSealer(secret)
	require.NoError(t, err)
	_, _, _, err = audit.LoadOrInitSigner(ctx, f.db, other, "test.example/audit")
	require.ErrorIs(t, err, pki.ErrSealed, "a secret that did not seal it")
	var count int
	require.NoError(t, f.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM audit_signer`).Scan(&count)
	}))
	require.Equal(t, 1, count, "the failed start made no second key")
}
