package audit

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"

	"github.com/better-compute/better-compute/internal/store"
)

// LogConfig configures the tree's sequencer and checkpoints.
type LogConfig struct {
	DB *store.DB
	// Signer signs checkpoints; nil sequences without signing (a
	// deployment with no sealing secret has no key to keep).
	Signer note.Signer
	// Verifier is the signer's public note verifier key.
	Verifier string
	// CheckpointEvery: a checkpoint is signed once this many entries were
	// sequenced since the last one; default 1,000.
	CheckpointEvery int
	// CheckpointInterval: a checkpoint is signed when entries were
	// sequenced and the last checkpoint is this old; default one minute.
	CheckpointInterval time.Duration
	// SequenceInterval is how often the River job runs; default 5 s.
	SequenceInterval time.Duration
	// BatchSize is the most entries one sequencing transaction takes;
	// default 5,000.
	BatchSize int
	Logger    *slog.Logger
}

// Log is the audit log's Merkle tree: it sequences committed rows into
// leaves, signs checkpoints, and serves proofs and the full check.
type Log struct {
	cfg LogConfig
	rf  *compact.RangeFactory
}

// NewLog returns the tree over cfg.DB.
func NewLog(cfg LogConfig) (*Log, error) {
	if cfg.DB == nil {
		return nil, errors.New("audit: log: no database")
	}
	if cfg.CheckpointEvery < 0 || cfg.CheckpointInterval < 0 || cfg.SequenceInterval < 0 || cfg.BatchSize < 0 {
		return nil, errors.New("audit: log: checkpoint and sequencing settings must not be negative")
	}
	cfg.CheckpointEvery = cmp.Or(cfg.CheckpointEvery, 1000)
	cfg.CheckpointInterval = cmp.Or(cfg.CheckpointInterval, time.Minute)
	cfg.SequenceInterval = cmp.Or(cfg.SequenceInterval, 5*time.Second)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 5000)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Log{cfg: cfg, rf: &compact.RangeFactory{Hash: rfc6962.DefaultHasher.HashChildren}}, nil
}

// Config returns the settings in force, defaults filled in.
func (l *Log) Config() LogConfig { return l.cfg }

// Verifier returns the public key checkpoints verify with ("" without a
// signer).
func (l *Log) Verifier() string { return l.cfg.Verifier }

// Origin returns the log's name, the first line of every checkpoint.
func (l *Log) Origin() string {
	if l.cfg.Signer == nil {
		return ""
	}
	return l.cfg.Signer.Name()
}

// SequenceResult says what one Sequence call did.
type SequenceResult struct {
	// Sequenced is how many entries became leaves.
	Sequenced int
	// Size is the tree's size afterwards.
	Size uint64
	// Checkpoints are the checkpoints signed.
	Checkpoints []Checkpoint
}

// Sequence moves every queued entry into the tree, in id order within each
// batch, and signs a checkpoint whenever one is due. It is safe to run on
// several replicas at once: each batch holds the tree row's lock, so
// batches apply one after another and an entry gets exactly one index.
func (l *Log) Sequence(ctx context.Context) (SequenceResult, error) {
	var res SequenceResult
	for {
		var (
			n  int
			cp *Checkpoint
		)
		err := l.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			// A retried transaction starts over.
			n, res.Size, cp, err = l.sequenceBatch(ctx, tx)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("audit: sequence: %w", err)
		}
		res.Sequenced += n
		if cp != nil {
			res.Checkpoints = append(res.Checkpoints, *cp)
		}
		if n < l.cfg.BatchSize {
			return res, nil
		}
	}
}

