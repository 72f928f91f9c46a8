// Package netpolicy enforces an instance's network policy (egress, private,
// none) on its tap device with nftables, spoken over netlink through
// github.com/google/nftables: it implements vmcmd.NetPolicy for bcd's
// hypervisor side. It owns two tables in the host's (or the rule's)
// network namespace and must never touch any other table, nor run the nft
// binary.
//
// Layout. The bridge-family table bc_instances sees every frame a guest
// sends or receives at its bridge port. Base chains look the port up in
// verdict maps (one lookup, however many guests) that jump to four per-tap
// chains: prerouting to guard-TAP (anti-spoofing:
// the guest's MAC and IPv4 address only, before the bridge learns the
// source MAC), forward and input to from-TAP (what the guest may send),
// forward to to-TAP (what other bridge ports may send it) and output to
// host-TAP (what the host, its own sockets or traffic it routes, may send
// it). A per-tap chain returns what it allows and drops, with a counter,
// what it does not. The kernels we target have no bridge conntrack, so
// bridged traffic is judged statelessly; traffic through the host's IP
// stack is judged statefully by the inet-family table bc_instances (input:
// what a private/none guest may open to the host; forward: only replies
// are routed in to an egress guest, nothing in or out for private/none).
//
// Every change for one tap is one netlink batch, so a tap is never seen
// half-configured; Apply and Remove are idempotent and serialised.
package netpolicy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/better-compute/better-compute/internal/vmcmd"
)

// TableName names both tables this package owns (bridge and inet family).
const TableName = "bc_instances"

// Config configures a Policy.
type Config struct {
	// NetNS is where Remove looks for a tap this process has not applied
	// (after a restart, before the instance's rule is applied again);
	// empty: the host's namespace.
	NetNS string
	// NetNSDir holds named network namespaces (ip netns); default
	// /run/netns.
	NetNSDir string
}

// Policy implements vmcmd.NetPolicy.
type Policy struct {
	cfg Config

	mu       sync.Mutex
	probed   bool
	probeErr error
	netns    map[string]string // tap -> the namespace its last Apply used
}

var _ vmcmd.NetPolicy = (*Policy)(nil)

// New returns a Policy; nothing touches the kernel until it is used.
func New(cfg Config) *Policy {
	if cfg.NetNSDir == "" {
		cfg.NetNSDir = "/run/netns"
	}
	return &Policy{cfg: cfg, netns: map[string]string{}}
}

// conn opens an nftables connection in netns (empty: this process's);
// release closes what it opened.
func (p *Policy) conn(netns string) (c *nftables.Conn, release func(), err error) {
	if netns == "" {
		c, err = nftables.New()
		return c, func() {}, err
	}
	f, err := os.Open(filepath.Join(p.cfg.NetNSDir, netns))
	if err != nil {
		return nil, nil, fmt.Errorf("netpolicy: network namespace %q: %w", netns, err)
	}
	c, err = nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("netpolicy: nftables in %q: %w", netns, err)
	}
	return c, func() { f.Close() }, nil
}

// Supported reports whether policies can be enforced in the configured
// namespace: nf_tables with the bridge family, verdict maps and, in the
// inet family, conntrack. It probes once, by creating and deleting scratch
// tables shaped like the real ones, and caches the answer: it decides a
// capability bcd advertises (Reason says why not).
func (p *Policy) Supported(ctx context.Context) bool {
	return p.Reason(ctx) == nil
}

// Reason is why Supported is false (nil when it is true), for bcd's log.
func (p *Policy) Reason(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.probed {
		p.probeErr = p.probeLocked()
		p.probed = true
	}
	return p.probeErr
}

func (p *Policy) probeLocked() error {
	c, release, err := p.conn(p.cfg.NetNS)
	if err != nil {
		return err
	}
	defer release()
	// One batch that creates and deletes: nothing is left behind whether
	// it passes or not.
	name := fmt.Sprintf("bc_probe_%d", os.Getpid())
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyBridge, nftables.TableFamilyINet} {
		t := c.AddTable(&nftables.Table{Name: name, Family: fam})
		ch := c.AddChain(&nftables.Chain{Name: "probe", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
		if fam == nftables.TableFamilyBridge {
			m := tapMap(t, "probe")
			if err := addSet(c, m, nil); err != nil {
				return fmt.Errorf("netpolicy: probe: %w", err)
			}
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: vmap(expr.MetaKeyIIFNAME, m)})
		} else {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: ctReply(expr.VerdictAccept)})
		}
		c.DelTable(t)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netpolicy: probe: %w", err)
	}
	return nil
}

// state is what of one tap is in the kernel now.
type state struct {
	bridge bool             // the bridge table exists (with its maps and base rules)
	chains bool             // the tap's chains exist (and so its map entries)
	inet   []*nftables.Rule // its rules in the inet table
}

