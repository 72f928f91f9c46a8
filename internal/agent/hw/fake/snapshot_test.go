//go:build cgo

package fake

import (
	"context"
	"encoding/json"
	"flag"
	"maps"
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

var update = flag.Bool("update", false, "rewrite snapshot.json from go-nvml's mocks")

// recordSnapshot reads every mock through the NVML reader and keeps what
// does not depend on the options.
func recordSnapshot(t *testing.T) []byte {
	t.Helper()
	out := map[string]json.RawMessage{}
	for _, model := range slices.Sorted(maps.Keys(productNames)) {
		b, err := fromMock(Options{Model: model})
		require.NoError(t, err)
		inv, err := b.Inventory(context.Background())
		require.NoError(t, err)
		require.NoError(t, b.Close())
		inv.Nvlinks = nil
		for _, g := range inv.Gpus {
			g.Uuid, g.NumaNode, g.Index = "", 0, 0
		}
		j, err := protojson.Marshal(inv)
		require.NoError(t, err)
		out[model] = j
	}
	b, err := json.MarshalIndent(out, "", "  ")
	require.NoError(t, err)
	return append(b, '\n')
}

// The cgo-free fake serves exactly what the mocks serve through the NVML
// reader: the snapshot is fresh, and both paths answer alike for every model,
// seed and topology.
func TestSnapshot(t *testing.T) {
	got := recordSnapshot(t)
	if *update {
		require.NoError(t, os.WriteFile("snapshot.json", got, 0o644))
	}
	var want, have any
	require.NoError(t, json.Unmarshal(got, &want))
	require.NoError(t, json.Unmarshal(snapshotJSON, &have))
	require.Equal(t, want, have, "snapshot.json is stale: go test ./internal/agent/hw/fake -run TestSnapshot -update")

	for _, opts := range []Options{
		{Model: "dgxh100", Seed: "a"},
		{Model: "dgxa100", Seed: "b"},
		{Model: "dgxb200", Seed: "c"},
		{Model: "dgxh100", Seed: "d", Topology: Topology{NUMA: []int{1, 1, 0, 0, 1, 1, 0, 0}, NVLinks: [][2]int{{0, 1}, {2, 3}, {1, 2}}}},
	} {
		m, err := fromMock(opts)
		require.NoError(t, err)
		s, err := fromSnapshot(opts)
		require.NoError(t, err)
		mi, err := m.Inventory(context.Background())
		require.NoError(t, err)
		si, err := s.Inventory(context.Background())
		require.NoError(t, err)
		require.True(t, proto.Equal(mi, si), "%+v:\nmock:     %v\nsnapshot: %v", opts, mi, si)
		require.True(t, proto.Equal(m.Identity(), s.Identity()), "%+v", opts)
		require.NoError(t, m.Close())
		require.NoError(t, s.Close())
	}
}
