package app

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
)

// TestStreamingProcedures: the watches, exec, the image push and pull and
// the release upload,
// read from the descriptors, are the procedures exempt from the body
// deadline; an empty set would cut every watch (every running exec, every
// push of a large image) after the deadline. A stream authenticates on its
// headers, before its body.
func TestStreamingProcedures(t *testing.T) {
	t.Parallel()
	require.Equal(t, map[string]bool{
		apiv1connect.EventServiceWatchProcedure:       true,
		apiv1connect.ReservationServiceWatchProcedure: true,
		apiv1connect.ReservationServiceExecProcedure:  true,
		apiv1connect.ImageServicePushProcedure:        true,
		apiv1connect.ImageServicePullProcedure:        true,
		apiv1connect.InstanceServiceWatchProcedure:    true,
		apiv1connect.ReleaseServiceCreateProcedure:    true,
	}, streamingProcedures)
}
