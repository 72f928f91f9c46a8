package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestOutputCap(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	oc := &outputCap{now: func() time.Time { return now }, rate: 100, total: 250}
	require.Equal(t, 60, oc.admit(60))
	require.Equal(t, 40, oc.admit(60), "the rest of this second's 100")
	require.Equal(t, 0, oc.admit(10))
	require.EqualValues(t, 30, oc.droppedBytes())
	now = now.Add(time.Second)
	require.Equal(t, 100, oc.admit(500), "a new second")
	now = now.Add(time.Second)
	require.Equal(t, 50, oc.admit(100), "the total cap: 250")
	now = now.Add(time.Second)
	require.Equal(t, 0, oc.admit(100))
	require.EqualValues(t, 30+400+50+100, oc.droppedBytes())
	oc.lost(7)
	require.EqualValues(t, 587, oc.droppedBytes())
}
