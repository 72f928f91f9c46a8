package vps

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tunnel"
)

// ticketHash is what the database keeps of a ticket id.
func ticketHash(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:])
}

// TicketInsert records ticket t under the hash of its id and drops the
// tickets expired by now.
func TicketInsert(ctx context.Context, tx store.Tx, id string, t tunnel.Ticket, now time.Time) error {
	if _, err := tx.Exec(ctx, `DELETE FROM ssh_tickets WHERE expire_time <= $1`, now); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO ssh_tickets (id_hash, tenant_id, instance_id, host_id, node_id, expire_time)
		VALUES ($1, $2, $3, $4, $5, $6)`, ticketHash(id), t.TenantID, t.InstanceID, t.HostID, t.NodeID, t.Expire)
	return err
}

// TicketRedeem deletes the ticket id and returns it; store.ErrNotFound
// when it is unknown or was used. Whether it expired is the caller's to
// judge: the row goes either way.
func TicketRedeem(ctx context.Context, tx store.Tx, id string) (tunnel.Ticket, error) {
	var t tunnel.Ticket
	err := tx.QueryRow(ctx, `DELETE FROM ssh_tickets WHERE id_hash = $1
		RETURNING tenant_id, instance_id, host_id, node_id, expire_time`, ticketHash(id)).
		Scan(&t.TenantID, &t.InstanceID, &t.HostID, &t.NodeID, &t.Expire)
	return t, err
}
