package placement

import (
	"testing"

	"pgregory.net/rapid"
)

// Run with `go test -tags rapid` once go.mod requires pgregory.net/rapid.

type rapidGen struct{ t *rapid.T }

func (g rapidGen) intRange(lo, hi int, label string) int {
	return rapid.IntRange(lo, hi).Draw(g.t, label)
}

// TestProperties checks, under rapid with shrinking, that placements
// respect every filter, NVLink islands are preferred when they exist, and
// scoring is deterministic for a snapshot.
func TestProperties(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		g := rapidGen{rt}
		nodes, req := genNodes(g), genRequest(g)
		if err := req.Validate(); err != nil {
			rt.Fatalf("generated an invalid request: %v", err)
		}
		checkPlacement(rt, nodes, req)
	})
}
