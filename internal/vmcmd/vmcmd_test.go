package vmcmd_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/vmcmd"
)

func TestDecodeRefusesUnknownFields(t *testing.T) {
	var p vmcmd.InstanceRef
	require.NoError(t, vmcmd.Decode([]byte(`{"instance_id":"i-1"}`), &p))
	require.Equal(t, "i-1", p.InstanceID)
	require.ErrorContains(t, vmcmd.Decode([]byte(`{"instance_id":"i-1","gpus":2}`), &p), `unknown field "gpus"`)
}

func TestValidID(t *testing.T) {
	require.True(t, vmcmd.ValidID("ins-0123"))
	for _, s := range []string{"", "-a", "A", "a/b", "a..b"} {
		require.False(t, vmcmd.ValidID(s), s)
	}
}
