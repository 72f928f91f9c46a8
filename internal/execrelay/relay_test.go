package execrelay

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRelay(t *testing.T) {
	t.Parallel()
	h := New()
	h.Output("c1", "stdout", []byte("nobody listens")) // discarded
	s := h.Subscribe("c1")
	require.True(t, h.Watching("c1"))
	for range Buffer {
		h.Output("c1", "stdout", []byte("ab"))
	}
	h.Output("c1", "stderr", []byte("xyz")) // no room: dropped, counted
	h.Exited("c1", &Exit{State: "succeeded"})
	h.Exited("c1", &Exit{State: "failed"}) // the first end stands
	require.EqualValues(t, 3, s.Dropped())
	require.Len(t, s.Output(), Buffer)
	require.Equal(t, Event{Stream: "stdout", Data: []byte("ab")}, <-s.Output())
	require.Equal(t, "succeeded", (<-s.Exit()).State)

	s.Close()
	s.Close()
	require.False(t, h.Watching("c1"))
	h.Output("c1", "stdout", []byte("late")) // after Close: nothing, no panic
	require.Len(t, s.Output(), Buffer-1)

	// A newer subscription replaces the older; closing the older keeps it.
	a, b := h.Subscribe("c2"), h.Subscribe("c2")
	a.Close()
	h.Output("c2", "stdout", []byte("x"))
	require.Len(t, b.Output(), 1)
	require.Empty(t, a.Output())
}
