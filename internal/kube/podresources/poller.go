// Package podresources learns which pods hold bcd's GPUs from the
// kubelet's PodResources API and records them as holders in the node's
// offer (kubebind.Set): a release of a binding: kubernetes reservation
// completes only once no pod holds its GPUs.
//
// The API names a pod by namespace and name (it carries no UID), so a
// holder is "pod/<namespace>/<name>".
package podresources

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/better-compute/better-compute/internal/kube/deviceplugin"
	"github.com/better-compute/better-compute/internal/kubebind"
)

// HolderPrefix starts the holders this package records.
const HolderPrefix = "pod/"

// DefaultSocket is the kubelet's PodResources socket.
const DefaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Config configures a Poller. Zero values take the defaults noted.
type Config struct {
	// Set is the node's offer; required.
	Set *kubebind.Set
	// Socket is the kubelet's PodResources socket (default
	// /var/lib/kubelet/pod-resources/kubelet.sock).
	Socket string
	// Interval is how often the kubelet is asked (default 5 s).
	Interval time.Duration
	// Timeout bounds one List (default 10 s).
	Timeout time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Poller asks the kubelet which pods hold bcd.dev/gpu devices.
type Poller struct {
	cfg    Config
	log    *slog.Logger
	conn   *grpc.ClientConn
	client podresourcesv1.PodResourcesListerClient

	once    sync.Once
	synced  chan struct{}
	mu      sync.Mutex
	lastErr string
}

// New checks cfg; the kubelet is dialled at the first Sync.
func New(cfg Config) (*Poller, error) {
	if cfg.Set == nil {
		return nil, errors.New("podresources: Set is required")
	}
	cfg.Socket = cmp.Or(cfg.Socket, DefaultSocket)
	cfg.Interval = cmp.Or(cfg.Interval, 5*time.Second)
	cfg.Timeout = cmp.Or(cfg.Timeout, 10*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &Poller{cfg: cfg, log: cfg.Logger, synced: make(chan struct{})}
	if err := p.dial(); err != nil {
		return nil, err
	}
	return p, nil
}

// dial makes a new connection: after a failure the next Sync does not
// wait out the old one's reconnect backoff (a restarted kubelet answers
// on its new socket at once).
func (p *Poller) dial() error {
	conn, err := grpc.NewClient("unix://"+p.cfg.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("podresources: socket %s: %w", p.cfg.Socket, err)
	}
	p.mu.Lock()
	old := p.conn
	p.conn, p.client = conn, podresourcesv1.NewPodResourcesListerClient(conn)
	p.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	return nil
}

// Synced is closed after the first Sync that succeeded: from then on the
// Set's pod holders are the kubelet's, and a withdrawal may complete on
// their account (a bcd that just started knows no holder before).
func (p *Poller) Synced() <-chan struct{} { return p.synced }

// Sync asks the kubelet once and replaces the Set's pod holders with its
// answer. A failed List changes nothing: a pod not seen is not a pod
// gone.
func (p *Poller) Sync(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	p.mu.Lock()
	client := p.client
	p.mu.Unlock()
	resp, err := client.List(lctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		if derr := p.dial(); derr != nil {
			return derr
		}
		return fmt.Errorf("podresources: list pods of %s: %w", p.cfg.Socket, err)
	}
	holders := map[string][]string{}
	held := map[string]bool{}
	for _, pod := range resp.GetPodResources() {
		key := pod.GetNamespace() + "/" + pod.GetName()
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() != deviceplugin.ResourceName {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					if !slices.Contains(holders[key], id) {
						holders[key] = append(holders[key], id)
					}
					held[id] = true
				}
			}
		}
	}
	p.cfg.Set.SetHolders(HolderPrefix, holders)
	// A container Allocate held for is a pod now: its hold goes, the
	// pod's stays.
	for h, uuids := range p.cfg.Set.Holders() {
		if strings.HasPrefix(h, deviceplugin.HolderPrefix) && !slices.ContainsFunc(uuids, func(u string) bool { return !held[u] }) {
			p.cfg.Set.Let(h)
		}
	}
	p.once.Do(func() { close(p.synced) })
	return nil
}

// Run syncs at once and every Interval until ctx ends.
func (p *Poller) Run(ctx context.Context) error {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		p.report(p.Sync(ctx))
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// report logs a failure once, and the recovery after it.
func (p *Poller) report(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	switch {
	case msg == p.lastErr:
	case err != nil:
		p.log.Warn("pods holding bcd GPUs are not known: releases wait", "err", err)
	default:
		p.log.Info("the kubelet's pod resources answer again")
	}
	p.lastErr = msg
}

// Close closes the connection to the kubelet.
func (p *Poller) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn.Close()
}
