package agent

// Command signing on the node (docs/security.md): bcd pins the
// command-signing roots it is given at join (or, for a node that joined
// before command signing, at its first renewal) and from then on applies a
// command only when a worker key that chains to one of them signed it for
// this node, this sequence number and these params.

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/cmdsig"
)

const commandTrustFile = "command-trust.json"

// commandTrust is the pinned command-signing bundle.
type commandTrust struct {
	RootsPEM   []byte `json:"roots_pem"`
	Version    int64  `json:"version"`
	MinVersion int64  `json:"min_version"`

	roots *x509.CertPool
}

func parseCommandTrust(ct *agentv1.CommandTrust) (*commandTrust, error) {
	t := &commandTrust{RootsPEM: ct.GetRootsPem(), Version: ct.GetVersion(), MinVersion: ct.GetMinVersion()}
	return t, t.init()
}

func (t *commandTrust) init() error {
	t.roots = x509.NewCertPool()
	if !t.roots.AppendCertsFromPEM(t.RootsPEM) {
		return errors.New("command trust bundle holds no certificates")
	}
	if t.Version <= 0 || t.MinVersion <= 0 || t.MinVersion > t.Version {
		return fmt.Errorf("command trust bundle: version %d, min %d", t.Version, t.MinVersion)
	}
	return nil
}

// pinCommandTrust takes ct at a join (a new identity), or when the node
// has none pinned, or when ct is not older than the pinned one (roots
// published or retired by a rotation); an older bundle at a renewal is
// ignored, never a downgrade.
func (a *Agent) pinCommandTrust(ct *agentv1.CommandTrust, join bool) error {
	if ct == nil || len(ct.GetRootsPem()) == 0 {
		return nil
	}
	t, err := parseCommandTrust(ct)
	if err != nil {
		return err
	}
	a.mu.Lock()
	cur := a.cmdTrust
	a.mu.Unlock()
	if !join && cur != nil && (t.Version < cur.Version || t.MinVersion < cur.MinVersion) {
		a.log.Warn("ignored an older command trust bundle", "pinned", cur.Version, "offered", t.Version)
		return nil
	}
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if err := a.dir.write(commandTrustFile, b); err != nil {
		return err
	}
	a.mu.Lock()
	a.cmdTrust = t
	a.mu.Unlock()
	return nil
}

// loadCommandTrust reads the pinned bundle, if any.
func (a *Agent) loadCommandTrust() error {
	t := &commandTrust{}
	if found, err := a.dir.readJSON(commandTrustFile, t); err != nil || !found {
		return err
	}
	if err := t.init(); err != nil {
		return err
	}
	a.mu.Lock()
	a.cmdTrust = t
	a.mu.Unlock()
	return nil
}

// trustVersion is what Hello reports: the pinned bundle's version, 0 when
// none is pinned.
func (a *Agent) trustVersionLocked() int64 {
	if a.cmdTrust == nil {
		return 0
	}
	return a.cmdTrust.Version
}

// verifyCommand checks c's signature when a bundle is pinned. A node that
// pinned none (it joined a control plane without command signing) applies
// commands as before.
func (a *Agent) verifyCommand(c *agentv1.Command) error {
	a.mu.Lock()
	t, node := a.cmdTrust, a.node
	a.mu.Unlock()
	if t == nil {
		return nil
	}
	sig := c.GetSignature()
	f := cmdsig.Fields{TrustVersion: sig.GetTrustVersion(), ID: c.GetId(), NodeID: node.NodeID, Seq: c.GetSeq(), Kind: c.GetKind(),
		ParamsDigest: cmdsig.Digest(sig.GetSignedParams()), IdempotencyKey: c.GetIdempotencyKey(), Deadline: c.GetDeadline().AsTime()}
	return a.cmdVerifier.Verify(cmdsig.Bundle{Roots: t.roots, MinVersion: t.MinVersion, TrustDomain: node.TrustDomain},
		sig.GetChain(), sig.GetSignature(), f, a.cfg.Clock.Now())
}
