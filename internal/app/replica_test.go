package app_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
)

// TestReplicaListener: on PostgreSQL each replica serves its peers on a
// mutual TLS listener, the URL its placers advertise: another replica's
// client (its internal CA certificate) gets through to the API, a client
// without a replica certificate completes no request, and the API
// listener's plain URL is not where peers forward.
func TestReplicaListener(t *testing.T) {
	if os.Getenv(bctest.PostgresURLEnv) == "" {
		t.Skip("replicas forward to each other only on PostgreSQL: on SQLite one process places every pool")
	}
	t.Parallel()
	a := bctest.NewControlPlane(t)
	b := a.NewReplica(t)
	require.Regexp(t, `^https://127\.0\.0\.1:\d+$`, a.ReplicaURL)
	require.NotEqual(t, a.URL, a.ReplicaURL)

	res, err := b.App.Replica.Client(time.Minute).Get(a.ReplicaURL + "/healthz")
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, "ok\n", string(body))

	// No replica certificate: the handshake fails, nothing is served.
	plain := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the server is not under test
	res, err = plain.Get(a.ReplicaURL + "/healthz")
	if err == nil {
		_ = res.Body.Close()
	}
	require.Error(t, err)
}
