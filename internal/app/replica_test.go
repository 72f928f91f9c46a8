package app_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/store"
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

// TestKeepReplicaRow: a serving replica touches its gateway_replicas row,
// and the rows of replicas that stopped touching theirs (and hold no
// node's session) are pruned; a replica that touches again is back.
func TestKeepReplicaRow(t *testing.T) {
	if os.Getenv(bctest.PostgresURLEnv) == "" {
		t.Skip("replicas record their URLs only on PostgreSQL")
	}
	t.Parallel()
	ctx := context.Background()
	a := bctest.NewControlPlane(t)
	b := a.NewReplica(t)
	urls := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		require.NoError(t, a.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			for _, cp := range []*bctest.ControlPlane{a, b} {
				var got string
				err := tx.QueryRow(ctx, `SELECT url FROM gateway_replicas WHERE id = $1`, cp.App.Gateway.ReplicaID()).Scan(&got)
				if errors.Is(err, store.ErrNotFound) {
					continue
				}
				if err != nil {
					return err
				}
				out[cp.App.Gateway.ReplicaID()] = got
			}
			return nil
		}))
		return out
	}
	both := map[string]string{a.App.Gateway.ReplicaID(): a.ReplicaURL, b.App.Gateway.ReplicaID(): b.ReplicaURL}
	require.Equal(t, both, urls())

	// B stops touching its row (it died); A goes on.
	a.Clock.Advance(9 * time.Minute)
	require.NoError(t, a.App.KeepReplicaRow(ctx))
	require.Equal(t, both, urls(), "not stale yet")
	a.Clock.Advance(2 * time.Minute)
	require.NoError(t, a.App.KeepReplicaRow(ctx))
	require.Equal(t, map[string]string{a.App.Gateway.ReplicaID(): a.ReplicaURL}, urls(), "B's row is pruned, A's kept")

	require.NoError(t, b.App.KeepReplicaRow(ctx))
	require.Equal(t, both, urls(), "B is back")
}