func (s *state) empty() bool { return !s.chains && len(s.inet) == 0 }

// read finds the bridge table, tap's chains, and tap's tagged rules in the
// inet table.
func read(c *nftables.Conn, tap string) (*state, error) {
	st := &state{}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyBridge, nftables.TableFamilyINet} {
		chains, err := c.ListChainsOfTableFamily(fam)
		if err != nil {
			return nil, fmt.Errorf("netpolicy: list chains: %w", err)
		}
		for _, ch := range chains {
			if ch.Table.Name != TableName {
				continue
			}
			if fam == nftables.TableFamilyBridge {
				st.bridge = true
				st.chains = st.chains || ch.Name == chainFrom(tap)
				continue
			}
			if ch.Hooknum == nil {
				continue
			}
			rules, err := c.GetRules(ch.Table, ch)
			if err != nil {
				return nil, fmt.Errorf("netpolicy: list rules of %s: %w", ch.Name, err)
			}
			for _, r := range rules {
				if ruleComment(r) == tag(tap) {
					r.Table, r.Chain = ch.Table, ch
					st.inet = append(st.inet, r)
				}
			}
		}
	}
	return st, nil
}

// Apply validates r and then replaces its tap's rules in one batch.
func (p *Policy) Apply(ctx context.Context, r vmcmd.Rule) error {
	rr, err := check(r)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c, release, err := p.conn(rr.netns)
	if err != nil {
		return err
	}
	defer release()
	st, err := read(c, rr.tap)
	if err != nil {
		return err
	}
	bt, it := c.AddTable(bridgeTable()), c.AddTable(inetTable())
	for _, ch := range append(bridgeBase(bt), inetBase(it)...) {
		c.AddChain(ch)
	}
	if !st.bridge {
		if err := dispatch(c, bt); err != nil {
			return err
		}
	}
	perTap := []*ruleSet{guardRules(bt, rr), fromRules(bt, rr), toRules(bt, rr), hostRules(bt, rr)}
	for _, s := range perTap {
		if st.chains {
			c.FlushChain(s.chain)
		} else {
			c.AddChain(s.chain)
		}
		for _, a := range s.sets {
			if err := addSet(c, a.set, a.elems); err != nil {
				return fmt.Errorf("netpolicy: peers: %w", err)
			}
		}
		for _, rule := range s.rules {
			c.AddRule(rule)
		}
	}
	if !st.chains {
		// Entries and chains change together, in this batch: a map never
		// names a missing chain.
		for name, els := range tapElements(rr.tap) {
			if err := c.SetAddElements(tapMap(bt, name), els); err != nil {
				return fmt.Errorf("netpolicy: %w", err)
			}
		}
	}
	for _, old := range st.inet {
		if err := c.DelRule(old); err != nil {
			return fmt.Errorf("netpolicy: %w", err)
		}
	}
	for _, rule := range inetRules(it, rr) {
		c.AddRule(rule)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netpolicy: apply %s policy to %s: %w", rr.policy, rr.tap, err)
	}
	if prev, ok := p.netns[rr.tap]; ok && prev != rr.netns {
		// The tap moved namespaces: its old rules would otherwise stay.
		if err := p.removeLocked(rr.tap, prev); err != nil {
			return err
		}
	}
	p.netns[rr.tap] = rr.netns
	return nil
}

// Remove deletes tap's rules in one batch; a tap without rules succeeds.
func (p *Policy) Remove(ctx context.Context, tap string) error {
	if err := validTap(tap); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	netns, ok := p.netns[tap]
	if !ok {
		netns = p.cfg.NetNS
	}
	return p.removeLocked(tap, netns)
}

func (p *Policy) removeLocked(tap, netns string) error {
	c, release, err := p.conn(netns)
	if err != nil {
		return err
	}
	defer release()
	st, err := read(c, tap)
	if err != nil {
		return err
	}
	if !st.empty() {
		for _, rule := range st.inet {
			if err := c.DelRule(rule); err != nil {
				return fmt.Errorf("netpolicy: %w", err)
			}
		}
		if st.chains {
			bt := bridgeTable()
			for name, els := range tapElements(tap) {
				if err := c.SetDeleteElements(tapMap(bt, name), els); err != nil {
					return fmt.Errorf("netpolicy: %w", err)
				}
			}
			for _, name := range []string{chainGuard(tap), chainFrom(tap), chainTo(tap), chainHost(tap)} {
				ch := &nftables.Chain{Name: name, Table: bt}
				c.FlushChain(ch)
				c.DelChain(ch)
			}
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("netpolicy: remove %s: %w", tap, err)
		}
	}
	delete(p.netns, tap)
	return nil
}
