package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/gateway"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tunnel"
)

// replicaPeers is vps.TunnelPeers: the node's session owner from the nodes
// row, the owner's URL from gateway_replicas, and the replicas' transport
// the deployment plugs in (SetReplicaTransport). Without a transport every
// tunnel opens on the replica that redeemed its ticket, as on one replica.
type replicaPeers struct {
	db *store.DB
	gw *gateway.Gateway

	mu sync.Mutex
	rt http.RoundTripper
}

// errNoReplicaURL: the replica holding a session recorded no URL.
var errNoReplicaURL = errors.New("no replica URL")

func (p *replicaPeers) Transport() http.RoundTripper {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rt
}

func (p *replicaPeers) SessionReplica(ctx context.Context, nodeID string) (string, error) {
	if p.Transport() == nil {
		return "", nil
	}
	var owner, url string
	err := p.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		owner, url, err = fleet.NodeSessionReplica(ctx, tx, nodeID)
		return err
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		// The local path answers for a node that is gone.
		return "", nil
	case err != nil:
		return "", err
	case owner == "" || owner == p.gw.ReplicaID():
		return "", nil
	case url == "":
		return "", fmt.Errorf("replica %s holds node %s's session and recorded no URL to reach it by: %w", owner, nodeID, errNoReplicaURL)
	}
	return url, nil
}

// SetReplicaTransport plugs in the replicas' mutually authenticated
// transport (HTTP/1.1, the internal CA's certificates) and records url,
// where peers reach this replica's ReplicaHandler. From then on a tunnel
// whose node holds its gateway session on another replica is bridged
// through that replica. Call it before serving.
func (a *App) SetReplicaTransport(ctx context.Context, rt http.RoundTripper, url string) error {
	if rt == nil || url == "" {
		return errors.New("app: a replica transport needs a round tripper and this replica's URL")
	}
	url = strings.TrimRight(url, "/")
	if err := a.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return fleet.GatewayReplicaSet(ctx, tx, a.Gateway.ReplicaID(), url)
	}); err != nil {
		return fmt.Errorf("app: record this replica's URL: %w", err)
	}
	a.peers.mu.Lock()
	a.peers.rt = rt
	a.peers.mu.Unlock()
	return nil
}

// ReplicaHandler serves what peer replicas ask of this one on the replica
// listener: forwarded SSH tunnels, and the API (mutations of pools whose
// placer runs here) behind replica.Guard. Every request must come from a
// client with a replica certificate of the internal CA.
func (a *App) ReplicaHandler() http.Handler {
	fromReplica := func(r *http.Request) bool {
		if a.Replica == nil || r.TLS == nil {
			return false
		}
		_, err := a.Replica.VerifyClient(*r.TLS)
		return err == nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+tunnel.ForwardPath, a.Instances.ForwardedTunnelHandler(a.cfg.Logger, fromReplica))
	if a.Replica != nil {
		mux.Handle("/", a.Replica.Guard(a.Handler))
	}
	return mux
}

// EnableReplicaTunnels bridges SSH tunnels to the replica that holds a
// node's gateway session, over the replicas' mutual TLS (HTTP/1.1), and
// records url as where peers reach this replica's listener. It does
// nothing without a replica identity and listener (SQLite, no PKI).
func (a *App) EnableReplicaTunnels(ctx context.Context, url string) error {
	if a.Replica == nil || a.replicaLn == nil {
		return nil
	}
	return a.SetReplicaTransport(ctx, a.Replica.TunnelTransport(), url)
}
