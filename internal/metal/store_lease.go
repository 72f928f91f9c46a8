package metal

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// LeaseIDPrefix starts a machine lease's id.
const LeaseIDPrefix = "mls"

// Lease is a dedicated-root lease of one machine (binding "machine").
type Lease struct {
	ID                string
	MachineID         string
	OwnerTenantID     string
	LesseeTenantID    string
	State             string
	ImageID           string
	ImageName         string
	ImageSHA256       string
	SSHKeyFingerprint string
	Reason            string
	CreatedBy         string
	ReleasedBy        string
	CreateTime        time.Time
	UpdateTime        time.Time
	ReleaseTime       *time.Time
	EndTime           *time.Time
	// ReservationID is the capacity reservation the lease binds (a
	// tenant's binding machine reservation), "" for an owner's offer;
	// NodeID the platform node the machine ran as.
	ReservationID string
	NodeID        string
}

// Evidence is one teardown step's verified (or refused) evidence.
type Evidence struct {
	LeaseID    string
	Step       string
	Kind       string
	WorkflowID string
	Verified   bool
	// Digest is the sha256 (hex) of the signed bytes that were verified.
	Digest string
	// Signer names who signed: "node/<id>" with the key's fingerprint.
	Signer     string
	Detail     string
	CreateTime time.Time
}

const leaseColumns = `id, machine_id, owner_tenant_id, lessee_tenant_id, state, image_id, image_name, image_sha256,
	ssh_key_fingerprint, reason, created_by, released_by, create_time, update_time, release_time, end_time, reservation_id, node_id`

func scanLease(row interface{ Scan(...any) error }) (Lease, error) {
	var l Lease
	err := row.Scan(&l.ID, &l.MachineID, &l.OwnerTenantID, &l.LesseeTenantID, &l.State, &l.ImageID, &l.ImageName, &l.ImageSHA256,
		&l.SSHKeyFingerprint, &l.Reason, &l.CreatedBy, &l.ReleasedBy, &l.CreateTime, &l.UpdateTime, &l.ReleaseTime, &l.EndTime,
		&l.ReservationID, &l.NodeID)
	return l, err
}

// LeaseInsert creates a lease's row; store.ErrUnique when the machine is
// under another open lease.
func LeaseInsert(ctx context.Context, tx store.Tx, l *Lease) error {
	_, err := tx.Exec(ctx, `INSERT INTO machine_leases (`+leaseColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
		$11, $12, $13, $14, $15, $16, $17, $18)`, l.ID, l.MachineID, l.OwnerTenantID, l.LesseeTenantID, l.State, l.ImageID, l.ImageName,
		l.ImageSHA256, l.SSHKeyFingerprint, l.Reason, l.CreatedBy, l.ReleasedBy, l.CreateTime, l.UpdateTime, l.ReleaseTime, l.EndTime,
		l.ReservationID, l.NodeID)
	return err
}

// LeaseUpdate writes a lease's state, image and key (set on acceptance),
// reason, release and end.
func LeaseUpdate(ctx context.Context, tx store.Tx, l *Lease) error {
	_, err := tx.Exec(ctx, `UPDATE machine_leases SET state = $2, reason = $3, released_by = $4, update_time = $5,
		release_time = $6, end_time = $7, image_id = $8, image_name = $9, image_sha256 = $10, ssh_key_fingerprint = $11
		WHERE id = $1`, l.ID, l.State, l.Reason, l.ReleasedBy, l.UpdateTime, l.ReleaseTime, l.EndTime, l.ImageID, l.ImageName,
		l.ImageSHA256, l.SSHKeyFingerprint)
	return err
}

// LeaseByID reads a lease by id alone (the lifecycle's callbacks).
func LeaseByID(ctx context.Context, q store.Querier, id, lock string) (Lease, error) {
	return scanLease(q.QueryRow(ctx, `SELECT `+leaseColumns+` FROM machine_leases WHERE id = $1`+lock, id))
}

// LeaseOfReservation reads the lease that has not ended of a reservation
// (store.ErrNotFound when there is none).
func LeaseOfReservation(ctx context.Context, q store.Querier, reservationID, lock string) (Lease, error) {
	return scanLease(q.QueryRow(ctx, `SELECT `+leaseColumns+` FROM machine_leases
		WHERE reservation_id = $1 AND state <> 'returned' ORDER BY create_time DESC LIMIT 1`+lock, reservationID))
}

// LeaseGetVisible reads a lease the tenant holds or owns the machine of:
// any other tenant gets store.ErrNotFound.
func LeaseGetVisible(ctx context.Context, q store.Querier, tenantID, id, lock string) (Lease, error) {
	if !strings.HasPrefix(id, LeaseIDPrefix+"_") {
		return Lease{}, store.ErrNotFound
	}
	return scanLease(q.QueryRow(ctx, `SELECT `+leaseColumns+` FROM machine_leases
		WHERE id = $1 AND (lessee_tenant_id = $2 OR owner_tenant_id = $2)`+lock, id, tenantID))
}

// EvidenceUpsert records a step's evidence (a teardown run again replaces
// its earlier row for the step).
func EvidenceUpsert(ctx context.Context, tx store.Tx, e *Evidence) error {
	if _, err := tx.Exec(ctx, `DELETE FROM machine_lease_evidence WHERE lease_id = $1 AND step = $2`, e.LeaseID, e.Step); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO machine_lease_evidence (lease_id, step, kind, workflow_id, verified, digest, signer, detail,
		create_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, e.LeaseID, e.Step, e.Kind, e.WorkflowID, boolInt(e.Verified),
		e.Digest, e.Signer, e.Detail, e.CreateTime)
	return err
}

// EvidenceList is a lease's evidence, in the order it was recorded.
func EvidenceList(ctx context.Context, q store.Querier, leaseID string) ([]Evidence, error) {
	rows, err := q.Query(ctx, `SELECT lease_id, step, kind, workflow_id, verified, digest, signer, detail, create_time
		FROM machine_lease_evidence WHERE lease_id = $1 ORDER BY create_time, step`, leaseID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Evidence
	for rows.Next() {
		var e Evidence
		var v int
		if err := rows.Scan(&e.LeaseID, &e.Step, &e.Kind, &e.WorkflowID, &v, &e.Digest, &e.Signer, &e.Detail, &e.CreateTime); err != nil {
			return nil, err
		}
		e.Verified = v != 0
		out = append(out, e)
	}
	return out, rows.Err()
}

func decodeBaseline(s string) (map[string]any, error) {
	var m map[string]any
	err := json.Unmarshal([]byte(s), &m)
	return m, err
}
