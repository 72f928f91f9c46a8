package metal

// SQL over site_boot_leases, site_dispatches and site_machine_boots.

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// BootLease is a row of site_boot_leases.
type BootLease struct {
	SiteID       string
	HolderNodeID string
	Epoch        int64
	AcquireTime  time.Time
	ExpireTime   time.Time
}

// Live reports whether the lease is still held at now.
func (l BootLease) Live(now time.Time) bool { return now.Before(l.ExpireTime) }

// BootLeaseGet reads a site's boot lease (store.ErrNotFound when no site
// agent ever held it); lock is "" or store.ForUpdate(tx).
func BootLeaseGet(ctx context.Context, q store.Querier, siteID, lock string) (BootLease, error) {
	var l BootLease
	err := q.QueryRow(ctx, `SELECT site_id, holder_node_id, epoch, acquire_time, expire_time FROM site_boot_leases
		WHERE site_id = $1`+lock, siteID).Scan(&l.SiteID, &l.HolderNodeID, &l.Epoch, &l.AcquireTime, &l.ExpireTime)
	return l, err
}

// BootLeaseInsert creates a site's first lease; it reports false when a
// concurrent agent created it first.
func BootLeaseInsert(ctx context.Context, tx store.Tx, l *BootLease) (bool, error) {
	n, err := tx.Exec(ctx, `INSERT INTO site_boot_leases (site_id, holder_node_id, epoch, acquire_time, expire_time)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (site_id) DO NOTHING`, l.SiteID, l.HolderNodeID, l.Epoch, l.AcquireTime, l.ExpireTime)
	return n == 1, err
}

// SiteTenant returns the owner of a site by id (store.ErrNotFound when
// absent).
func SiteTenant(ctx context.Context, q store.Querier, siteID string) (string, error) {
	var tenantID string
	err := q.QueryRow(ctx, `SELECT tenant_id FROM sites WHERE id = $1`, siteID).Scan(&tenantID)
	return tenantID, err
}

// BootLeaseUpdate writes a lease read with BootLeaseGet(..., ForUpdate)
// back, only while its epoch is still fromEpoch; it reports whether it did.
func BootLeaseUpdate(ctx context.Context, tx store.Tx, l *BootLease, fromEpoch int64) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE site_boot_leases SET holder_node_id = $2, epoch = $3, acquire_time = $4, expire_time = $5
		WHERE site_id = $1 AND epoch = $6`, l.SiteID, l.HolderNodeID, l.Epoch, l.AcquireTime, l.ExpireTime, fromEpoch)
	return n == 1, err
}

// SiteDispatch is a row of site_dispatches; CommandID "" marks a fenced
// key.
type SiteDispatch struct {
	IdempotencyKey string
	SiteID         string
	MachineID      string
	NodeID         string
	CommandID      string
	Epoch          int64
	CreateTime     time.Time
}

const siteDispatchColumns = `idempotency_key, site_id, machine_id, node_id, command_id, epoch, create_time`

func scanSiteDispatch(row interface{ Scan(...any) error }) (SiteDispatch, error) {
	var d SiteDispatch
	err := row.Scan(&d.IdempotencyKey, &d.SiteID, &d.MachineID, &d.NodeID, &d.CommandID, &d.Epoch, &d.CreateTime)
	return d, err
}

// SiteDispatchInsert records a dispatch (or a fence) for a key unless the
// key has one; it reports whether it wrote, and a repeat reads the stored
// row back.
func SiteDispatchInsert(ctx context.Context, tx store.Tx, d *SiteDispatch) (SiteDispatch, bool, error) {
	n, err := tx.Exec(ctx, `INSERT INTO site_dispatches (`+siteDispatchColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (idempotency_key) DO NOTHING`, d.IdempotencyKey, d.SiteID, d.MachineID, d.NodeID, d.CommandID, d.Epoch, d.CreateTime)
	if err != nil {
		return SiteDispatch{}, false, err
	}
	if n == 1 {
		return *d, true, nil
	}
	stored, err := SiteDispatchGet(ctx, tx, d.IdempotencyKey)
	return stored, false, err
}

// SiteDispatchGet reads the dispatch of a key (store.ErrNotFound when
// none).
func SiteDispatchGet(ctx context.Context, q store.Querier, key string) (SiteDispatch, error) {
	return scanSiteDispatch(q.QueryRow(ctx, `SELECT `+siteDispatchColumns+` FROM site_dispatches WHERE idempotency_key = $1`, key))
}

// SiteDispatchByCommand reads the dispatch a command carries
// (store.ErrNotFound when it carries none).
func SiteDispatchByCommand(ctx context.Context, q store.Querier, commandID string) (SiteDispatch, error) {
	return scanSiteDispatch(q.QueryRow(ctx, `SELECT `+siteDispatchColumns+` FROM site_dispatches WHERE command_id = $1`, commandID))
}

// MachineBootSet sets the boot a machine's iPXE script gives.
func MachineBootSet(ctx context.Context, tx store.Tx, machineID, boot string, now time.Time) error {
	_, err := tx.Exec(ctx, `INSERT INTO site_machine_boots (machine_id, boot, update_time) VALUES ($1, $2, $3)
		ON CONFLICT (machine_id) DO UPDATE SET boot = excluded.boot, update_time = excluded.update_time`, machineID, boot, now)
	return err
}

// SiteMachine is what a site agent knows of an enrolled machine.
type SiteMachine struct {
	ID         string
	Name       string
	MAC        string
	BMCDriver  string
	BMCAddress string
	State      State
	Boot       string
	ImageID    string
}

// SiteMachines lists a site's machines that are not retired, with the
// boot of each (BootDisk for one never power-cycled into another).
func SiteMachines(ctx context.Context, q store.Querier, siteID string) ([]SiteMachine, error) {
	rows, err := q.Query(ctx, `SELECT m.id, m.name, m.mac, m.bmc_driver, m.bmc_address, m.state, COALESCE(b.boot, $2), m.image_id
		FROM machines m LEFT JOIN site_machine_boots b ON b.machine_id = m.id
		WHERE m.site_id = $1 AND m.state <> 'retired' ORDER BY m.id`, siteID, BootDisk)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SiteMachine
	for rows.Next() {
		var m SiteMachine
		if err := rows.Scan(&m.ID, &m.Name, &m.MAC, &m.BMCDriver, &m.BMCAddress, &m.State, &m.Boot, &m.ImageID); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// SiteImageFetchClaim records the use of an image fetch capability, after
// pruning capabilities expired before claim.ClaimTime; it reports false
// when the capability was used (or is in use) already.
func SiteImageFetchClaim(ctx context.Context, tx store.Tx, tokenID, nodeID, sha string, claimTime, expireTime time.Time) (bool, error) {
	if _, err := tx.Exec(ctx, `DELETE FROM site_image_fetches WHERE expire_time < $1`, claimTime); err != nil {
		return false, err
	}
	n, err := tx.Exec(ctx, `INSERT INTO site_image_fetches (token_id, node_id, sha256, claim_time, expire_time)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (token_id) DO NOTHING`, tokenID, nodeID, sha, claimTime, expireTime)
	return n == 1, err
}

// SiteImageFetchRelease frees a claimed capability whose transfer did not
// complete.
func SiteImageFetchRelease(ctx context.Context, tx store.Tx, tokenID string) error {
	_, err := tx.Exec(ctx, `DELETE FROM site_image_fetches WHERE token_id = $1`, tokenID)
	return err
}
