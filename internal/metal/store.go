package metal

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Module is the migration module name.
const Module = "metal"

// Migrations returns the module's tables.
func Migrations() store.Migrations { return store.Embedded(Module, migrationsFS) }

// Id prefixes (envelope.NewID).
const (
	SiteIDPrefix       = "site"
	MachineIDPrefix    = "mch"
	CredentialIDPrefix = "bmccred"
)

// DHCP modes of a site.
const (
	DHCPFull  = "full"
	DHCPProxy = "proxy"
)

// Site is a row of sites.
type Site struct {
	ID          string
	TenantID    string
	Name        string
	Networks    []string
	DHCPMode    string
	Description string
	CreateTime  time.Time
	UpdateTime  time.Time
}

// Machine is a row of machines.
type Machine struct {
	ID               string
	TenantID         string
	SiteID           string
	Name             string
	BMCDriver        string
	BMCAddress       string
	BMCHost          string
	BMCUsername      string
	BMCCredentialRef string
	// BMCCredential is the sealed password (pki.Sealer, ref
	// "machine-bmc/<BMCCredentialRef>").
	BMCCredential   []byte
	MAC             string
	HardwareProfile string
	State           State
	WorkflowID      string
	Operation       string
	// Commissioned: a commissioning succeeded once, so an inspection of a
	// commissioned machine ends ready.
	Commissioned     bool
	ImageID          string
	ImageName        string
	FailedOperation  string
	FailedStep       string
	FailureReason    string
	FailureLogs      string
	Inventory        map[string]any
	EraseRecord      map[string]any
	RescueExpireTime *time.Time
	// BMCPendingRef names the password a rotation is setting (sealed in
	// BMCPendingCredential under "machine-bmc/<BMCPendingRef>"); "" when
	// no rotation is out. It becomes BMCCredentialRef only on the site
	// agent's signed success.
	BMCPendingRef        string
	BMCPendingCredential []byte
	// MaintenanceReason, when set, holds the machine out of every workflow
	// but a BMC rotation: a rotation failed and the BMC needs a look.
	MaintenanceReason string
	MaintenanceTime   *time.Time
	// LeaseID is the dedicated-root lease the machine is under ("" for
	// none): while set, only the lease's own workflows run on it.
	LeaseID string
	// FirmwareBaseline is the firmware (BIOS, board) the last commissioning
	// saw; a lease's teardown must find the same.
	FirmwareBaseline map[string]any
	CreateTime       time.Time
	UpdateTime       time.Time
}

const siteColumns = `id, tenant_id, name, networks, dhcp_mode, description, create_time, update_time`

func scanSite(row interface{ Scan(...any) error }) (Site, error) {
	var (
		s    Site
		nets string
	)
	if err := row.Scan(&s.ID, &s.TenantID, &s.Name, &nets, &s.DHCPMode, &s.Description, &s.CreateTime, &s.UpdateTime); err != nil {
		return s, err
	}
	return s, json.Unmarshal([]byte(nets), &s.Networks)
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil || string(b) == "null" {
		return "{}"
	}
	return string(b)
}

// SiteInsert creates a site's row.
func SiteInsert(ctx context.Context, tx store.Tx, s *Site) error {
	nets, err := json.Marshal(s.Networks)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO sites (`+siteColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		s.ID, s.TenantID, s.Name, string(nets), s.DHCPMode, s.Description, s.CreateTime, s.UpdateTime)
	return err
}

// SiteUpdate writes a site's networks, DHCP mode and description.
func SiteUpdate(ctx context.Context, tx store.Tx, s *Site) error {
	nets, err := json.Marshal(s.Networks)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE sites SET networks = $2, dhcp_mode = $3, description = $4, update_time = $5 WHERE id = $1`,
		s.ID, string(nets), s.DHCPMode, s.Description, s.UpdateTime)
	return err
}

// SiteGet resolves a site of an owner (tenant id, ” for the platform) by id
// (site_…) or name; lock adds a row lock clause (store.ForUpdate).
func SiteGet(ctx context.Context, q store.Querier, tenantID, ref, lock string) (Site, error) {
	col := "name"
	if strings.HasPrefix(ref, SiteIDPrefix+"_") {
		col = "id"
	}
	return scanSite(q.QueryRow(ctx, `SELECT `+siteColumns+` FROM sites WHERE tenant_id = $1 AND `+col+` = $2`+lock, tenantID, ref))
}