func (l *Log) sequenceBatch(ctx context.Context, tx store.Tx) (int, uint64, *Checkpoint, error) {
	st, err := treeLock(ctx, tx)
	if err != nil {
		return 0, 0, nil, err
	}
	r, err := l.compactRange(st)
	if err != nil {
		return 0, 0, nil, err
	}
	entries, err := pendingList(ctx, tx, l.cfg.BatchSize)
	if err != nil {
		return 0, 0, nil, err
	}
	leaves := make([]leafRow, 0, len(entries))
	nodes := make([]nodeRow, 0, len(entries))
	ids := make([]string, 0, len(entries))
	visit := func(id compact.NodeID, hash []byte) {
		if id.Level > 0 {
			nodes = append(nodes, nodeRow{Level: int(id.Level), Index: int64(id.Index), Hash: hash})
		}
	}
	for _, e := range entries {
		h := HashLeaf(EncodeLeaf(e))
		leaves = append(leaves, leafRow{Seq: int64(r.End()), AuditID: e.ID, LeafHash: h})
		ids = append(ids, e.ID)
		if err := r.Append(h, visit); err != nil {
			return 0, 0, nil, err
		}
	}
	if len(entries) > 0 {
		if err := leavesInsert(ctx, tx, leaves); err != nil {
			return 0, 0, nil, err
		}
		if err := nodesInsert(ctx, tx, nodes); err != nil {
			return 0, 0, nil, err
		}
		if err := pendingDelete(ctx, tx, ids); err != nil {
			return 0, 0, nil, err
		}
		if err := treeUpdate(ctx, tx, st.Size, treeState{Size: int64(r.End()), RangeHashes: bytes.Join(r.Hashes(), nil)}); err != nil {
			return 0, 0, nil, err
		}
	}
	cp, err := l.checkpointIfDue(ctx, tx, r)
	return len(entries), r.End(), cp, err
}

// compactRange rebuilds the tree's compact range from its stored state.
func (l *Log) compactRange(st treeState) (*compact.Range, error) {
	if len(st.RangeHashes)%hashSize != 0 {
		return nil, fmt.Errorf("audit: tree state holds %d bytes, not whole hashes", len(st.RangeHashes))
	}
	hashes := make([][]byte, 0, len(st.RangeHashes)/hashSize)
	for b := st.RangeHashes; len(b) > 0; b = b[hashSize:] {
		hashes = append(hashes, b[:hashSize:hashSize])
	}
	return l.rf.NewRange(0, uint64(st.Size), hashes)
}

// checkpointIfDue signs a checkpoint of r when the last one is
// CheckpointEvery entries behind, or CheckpointInterval old with entries
// since, or there is none yet.
func (l *Log) checkpointIfDue(ctx context.Context, tx store.Tx, r *compact.Range) (*Checkpoint, error) {
	if l.cfg.Signer == nil || r.End() == 0 {
		return nil, nil
	}
	last, err := checkpointGet(ctx, tx, 0)
	switch {
	case isNotFound(err):
	case err != nil:
		return nil, err
	default:
		behind := r.End() - uint64(last.Size)
		now := l.cfg.DB.Clock().Now()
		if behind == 0 || (behind < uint64(l.cfg.CheckpointEvery) && now.Sub(last.CreateTime) < l.cfg.CheckpointInterval) {
			return nil, nil
		}
	}
	return l.signCheckpoint(ctx, tx, r)
}

func (l *Log) signCheckpoint(ctx context.Context, tx store.Tx, r *compact.Range) (*Checkpoint, error) {
	root, err := r.GetRootHash(nil)
	if err != nil {
		return nil, err
	}
	cp, err := SignCheckpoint(l.cfg.Signer, r.End(), root)
	if err != nil {
		return nil, err
	}
	if err := checkpointInsert(ctx, tx, checkpointRow{Size: int64(cp.Size), Root: root, Note: string(cp.Note), CreateTime: l.cfg.DB.Clock().Now()}); err != nil {
		return nil, err
	}
	return &cp, nil
}

