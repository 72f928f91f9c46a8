package audit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/audit"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// BenchmarkCheckpoint10k: one op sequences 10,000 committed audit rows into
// the tree and signs the checkpoint they make due (the rows are written
// outside the timer). It also reports an inclusion proof bundle's size at
// the tree's size after the first op (10^4 leaves).
func BenchmarkCheckpoint10k(b *testing.B) {
	const n = 10_000
	f := setup(b, audit.LogConfig{CheckpointEvery: n, BatchSize: n})
	ctx := context.Background()
	first := ""
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		es := make([]envelope.AuditEntry, n)
		for j := range es {
			es[j] = f.entry(fmt.Sprintf("tnt_%d", j%7))
		}
		if first == "" {
			first = es[n/2].ID
		}
		f.insert(b, es...)
		b.StartTimer()
		res, err := f.log.Sequence(ctx)
		require.NoError(b, err)
		require.Equal(b, n, res.Sequenced)
		require.Len(b, res.Checkpoints, 1)
		if i == 0 {
			b.StopTimer()
			var p audit.InclusionProof
			require.NoError(b, f.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
				p, err = f.log.ProveInclusion(ctx, tx, first, n)
				return err
			}))
			raw, err := json.Marshal(p.Bundle())
			require.NoError(b, err)
			b.ReportMetric(float64(len(p.Hashes)*32), "inclusion_proof_bytes_1e4")
			b.ReportMetric(float64(len(raw)), "inclusion_bundle_bytes_1e4")
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/n, "µs/entry")
}

// proofLen returns a function giving the number of hashes of a proof
// over nodes.
func proofLen(b *testing.B) func(proof.Nodes, error) int {
	return func(nodes proof.Nodes, err error) int {
		require.NoError(b, err)
		dummy := make([][]byte, len(nodes.IDs))
		for i := range dummy {
			dummy[i] = make([]byte, 32)
		}
		hs, err := nodes.Rehash(dummy, rfc6962.DefaultHasher.HashChildren)
		require.NoError(b, err)
		return len(hs)
	}
}

// BenchmarkProofSizes reports the largest inclusion proof (over every
// 97th leaf and the last) and consistency proof (from every 97th size)
// of trees of 10^4 and 10^6 leaves, in bytes of hashes: a proof's size
// depends only on the index and the sizes, not on the entries.
func BenchmarkProofSizes(b *testing.B) {
	for _, size := range []uint64{10_000, 1_000_000} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			var incl, cons int
			n := proofLen(b)
			for b.Loop() {
				incl, cons = 0, 0
				for i := uint64(0); i < size; i += 97 {
					incl = max(incl, n(proof.Inclusion(i, size)))
					cons = max(cons, n(proof.Consistency(i+1, size)))
				}
				incl = max(incl, n(proof.Inclusion(size-1, size)))
			}
			b.ReportMetric(float64(incl*32), "max_inclusion_bytes")
			b.ReportMetric(float64(cons*32), "max_consistency_bytes")
			// The bundle a verifier gets for the longest proof: an entry
			// like BenchmarkCheckpoint10k's, a signed checkpoint of this
			// size.
			skey, _, err := audit.NewLogKey("test.example/audit")
			require.NoError(b, err)
			signer, err := note.NewSigner(skey)
			require.NoError(b, err)
			cp, err := audit.SignCheckpoint(signer, size, make([]byte, 32))
			require.NoError(b, err)
			f := &fixture{clk: bctest.NewSimClock(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)), n: 10_000/2 + 1}
			hashes := make([][]byte, incl)
			for i := range hashes {
				hashes[i] = make([]byte, 32)
			}
			raw, err := json.Marshal(audit.Bundle{Kind: audit.BundleInclusion, Checkpoint: string(cp.Note), LeafIndex: size / 2,
				Leaf: audit.EncodeLeaf(f.entry("tnt_1")), Proof: hashes})
			require.NoError(b, err)
			b.ReportMetric(float64(len(raw)), "inclusion_bundle_bytes")
		})
	}
}
