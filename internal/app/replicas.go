package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

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
	// url is where peers reach this replica, recorded in gateway_replicas.
	url string
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
	a.peers.url = url
	a.peers.mu.Unlock()
	return nil
}

const (
	// replicaTouchInterval is how often a replica serving its peers
	// touches its gateway_replicas row.
	replicaTouchInterval = time.Minute
	// replicaStaleAfter without a touch a replica's row is pruned, unless
	// a node's session names the replica: ten missed touches, so a replica
	// cut off from the database for a while keeps its row (and writes it
	// again when it is back).
	replicaStaleAfter = 10 * replicaTouchInterval
)

// KeepReplicaRow touches this replica's gateway_replicas row (recording
// its URL again) and prunes the rows of replicas that stopped touching
// theirs, which are gone. ServeReplica calls it every
// replicaTouchInterval; before SetReplicaTransport it does nothing.
func (a *App) KeepReplicaRow(ctx context.Context) error {
	a.peers.mu.Lock()
	url := a.peers.url
	a.peers.mu.Unlock()
	if url == "" {
		return nil
	}
	return a.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if err := fleet.GatewayReplicaSet(ctx, tx, a.Gateway.ReplicaID(), url); err != nil {
			return err
		}
		_, err := fleet.GatewayReplicaPrune(ctx, tx, replicaStaleAfter)
		return err
	})
}

// keepReplicaRow runs KeepReplicaRow every replicaTouchInterval until ctx
// is done.
func (a *App) keepReplicaRow(ctx context.Context) {
	t := time.NewTicker(replicaTouchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := a.KeepReplicaRow(ctx); err != nil && ctx.Err() == nil {
				a.cfg.Logger.Warn("touch this replica's gateway_replicas row", "err", err)
			}
		}
	}
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
