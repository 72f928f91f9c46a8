package vps

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// peerKey is an instance.peers command's idempotency key: the recipient,
// the change that caused it and the peer set's digest. A change handled
// twice (a redelivered answer) sends nothing more; the same peer set after
// another change (A, then B, then A again) is sent again, as the host has B.
func peerKey(recipientID string, change, peers []string) string {
	h := sha256.New()
	h.Write([]byte(strings.Join(change, ",")))
	h.Write([]byte{0})
	h.Write([]byte(strings.Join(peers, ",")))
	return recipientID + "/peers/" + hex.EncodeToString(h.Sum(nil)[:12])
}

// pushPeers re-sends the peer list of every private instance that shares
// a tenant and IP pool with the changed instances (one that started
// running, was deleted, lost or failed): one instance.peers per recipient
// for the whole change, however many instances it covers. The changed
// instances themselves are left out (a new one got its list with its
// create; one that went has no guest to tell).
func (s *InstanceService) pushPeers(ctx context.Context, tx store.Tx, changed []Instance, now time.Time) error {
	type group struct {
		tenantID, ipPoolID string
		change             []string
		ids                map[string]bool
	}
	var groups []*group
	byKey := map[string]*group{}
	for _, in := range changed {
		if in.IPPoolID == "" {
			continue
		}
		k := in.TenantID + "/" + in.IPPoolID
		g := byKey[k]
		if g == nil {
			g = &group{tenantID: in.TenantID, ipPoolID: in.IPPoolID, ids: map[string]bool{}}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.change = append(g.change, in.ID+"="+in.State)
		g.ids[in.ID] = true
	}
	for _, g := range groups {
		recipients, err := privateOnPool(ctx, tx, g.tenantID, g.ipPoolID)
		if err != nil {
			return err
		}
		for i := range recipients {
			r := &recipients[i]
			if g.ids[r.ID] {
				continue
			}
			peers, err := PeerAddresses(ctx, tx, g.tenantID, g.ipPoolID, r.ID)
			if err != nil {
				return err
			}
			p := vmcmd.PeersParams{InstanceID: HostID(r.ID), Peers: nonNil(peers)}
			if _, err := s.send(ctx, tx, r, vmcmd.KindInstancePeers, p, peerKey(r.ID, g.change, peers), now); err != nil {
				return err
			}
		}
	}
	return nil
}

// leftPeers reports whether an instance leaving state from changes its
// peers' lists: lost and failed instances already left them.
func leftPeers(from string) bool { return from != StateLost && from != StateFailed }
