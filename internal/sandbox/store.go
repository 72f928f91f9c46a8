package sandbox

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Module is the migration module name.
const Module = "sandbox"

// Migrations returns the module's tables.
func Migrations() store.Migrations { return store.Embedded(Module, migrationsFS) }

// Id prefixes (envelope.NewID).
const (
	TemplateIDPrefix = "sbt"
	SandboxIDPrefix  = "sbx"
	SnapshotIDPrefix = "sbs"
)

// Template and sandbox states.
const (
	TemplateActive   = "active"
	TemplateDeleting = "deleting"
	SandboxActive    = "active"
	SandboxDeleted   = "deleted"
)

// Template is a row of sandbox_templates.
type Template struct {
	ID, TenantID, Name, Image string
	FlavorID, FlavorName      string
	PoolID, IPPoolID          string
	ProjectID                 string
	DefaultTTL, MaxTTL        time.Duration
	WarmMin, WarmMax          int32
	Env                       map[string]string
	NetworkPolicy, Shape      string
	State, CreatedBy          string
	CreateTime, UpdateTime    time.Time
}

// Sandbox is a row of sandboxes.
type Sandbox struct {
	ID, TenantID, TemplateID, TemplateName string
	InstanceID, State, Origin              string
	// Resumed: a claimed warm guest answered instance.resume.
	Resumed bool
	// Restoring: the snapshot being restored until the host answers.
	Restoring                          string
	CreatedBy                          string
	ExpireTime, CreateTime, UpdateTime time.Time
	// MaxTTL is the template's max_ttl at create, which bounds extend
	// after the template is gone too (0: unknown, an older row).
	MaxTTL time.Duration
}

// Snapshot is a row of sandbox_snapshots.
type Snapshot struct {
	ID, TenantID, SandboxID, TemplateID, NodeID, Shape, State string
	CreateTime                                                time.Time
	// InstanceID is the instance it was taken of (its files sit under
	// that instance's id on the node).
	InstanceID string
	// Image and DiskGiB are its disk's image and size ("" and 0 for a
	// snapshot taken before they were recorded, which seeds nothing).
	Image   string
	DiskGiB int32
	// Keep: it outlives its sandbox and seeds new sandboxes.
	Keep bool
}

type scanner interface{ Scan(dest ...any) error }

const templateColumns = `id, tenant_id, name, image, flavor_id, flavor_name, pool_id, ip_pool_id, default_ttl_s, max_ttl_s,
	warm_min, warm_max, env, network_policy, shape, state, created_by, create_time, update_time, project_id`

func scanTemplate(row scanner) (Template, error) {
	var (
		t       Template
		def, mx int64
		env     string
	)
	if err := row.Scan(&t.ID, &t.TenantID, &t.Name, &t.Image, &t.FlavorID, &t.FlavorName, &t.PoolID, &t.IPPoolID, &def, &mx,
		&t.WarmMin, &t.WarmMax, &env, &t.NetworkPolicy, &t.Shape, &t.State, &t.CreatedBy, &t.CreateTime, &t.UpdateTime, &t.ProjectID); err != nil {
		return t, err
	}
	t.DefaultTTL, t.MaxTTL = time.Duration(def)*time.Second, time.Duration(mx)*time.Second
	if err := json.Unmarshal([]byte(env), &t.Env); err != nil {
		return t, fmt.Errorf("sandbox template %s: env: %w", t.ID, err)
	}
	return t, nil
}

func collect[T any](rows store.Rows, err error, scan func(scanner) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// TemplateInsert writes a new template.
func TemplateInsert(ctx context.Context, tx store.Tx, t *Template) error {
	env, err := json.Marshal(t.Env)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO sandbox_templates (`+templateColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
		$11, $12, $13, $14, $15, $16, $17, $18, $19, $20)`, t.ID, t.TenantID, t.Name, t.Image, t.FlavorID, t.FlavorName, t.PoolID, t.IPPoolID,
		int64(t.DefaultTTL/time.Second), int64(t.MaxTTL/time.Second), t.WarmMin, t.WarmMax, string(env), t.NetworkPolicy, t.Shape,
		t.State, t.CreatedBy, t.CreateTime, t.UpdateTime, t.ProjectID)
	return err
}

// TemplateGet reads a tenant's active template by name or id.
func TemplateGet(ctx context.Context, q store.Querier, tenantID, ref string) (Template, error) {
	return scanTemplate(q.QueryRow(ctx, `SELECT `+templateColumns+` FROM sandbox_templates
		WHERE tenant_id = $1 AND (id = $2 OR name = $2) AND state = 'active'`, tenantID, ref))
}

// TemplateByID reads a template in any state.
func TemplateByID(ctx context.Context, q store.Querier, id string) (Template, error) {
	return scanTemplate(q.QueryRow(ctx, `SELECT `+templateColumns+` FROM sandbox_templates WHERE id = $1`, id))
}

// TemplateList lists a tenant's active templates by id.
func TemplateList(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]Template, error) {
	rows, err := q.Query(ctx, `SELECT `+templateColumns+` FROM sandbox_templates WHERE tenant_id = $1 AND state = 'active' AND id > $2
		ORDER BY id LIMIT $3`, tenantID, after, limit)
	return collect(rows, err, scanTemplate)
}