// SiteList lists an owner's sites by id after the cursor.
func SiteList(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]Site, error) {
	rows, err := q.Query(ctx, `SELECT `+siteColumns+` FROM sites WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3`,
		tenantID, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Site
	for rows.Next() {
		s, err := scanSite(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// SiteDelete deletes a site's row; it reports whether there was one.
func SiteDelete(ctx context.Context, tx store.Tx, id string) (bool, error) {
	n, err := tx.Exec(ctx, `DELETE FROM sites WHERE id = $1`, id)
	return n == 1, err
}

const machineColumns = `id, tenant_id, site_id, name, bmc_driver, bmc_address, bmc_host, bmc_username, bmc_credential_ref,
	bmc_credential, mac, hardware_profile, state, workflow_id, operation, commissioned, image_id, image_name,
	failed_operation, failed_step, failure_reason, failure_logs, inventory, erase_record, rescue_expire_time,
	create_time, update_time, bmc_pending_ref, bmc_pending_credential, maintenance_reason, maintenance_time, lease_id,
	firmware_baseline`

func scanMachine(row interface{ Scan(...any) error }) (Machine, error) {
	var (
		m             Machine
		commissioned  int
		inv, erase    string
		baseline      string
		rescueExpires *time.Time
	)
	if err := row.Scan(&m.ID, &m.TenantID, &m.SiteID, &m.Name, &m.BMCDriver, &m.BMCAddress, &m.BMCHost, &m.BMCUsername,
		&m.BMCCredentialRef, &m.BMCCredential, &m.MAC, &m.HardwareProfile, &m.State, &m.WorkflowID, &m.Operation,
		&commissioned, &m.ImageID, &m.ImageName, &m.FailedOperation, &m.FailedStep, &m.FailureReason, &m.FailureLogs,
		&inv, &erase, &rescueExpires, &m.CreateTime, &m.UpdateTime, &m.BMCPendingRef, &m.BMCPendingCredential,
		&m.MaintenanceReason, &m.MaintenanceTime, &m.LeaseID, &baseline); err != nil {
		return m, err
	}
	var err error
	if m.FirmwareBaseline, err = decodeBaseline(baseline); err != nil {
		return m, err
	}
	m.Commissioned = commissioned != 0
	m.RescueExpireTime = rescueExpires
	if err := json.Unmarshal([]byte(inv), &m.Inventory); err != nil {
		return m, err
	}
	return m, json.Unmarshal([]byte(erase), &m.EraseRecord)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// MachineInsert creates a machine's row.
func MachineInsert(ctx context.Context, tx store.Tx, m *Machine) error {
	_, err := tx.Exec(ctx, `INSERT INTO machines (`+machineColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
		$11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33)`,
		m.ID, m.TenantID, m.SiteID, m.Name, m.BMCDriver, m.BMCAddress, m.BMCHost, m.BMCUsername, m.BMCCredentialRef,
		m.BMCCredential, m.MAC, m.HardwareProfile, string(m.State), m.WorkflowID, m.Operation, boolInt(m.Commissioned),
		m.ImageID, m.ImageName, m.FailedOperation, m.FailedStep, m.FailureReason, m.FailureLogs, jsonText(m.Inventory),
		jsonText(m.EraseRecord), m.RescueExpireTime, m.CreateTime, m.UpdateTime, m.BMCPendingRef, m.BMCPendingCredential,
		m.MaintenanceReason, m.MaintenanceTime, m.LeaseID, jsonText(m.FirmwareBaseline))
	return err
}

// MachineUpdate writes a machine's lifecycle fields (state, workflow,
// image, failure, inventory, erase record, rescue, maintenance, lease,
// firmware baseline).
func MachineUpdate(ctx context.Context, tx store.Tx, m *Machine) error {
	_, err := tx.Exec(ctx, `UPDATE machines SET state = $2, workflow_id = $3, operation = $4, commissioned = $5, image_id = $6,
		image_name = $7, failed_operation = $8, failed_step = $9, failure_reason = $10, failure_logs = $11, inventory = $12,
		erase_record = $13, rescue_expire_time = $14, update_time = $15, maintenance_reason = $16, maintenance_time = $17,
		lease_id = $18, firmware_baseline = $19 WHERE id = $1`,
		m.ID, string(m.State), m.WorkflowID, m.Operation, boolInt(m.Commissioned), m.ImageID, m.ImageName, m.FailedOperation,
		m.FailedStep, m.FailureReason, m.FailureLogs, jsonText(m.Inventory), jsonText(m.EraseRecord), m.RescueExpireTime,
		m.UpdateTime, m.MaintenanceReason, m.MaintenanceTime, m.LeaseID, jsonText(m.FirmwareBaseline))
	return err
}

// MachineBMCPendingSet seals a rotation's new password into the machine's
// pending slot; the current credential is untouched.
func MachineBMCPendingSet(ctx context.Context, tx store.Tx, id, ref string, sealed []byte, now time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE machines SET bmc_pending_ref = $2, bmc_pending_credential = $3, update_time = $4 WHERE id = $1`,
		id, ref, sealed, now)
	return err
}

// MachineBMCPromote makes the pending credential named ref current and
// empties the slot; false when the slot holds another ref (or none), so a
// stale success cannot promote a newer rotation's password.
func MachineBMCPromote(ctx context.Context, tx store.Tx, id, ref string, now time.Time) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE machines SET bmc_credential_ref = bmc_pending_ref, bmc_credential = bmc_pending_credential,
		bmc_pending_ref = '', bmc_pending_credential = NULL, update_time = $3
		WHERE id = $1 AND bmc_pending_ref = $2 AND bmc_pending_ref <> '' AND bmc_pending_credential IS NOT NULL`, id, ref, now)
	return n == 1, err
}

// MachineBMCPendingClear empties the pending slot: the current credential
// stays.
func MachineBMCPendingClear(ctx context.Context, tx store.Tx, id string, now time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE machines SET bmc_pending_ref = '', bmc_pending_credential = NULL, update_time = $2 WHERE id = $1`,
		id, now)
	return err
}

// MachineGet resolves a machine of an owner by id (mch_…) or name.
func MachineGet(ctx context.Context, q store.Querier, tenantID, ref, lock string) (Machine, error) {
	col := "name"
	if strings.HasPrefix(ref, MachineIDPrefix+"_") {
		col = "id"
	}
	return scanMachine(q.QueryRow(ctx, `SELECT `+machineColumns+` FROM machines WHERE tenant_id = $1 AND `+col+` = $2`+lock,
		tenantID, ref))
}

// MachineByID reads a machine by id alone (the engine's callbacks).
func MachineByID(ctx context.Context, q store.Querier, id, lock string) (Machine, error) {
	return scanMachine(q.QueryRow(ctx, `SELECT `+machineColumns+` FROM machines WHERE id = $1`+lock, id))
}

// MachineListParams filters MachineList.
type MachineListParams struct {
	TenantID string
	SiteID   string
	State    string
	After    string
	Limit    int
}

// MachineList lists an owner's machines by id after the cursor.
func MachineList(ctx context.Context, q store.Querier, p MachineListParams) ([]Machine, error) {
	rows, err := q.Query(ctx, `SELECT `+machineColumns+` FROM machines WHERE tenant_id = $1 AND id > $2
		AND ($3 = '' OR site_id = $3) AND ($4 = '' OR state = $4) ORDER BY id LIMIT $5`,
		p.TenantID, p.After, p.SiteID, p.State, p.Limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Machine
	for rows.Next() {
		m, err := scanMachine(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// MachineCountActive counts a site's machines that are not retired.
func MachineCountActive(ctx context.Context, q store.Querier, siteID string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM machines WHERE site_id = $1 AND state <> 'retired'`, siteID).Scan(&n)
	return n, err
}

// MachineHostsOfSite lists the BMC hosts of a site's machines that are not
// retired (a site update must keep them in its networks).
func MachineHostsOfSite(ctx context.Context, q store.Querier, siteID string) (map[string]string, error) {
	rows, err := q.Query(ctx, `SELECT name, bmc_host FROM machines WHERE site_id = $1 AND state <> 'retired'`, siteID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, host string
		if err := rows.Scan(&name, &host); err != nil {
			return nil, err
		}
		out[name] = host
	}
	return out, rows.Err()
}

// MachineMACInUse reports whether a machine that is not retired already
// boots from mac, in any tenant.
func MachineMACInUse(ctx context.Context, q store.Querier, mac string) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM machines WHERE mac = $1 AND state <> 'retired'`, mac).Scan(&n)
	return n > 0, err
}

// RetiredMachinesDelete deletes a site's retired machines (a site delete).
func RetiredMachinesDelete(ctx context.Context, tx store.Tx, siteID string) error {
	_, err := tx.Exec(ctx, `DELETE FROM machines WHERE site_id = $1 AND state = 'retired'`, siteID)
	return err
}

// MachinesRescueExpired lists machines in rescue, with no workflow, whose
// rescue ended by compute_now().
func MachinesRescueExpired(ctx context.Context, q store.Querier, limit int) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT id FROM machines WHERE state = 'rescue' AND workflow_id = ''
		AND rescue_expire_time <= compute_now() ORDER BY id LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// sealedCredential is a machine's sealed BMC password and the ref it is
// sealed under: what a reseal reads.
type sealedCredential struct {
	ID, CredentialRef string
	Sealed            []byte
}

// machineCredentials lists every machine's sealed BMC password, of every
// tenant and state.
func machineCredentials(ctx context.Context, q store.Querier) ([]sealedCredential, error) {
	rows, err := q.Query(ctx, `SELECT id, bmc_credential_ref, bmc_credential FROM machines ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []sealedCredential
	for rows.Next() {
		var c sealedCredential
		if err := rows.Scan(&c.ID, &c.CredentialRef, &c.Sealed); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// machineCredentialReseal replaces a machine's sealed BMC password with
// the same plaintext sealed anew, only while the row still holds old: a
// write since the read wins. It reports whether it replaced it.
func machineCredentialReseal(ctx context.Context, tx store.Tx, id string, old, resealed []byte) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE machines SET bmc_credential = $3 WHERE id = $1 AND bmc_credential = $2`, id, old, resealed)
	return n > 0, err
}

// MachineNamingHardwareProfile names a machine of the tenant, not retired,
// whose hardware profile is name ("" none).
func MachineNamingHardwareProfile(ctx context.Context, q store.Querier, tenantID, name string) (string, error) {
	var m string
	err := q.QueryRow(ctx, `SELECT name FROM machines WHERE tenant_id = $1 AND hardware_profile = $2 AND state <> 'retired'
		ORDER BY name LIMIT 1`, tenantID, name).Scan(&m)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	return m, err
}