// CheckpointNow sequences what is queued and signs a checkpoint of the
// whole tree unless the latest already covers it. It returns the latest
// checkpoint either way.
func (l *Log) CheckpointNow(ctx context.Context) (Checkpoint, error) {
	if l.cfg.Signer == nil {
		return Checkpoint{}, ErrNoSigner
	}
	if _, err := l.Sequence(ctx); err != nil {
		return Checkpoint{}, err
	}
	err := l.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		st, err := treeLock(ctx, tx)
		if err != nil {
			return err
		}
		last, err := checkpointGet(ctx, tx, 0)
		if err == nil && last.Size == st.Size {
			return nil
		}
		if err != nil && !isNotFound(err) {
			return err
		}
		if st.Size == 0 {
			return nil
		}
		r, err := l.compactRange(st)
		if err != nil {
			return err
		}
		_, err = l.signCheckpoint(ctx, tx, r)
		return err
	})
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
	}
	var cp Checkpoint
	err = l.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		cp, err = l.checkpoint(ctx, tx, 0)
		return err
	})
	return cp, err
}

// ErrNoSigner: the deployment has no checkpoint key (no sealing secret).
var ErrNoSigner = errors.New("audit: no checkpoint signing key: set BETTER_COMPUTE_SECRET")

// ErrNoCheckpoint: no checkpoint of the asked size (or none at all yet).
var ErrNoCheckpoint = errors.New("audit: no such checkpoint")

// ErrNotCheckpointed: the entry is queued or sequenced but no checkpoint
// covers it yet.
var ErrNotCheckpointed = errors.New("audit: entry is not in a checkpoint yet")

// ErrPastCheckpoint: a consistency proof from a size past the checkpoint.
var ErrPastCheckpoint = errors.New("audit: size is past the checkpoint")

// ErrNoEntry: no audit row has this id.
var ErrNoEntry = errors.New("audit: no such entry")

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

// checkpoint reads a stored checkpoint (size 0: the latest) as signed.
func (l *Log) checkpoint(ctx context.Context, q store.Querier, size int64) (Checkpoint, error) {
	c, err := checkpointGet(ctx, q, size)
	if isNotFound(err) {
		return Checkpoint{}, ErrNoCheckpoint
	}
	if err != nil {
		return Checkpoint{}, err
	}
	origin, csize, root, err := parseNoteBody([]byte(c.Note))
	if err != nil {
		return Checkpoint{}, err
	}
	return Checkpoint{Origin: origin, Size: csize, Root: root, Note: []byte(c.Note)}, nil
}

// parseNoteBody parses a stored checkpoint without checking its signature
// (the reader checks that; the server only relays).
func parseNoteBody(msg []byte) (string, uint64, []byte, error) {
	i := bytes.Index(msg, []byte("\n\n"))
	if i < 0 {
		return "", 0, nil, errors.New("audit: stored checkpoint is not a signed note")
	}
	return ParseCheckpointBody(string(msg[:i+1]))
}

// Checkpoint returns the latest checkpoint (size 0) or the one of size.
func (l *Log) Checkpoint(ctx context.Context, size uint64) (Checkpoint, error) {
	var cp Checkpoint
	err := l.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		cp, err = l.checkpoint(ctx, tx, int64(size))
		return err
	})
	return cp, err
}

// InclusionProof is an entry's proof against a checkpoint.
type InclusionProof struct {
	LeafIndex  uint64
	Leaf       []byte
	Hashes     [][]byte
	Checkpoint Checkpoint
}

// Bundle returns the proof in its offline form.
func (p InclusionProof) Bundle() Bundle {
	return Bundle{Kind: BundleInclusion, Checkpoint: string(p.Checkpoint.Note), LeafIndex: p.LeafIndex, Leaf: p.Leaf, Proof: p.Hashes}
}