// TemplatesAll lists every template of every tenant, for the warm pool
// reconciler.
func TemplatesAll(ctx context.Context, q store.Querier) ([]Template, error) {
	rows, err := q.Query(ctx, `SELECT `+templateColumns+` FROM sandbox_templates ORDER BY id`)
	return collect(rows, err, scanTemplate)
}

// TemplateSetState moves a template to state.
func TemplateSetState(ctx context.Context, tx store.Tx, id, state string, now time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE sandbox_templates SET state = $2, update_time = $3 WHERE id = $1`, id, state, now)
	return err
}

// TemplateDelete removes a drained template's row.
func TemplateDelete(ctx context.Context, tx store.Tx, id string) error {
	_, err := tx.Exec(ctx, `DELETE FROM sandbox_templates WHERE id = $1 AND state = 'deleting'`, id)
	return err
}

// Warm is a row of sandbox_warm.
type Warm struct {
	InstanceID, TenantID, TemplateID, Shape string
	CreateTime                              time.Time
}

func scanWarm(row scanner) (Warm, error) {
	var w Warm
	err := row.Scan(&w.InstanceID, &w.TenantID, &w.TemplateID, &w.Shape, &w.CreateTime)
	return w, err
}

// WarmInsert records a warm instance.
func WarmInsert(ctx context.Context, tx store.Tx, w *Warm) error {
	_, err := tx.Exec(ctx, `INSERT INTO sandbox_warm (instance_id, tenant_id, template_id, shape, create_time) VALUES ($1, $2, $3, $4, $5)`,
		w.InstanceID, w.TenantID, w.TemplateID, w.Shape, w.CreateTime)
	return err
}

// WarmOfTemplate lists a template's warm instances, oldest first.
func WarmOfTemplate(ctx context.Context, q store.Querier, templateID string) ([]Warm, error) {
	rows, err := q.Query(ctx, `SELECT instance_id, tenant_id, template_id, shape, create_time FROM sandbox_warm
		WHERE template_id = $1 ORDER BY create_time, instance_id`, templateID)
	return collect(rows, err, scanWarm)
}

// WarmClaim takes the oldest booted warm instance of a template shape and
// removes it from the pool, in tx. On PostgreSQL the row is locked with
// SKIP LOCKED, so concurrent creates never wait on, nor take, the same
// instance; SQLite has one writer. It returns "" when none is ready.
func WarmClaim(ctx context.Context, tx store.Tx, templateID, shape string) (string, error) {
	lock := ""
	if tx.Dialect() == store.Postgres {
		lock = " FOR UPDATE OF w SKIP LOCKED"
	}
	var id string
	err := tx.QueryRow(ctx, `SELECT w.instance_id FROM sandbox_warm w JOIN instances i ON i.id = w.instance_id
		WHERE w.template_id = $1 AND w.shape = $2 AND i.state = 'running'
		ORDER BY w.create_time, w.instance_id LIMIT 1`+lock, templateID, shape).Scan(&id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return "", nil
		}
		return "", err
	}
	n, err := WarmRemove(ctx, tx, id)
	if err != nil {
		return "", err
	}
	if n != 1 {
		return "", fmt.Errorf("warm instance %s was claimed twice", id)
	}
	return id, nil
}

// WarmRemove drops a warm instance's row; it returns the rows removed.
func WarmRemove(ctx context.Context, tx store.Tx, instanceID string) (int64, error) {
	return tx.Exec(ctx, `DELETE FROM sandbox_warm WHERE instance_id = $1`, instanceID)
}

const sandboxColumns = `id, tenant_id, template_id, template_name, instance_id, state, origin, resumed, created_by,
	expire_time, create_time, update_time, restoring, max_ttl_s`

func scanSandbox(row scanner) (Sandbox, error) {
	var (
		s       Sandbox
		resumed int
		maxTTL  int64
	)
	err := row.Scan(&s.ID, &s.TenantID, &s.TemplateID, &s.TemplateName, &s.InstanceID, &s.State, &s.Origin,
		&resumed, &s.CreatedBy, &s.ExpireTime, &s.CreateTime, &s.UpdateTime, &s.Restoring, &maxTTL)
	s.Resumed = resumed != 0
	s.MaxTTL = time.Duration(maxTTL) * time.Second
	return s, err
}

// SandboxInsert writes a new sandbox.
func SandboxInsert(ctx context.Context, tx store.Tx, s *Sandbox) error {
	_, err := tx.Exec(ctx, `INSERT INTO sandboxes (`+sandboxColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		s.ID, s.TenantID, s.TemplateID, s.TemplateName, s.InstanceID, s.State, s.Origin, boolInt(s.Resumed), s.CreatedBy, s.ExpireTime,
		s.CreateTime, s.UpdateTime, s.Restoring, int64(s.MaxTTL/time.Second))
	return err
}

// SandboxSave writes a sandbox's state, expiry and the snapshot it is
// being restored to.
func SandboxSave(ctx context.Context, tx store.Tx, s *Sandbox) error {
	_, err := tx.Exec(ctx, `UPDATE sandboxes SET state = $2, expire_time = $3, update_time = $4, restoring = $5 WHERE id = $1`,
		s.ID, s.State, s.ExpireTime, s.UpdateTime, s.Restoring)
	return err
}

// SandboxRestored ends the restore of snapshotID on the sandbox running
// instanceID (whatever its host answered); a sandbox restoring another
// snapshot, or none, is left alone.
func SandboxRestored(ctx context.Context, tx store.Tx, instanceID, snapshotID string, now time.Time) (int64, error) {
	return tx.Exec(ctx, `UPDATE sandboxes SET restoring = '', update_time = $3 WHERE instance_id = $1 AND restoring = $2`,
		instanceID, snapshotID, now)
}

// SandboxGet reads a tenant's sandbox by id (lock: store.ForUpdate or "").
func SandboxGet(ctx context.Context, q store.Querier, tenantID, id, lock string) (Sandbox, error) {
	s, err := scanSandbox(q.QueryRow(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE tenant_id = $1 AND id = $2`+lock, tenantID, id))
	return s, err
}

