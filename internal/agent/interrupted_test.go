package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
)

// A command that was in flight when bcd died is reported INTERRUPTED on the
// next start and never run again.
func TestInterruptedCommandNotRerun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	p := filepath.Join(b.stateDir, "commands.json")
	require.NoError(t, os.WriteFile(p, []byte(`{"last_applied_seq":0,"in_flight":{"seq":1,"id":"c1","kind":"node.drain"},"log":[]}`), 0o600))
	a2 := b.newAgent(t)
	require.EqualValues(t, 1, a2.LastAppliedSeq())
	run(t, a2)
	h := b.gw.hello(t)
	require.EqualValues(t, 1, h.GetLastAppliedSeq())
	u, ran := b.gw.finalUpdate(t, 1)
	require.False(t, ran)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState())
	require.Equal(t, agent.FailInterrupted, u.GetFailureCode())
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	require.False(t, strings.Contains(string(data), "in_flight"))
}
