package audit

import (
	"bytes"
	"context"
	"fmt"

	"github.com/better-compute/better-compute/internal/store"
)

// maxProblems bounds a check's report: past it the log is plainly broken.
const maxProblems = 100

// Problem is one thing the full check found wrong.
type Problem struct {
	// LeafIndex is the leaf it concerns, -1 when none.
	LeafIndex int64
	// EntryID is the audit entry it concerns, "" when none.
	EntryID string
	Reason  string
}

// CheckReport is the full check's result: clean when Problems is empty.
type CheckReport struct {
	// Entries is how many leaves were recomputed from their rows.
	Entries uint64
	// Checkpoints is how many signed checkpoints were checked.
	Checkpoints int
	// Latest is the newest checkpoint checked.
	Latest   Checkpoint
	Problems []Problem
}

func (r *CheckReport) add(index int64, id, format string, args ...any) {
	if len(r.Problems) < maxProblems {
		r.Problems = append(r.Problems, Problem{LeafIndex: index, EntryID: id, Reason: fmt.Sprintf(format, args...)})
	}
}

// Check recomputes every leaf from its audit row and the tree's root at
// every signed checkpoint, trusting neither the stored leaf hashes nor the
// stored nodes: an edited, deleted or reordered row, a leaf removed, or a
// checkpoint not signed by verifierKey is reported. It also reports rows
// that are neither in the tree nor waiting for it.
func (l *Log) Check(ctx context.Context, verifierKey string) (CheckReport, error) {
	var rep CheckReport
	err := l.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		rep = CheckReport{}
		// Checkpoints first: every leaf they cover is then in the walk.
		rows, err := checkpointList(ctx, tx)
		if err != nil {
			return err
		}
		cps := make([]Checkpoint, 0, len(rows))
		for _, c := range rows {
			cp, err := OpenCheckpoint([]byte(c.Note), verifierKey)
			if err != nil {
				rep.add(-1, "", "checkpoint of size %d: %v", c.Size, err)
				continue
			}
			if cp.Size != uint64(c.Size) || !bytes.Equal(cp.Root, c.Root) {
				rep.add(-1, "", "checkpoint of size %d: its row disagrees with its signed note", c.Size)
			}
			cps = append(cps, cp)
		}
		r := l.rf.NewEmptyRange(0)
		next, want := 0, int64(0)
		// compare checks the checkpoints the walk has reached.
		compare := func() error {
			for next < len(cps) && cps[next].Size == r.End() {
				root, err := r.GetRootHash(nil)
				if err != nil {
					return err
				}
				if r.End() == 0 || !bytes.Equal(root, cps[next].Root) {
					rep.add(-1, "", "the rows do not give the root signed at size %d", cps[next].Size)
				}
				rep.Checkpoints++
				rep.Latest = cps[next]
				next++
			}
			return nil
		}
		err = checkScan(ctx, tx, func(c checkRow) error {
			if err := compare(); err != nil {
				return err
			}
			if c.Seq != want {
				rep.add(want, "", "leaves %d to %d are missing from the tree", want, c.Seq-1)
				// Carry on: the checkpoints past the gap cannot match.
			}
			want = c.Seq + 1
			h := c.LeafHash
			switch {
			case !c.RowFound:
				rep.add(c.Seq, c.AuditID, "entry %s (leaf %d) is missing from the audit log: deleted", c.AuditID, c.Seq)
			default:
				h = HashLeaf(EncodeLeaf(c.Entry))
				if !bytes.Equal(h, c.LeafHash) {
					rep.add(c.Seq, c.AuditID, "entry %s (leaf %d) is not what was sequenced: edited or reordered", c.AuditID, c.Seq)
				}
			}
			rep.Entries++
			return r.Append(h, nil)
		})
		if err != nil {
			return err
		}
		if err := compare(); err != nil {
			return err
		}
		for _, cp := range cps[next:] {
			rep.add(-1, "", "checkpoint of size %d is past the %d leaves in the tree: leaves were removed", cp.Size, r.End())
		}
		escaped, err := unsequencedRows(ctx, tx, maxProblems)
		if err != nil {
			return err
		}
		for _, id := range escaped {
			rep.add(-1, id, "entry %s is neither in the tree nor queued for it", id)
		}
		return nil
	})
	if err != nil {
		return CheckReport{}, fmt.Errorf("audit: check: %w", err)
	}
	return rep, nil
}