// SandboxByInstance reads the sandbox an instance runs.
func SandboxByInstance(ctx context.Context, q store.Querier, instanceID string) (Sandbox, error) {
	return scanSandbox(q.QueryRow(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE instance_id = $1`, instanceID))
}

// SandboxList lists a tenant's sandboxes that are not deleted, by id.
func SandboxList(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]Sandbox, error) {
	rows, err := q.Query(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE tenant_id = $1 AND state = 'active' AND id > $2
		ORDER BY id LIMIT $3`, tenantID, after, limit)
	return collect(rows, err, scanSandbox)
}

// SandboxesExpired lists active sandboxes whose expiry has passed.
func SandboxesExpired(ctx context.Context, q store.Querier, limit int) ([]Sandbox, error) {
	rows, err := q.Query(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE state = 'active' AND expire_time <= compute_now()
		ORDER BY expire_time, id LIMIT $1`, limit)
	return collect(rows, err, scanSandbox)
}

const snapshotColumns = `id, tenant_id, sandbox_id, template_id, node_id, shape, state, create_time, instance_id, image, disk_gib, keep`

func scanSnapshot(row scanner) (Snapshot, error) {
	var (
		s    Snapshot
		keep int
	)
	err := row.Scan(&s.ID, &s.TenantID, &s.SandboxID, &s.TemplateID, &s.NodeID, &s.Shape, &s.State, &s.CreateTime,
		&s.InstanceID, &s.Image, &s.DiskGiB, &keep)
	s.Keep = keep != 0
	return s, err
}

// SnapshotInsert writes a new snapshot.
func SnapshotInsert(ctx context.Context, tx store.Tx, s *Snapshot) error {
	_, err := tx.Exec(ctx, `INSERT INTO sandbox_snapshots (`+snapshotColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		s.ID, s.TenantID, s.SandboxID, s.TemplateID, s.NodeID, s.Shape, s.State, s.CreateTime, s.InstanceID, s.Image, s.DiskGiB, boolInt(s.Keep))
	return err
}

// SnapshotGet reads a tenant's snapshot: another tenant's is not found.
func SnapshotGet(ctx context.Context, q store.Querier, tenantID, id, lock string) (Snapshot, error) {
	s, err := scanSnapshot(q.QueryRow(ctx, `SELECT `+snapshotColumns+` FROM sandbox_snapshots WHERE tenant_id = $1 AND id = $2`+lock, tenantID, id))
	return s, err
}

// SnapshotList lists a tenant's snapshots by id (oldest first), of one
// sandbox when sandboxID is set.
func SnapshotList(ctx context.Context, q store.Querier, tenantID, sandboxID, after string, limit int) ([]Snapshot, error) {
	rows, err := q.Query(ctx, `SELECT `+snapshotColumns+` FROM sandbox_snapshots WHERE tenant_id = $1 AND ($2 = '' OR sandbox_id = $2)
		AND id > $3 ORDER BY id LIMIT $4`, tenantID, sandboxID, after, limit)
	return collect(rows, err, scanSnapshot)
}

// SnapshotsOfTenant lists every snapshot of a tenant (a tenant delete
// removes their files).
func SnapshotsOfTenant(ctx context.Context, q store.Querier, tenantID string) ([]Snapshot, error) {
	rows, err := q.Query(ctx, `SELECT `+snapshotColumns+` FROM sandbox_snapshots WHERE tenant_id = $1 ORDER BY id`, tenantID)
	return collect(rows, err, scanSnapshot)
}

// SnapshotsKept lists the snapshots of a sandbox that its delete leaves:
// kept and not failed (a saving one completes first, as its host runs the
// instance's commands in order).
func SnapshotsKept(ctx context.Context, q store.Querier, sandboxID string) ([]Snapshot, error) {
	rows, err := q.Query(ctx, `SELECT `+snapshotColumns+` FROM sandbox_snapshots WHERE sandbox_id = $1 AND keep = 1
		AND state IN ('saving', 'ready') ORDER BY id`, sandboxID)
	return collect(rows, err, scanSnapshot)
}

// SnapshotsDeleteOfSandbox removes a sandbox's snapshot rows but those
// kept (SnapshotsKept): the others live in its instance's directory on
// the host, which the instance's delete removes, so a row left behind
// would offer a snapshot that is gone.
func SnapshotsDeleteOfSandbox(ctx context.Context, tx store.Tx, sandboxID string) error {
	_, err := tx.Exec(ctx, `DELETE FROM sandbox_snapshots WHERE sandbox_id = $1 AND NOT (keep = 1 AND state IN ('saving', 'ready'))`, sandboxID)
	return err
}

// SnapshotDelete removes one snapshot row.
func SnapshotDelete(ctx context.Context, tx store.Tx, id string) error {
	_, err := tx.Exec(ctx, `DELETE FROM sandbox_snapshots WHERE id = $1`, id)
	return err
}

// SnapshotFinish moves a saving snapshot taken on nodeID to ready or
// failed; a snapshot already finished, or another node's, is left alone.
func SnapshotFinish(ctx context.Context, tx store.Tx, id, nodeID, state string) error {
	_, err := tx.Exec(ctx, `UPDATE sandbox_snapshots SET state = $3 WHERE id = $1 AND node_id = $2 AND state = 'saving'`, id, nodeID, state)
	return err
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// SandboxResumed marks the sandbox on a claimed warm instance resumed.
func SandboxResumed(ctx context.Context, tx store.Tx, instanceID string, now time.Time) (int64, error) {
	return tx.Exec(ctx, `UPDATE sandboxes SET resumed = 1, update_time = $2 WHERE instance_id = $1 AND resumed = 0`, instanceID, now)
}

// OwnerOf names the sandbox or warm pool an instance belongs to, "" when
// none (vps.InstanceService.SetOwner).
func OwnerOf(ctx context.Context, q store.Querier, instanceID string) (string, error) {
	var id string
	err := q.QueryRow(ctx, `SELECT id FROM sandboxes WHERE instance_id = $1 AND state = 'active'`, instanceID).Scan(&id)
	if err == nil {
		return "sandbox " + id + " (use sandboxes delete)", nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	err = q.QueryRow(ctx, `SELECT template_id FROM sandbox_warm WHERE instance_id = $1`, instanceID).Scan(&id)
	if err == nil {
		return "the warm pool of sandbox template " + id, nil
	}
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	return "", err
}