// ProveInclusion proves the entry id is in the tree of the checkpoint of
// size (0: the latest). The leaf is the canonical encoding of the row as
// it is now: a row edited since it was sequenced gives a proof that fails.
func (l *Log) ProveInclusion(ctx context.Context, q store.Querier, id string, size uint64) (InclusionProof, error) {
	e, err := entryGet(ctx, q, id)
	if isNotFound(err) {
		return InclusionProof{}, ErrNoEntry
	}
	if err != nil {
		return InclusionProof{}, err
	}
	seq, ok, pending, err := leafSeq(ctx, q, id)
	if err != nil {
		return InclusionProof{}, err
	}
	if !ok {
		if pending {
			return InclusionProof{}, fmt.Errorf("%w: it waits to be sequenced", ErrNotCheckpointed)
		}
		return InclusionProof{}, fmt.Errorf("%w: it is not in the tree", ErrNotCheckpointed)
	}
	cp, err := l.checkpoint(ctx, q, int64(size))
	if err != nil {
		return InclusionProof{}, err
	}
	if uint64(seq) >= cp.Size {
		return InclusionProof{}, fmt.Errorf("%w: it is leaf %d, checkpoint covers %d", ErrNotCheckpointed, seq, cp.Size)
	}
	nodes, err := proof.Inclusion(uint64(seq), cp.Size)
	if err != nil {
		return InclusionProof{}, err
	}
	hashes, err := l.proofHashes(ctx, q, nodes)
	if err != nil {
		return InclusionProof{}, err
	}
	return InclusionProof{LeafIndex: uint64(seq), Leaf: EncodeLeaf(e), Hashes: hashes, Checkpoint: cp}, nil
}

// ConsistencyProof proves the tree of size From is a prefix of the
// checkpoint's tree.
type ConsistencyProof struct {
	From       uint64
	Hashes     [][]byte
	Checkpoint Checkpoint
}

// ProveConsistency proves the tree of size from is a prefix of the tree of
// the checkpoint of size to (0: the latest).
func (l *Log) ProveConsistency(ctx context.Context, q store.Querier, from, to uint64) (ConsistencyProof, error) {
	cp, err := l.checkpoint(ctx, q, int64(to))
	if err != nil {
		return ConsistencyProof{}, err
	}
	if from > cp.Size {
		return ConsistencyProof{}, fmt.Errorf("%w: %d is past the checkpoint's size %d (a checkpoint of another log, or this log lost entries)", ErrPastCheckpoint, from, cp.Size)
	}
	nodes, err := proof.Consistency(from, cp.Size)
	if err != nil {
		return ConsistencyProof{}, err
	}
	hashes, err := l.proofHashes(ctx, q, nodes)
	if err != nil {
		return ConsistencyProof{}, err
	}
	return ConsistencyProof{From: from, Hashes: hashes, Checkpoint: cp}, nil
}

// proofHashes reads the stored hashes of a proof's nodes and folds the
// ephemeral node.
func (l *Log) proofHashes(ctx context.Context, q store.Querier, nodes proof.Nodes) ([][]byte, error) {
	var (
		seqs []int64
		keys []nodeKey
	)
	for _, id := range nodes.IDs {
		if id.Level == 0 {
			seqs = append(seqs, int64(id.Index))
		} else {
			keys = append(keys, nodeKey{Level: int(id.Level), Index: int64(id.Index)})
		}
	}
	leaves, err := leafHashes(ctx, q, seqs)
	if err != nil {
		return nil, err
	}
	inner, err := nodeHashes(ctx, q, keys)
	if err != nil {
		return nil, err
	}
	hashes := make([][]byte, len(nodes.IDs))
	for i, id := range nodes.IDs {
		var ok bool
		if id.Level == 0 {
			hashes[i], ok = leaves[int64(id.Index)]
		} else {
			hashes[i], ok = inner[nodeKey{Level: int(id.Level), Index: int64(id.Index)}]
		}
		if !ok {
			return nil, fmt.Errorf("audit: tree node (level %d, index %d) is missing", id.Level, id.Index)
		}
	}
	return nodes.Rehash(hashes, rfc6962.DefaultHasher.HashChildren)
}
