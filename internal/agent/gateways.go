package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
)

// gatewayAddr is one address bcd dials and the name the gateway's
// certificate must carry there: the host as configured, never the address
// a name resolved to, so one serving certificate for gw.example serves
// every replica behind that name.
type gatewayAddr struct {
	addr       string
	serverName string
}

// ParseServers splits a --server value: one or more gateway host:port,
// comma-separated. Each host is an IP address or a name; a name may
// resolve to several addresses, each one a gateway.
func ParseServers(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("no gateway address: want HOST:PORT[,HOST:PORT...]")
	}
	var out []string
	for e := range strings.SplitSeq(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			return nil, fmt.Errorf("gateway list %q has an empty entry: want HOST:PORT[,HOST:PORT...]", s)
		}
		host, port, err := net.SplitHostPort(e)
		if err != nil {
			return nil, fmt.Errorf("gateway %q must be HOST:PORT: %w", e, err)
		}
		if host == "" || port == "" {
			return nil, fmt.Errorf("gateway %q must be HOST:PORT with both parts", e)
		}
		out = append(out, e)
	}
	return out, nil
}

// gateways hands out the addresses to dial in turn: every address of every
// configured entry, in order, then the same again resolved afresh, so a
// name's records are read again once per round. Each session attempt takes
// the next address, so a gateway that refuses, hangs or drops the session
// is left for the next one.
type gateways struct {
	entries []string
	lookup  func(ctx context.Context, host string) ([]string, error)

	mu    sync.Mutex
	round []gatewayAddr
	next  int
	last  gatewayAddr
}

// resolve is one round: the entries' addresses in order. An entry whose
// name does not resolve is left out of the round; only a round with no
// address at all is an error.
func (g *gateways) resolve(ctx context.Context) ([]gatewayAddr, error) {
	var round []gatewayAddr
	var errs []error
	for _, e := range g.entries {
		host, port, _ := net.SplitHostPort(e) // checked by ParseServers
		if net.ParseIP(host) != nil {
			round = append(round, gatewayAddr{addr: e, serverName: host})
			continue
		}
		ips, err := g.lookup(ctx, host)
		if err != nil {
			errs = append(errs, fmt.Errorf("resolve gateway %s: %w", host, err))
			continue
		}
		for _, ip := range ips {
			round = append(round, gatewayAddr{addr: net.JoinHostPort(ip, port), serverName: host})
		}
	}
	if len(round) == 0 {
		errs = append(errs, fmt.Errorf("no address for the gateways %s", strings.Join(g.entries, ",")))
		return nil, errors.Join(errs...)
	}
	return round, nil
}

// pick returns the next address to dial.
func (g *gateways) pick(ctx context.Context) (gatewayAddr, error) {
	g.mu.Lock()
	done := g.next >= len(g.round)
	g.mu.Unlock()
	if done {
		// Resolved without the lock: a slow resolver must not hold up
		// current (the renewal).
		round, err := g.resolve(ctx)
		if err != nil {
			return gatewayAddr{}, err
		}
		g.mu.Lock()
		g.round, g.next = round, 0
		g.mu.Unlock()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.last = g.round[g.next%len(g.round)]
	g.next++
	return g.last, nil
}

// current is the address picked last (the session's, or the one being
// tried), or the first one when none was picked yet.
func (g *gateways) current(ctx context.Context) (gatewayAddr, error) {
	g.mu.Lock()
	last := g.last
	g.mu.Unlock()
	if last.addr != "" {
		return last, nil
	}
	return g.pick(ctx)
}
