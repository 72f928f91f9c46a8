package vps

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// Id prefixes of instances and volumes.
const (
	InstanceIDPrefix = "ins"
	VolumeIDPrefix   = "vol"
)

// Instance states.
const (
	StatePending  = "pending"
	StatePlacing  = "placing"
	StateBooting  = "booting"
	StateRunning  = "running"
	StateStopped  = "stopped"
	StateDeleting = "deleting"
	StateDeleted  = "deleted"
	StateFailed   = "failed"
	StateLost     = "lost"
)

// Volume states.
const (
	VolumeCreating  = "creating"
	VolumeAvailable = "available"
	VolumeAttaching = "attaching" // volume.attach sent, bcd has not confirmed
	VolumeAttached  = "attached"
	VolumeDetaching = "detaching" // volume.detach sent, the guest has not released it
	VolumeDeleting  = "deleting"
	VolumeDeleted   = "deleted"
	VolumeFailed    = "failed"
)

// Condition is one observation on an instance.
type Condition struct {
	Type       string    `json:"type"`
	Status     string    `json:"status"`
	Reason     string    `json:"reason"`
	Message    string    `json:"message"`
	UpdateTime time.Time `json:"update_time"`
}

// Instance is a row of instances.
type Instance struct {
	ID, TenantID, ProjectID, Name, State string
	FlavorID, FlavorName                 string
	VCPUs                                int32
	MemoryMiB                            int64
	DiskGiB                              int32
	Image, ImageSHA256                   string
	IPPoolID, IPPoolName                 string
	Address                              string
	PrefixLen                            int
	Gateway                              string
	DNS                                  []string
	MAC                                  string
	NetworkPolicy                        string
	SSHKeys                              []string
	// UserDataSealed is the user data sealed (userDataRef); OpenUserData
	// opens it.
	UserDataSealed        []byte
	PoolID, ReservationID string
	NodeID, NodeName      string
	CPUSet                string
	Accel, SSHAddress     string
	// SSHPrincipal is the one certificate principal the guest was seeded
	// to accept (SSHPrincipal(ID)); "" for a guest seeded without the CA
	// or before guests had their own.
	SSHPrincipal string
	// ProviderServerID is the provider's id of the server of an instance
	// of a provider pool (package providerpools), once it exists.
	ProviderServerID string
	// OnHostLost is keep or recreate (OnHostLostRecreate).
	OnHostLost string
	// BalloonFloorMiB is the least memory the host's balloon controller
	// leaves the guest (0: its memory is not ballooned).
	BalloonFloorMiB        int64
	Conditions             []Condition
	Message                string
	CreatedBy              string
	CreateTime, UpdateTime time.Time
}

// SetCondition sets or replaces a condition; it reports whether anything
// changed.
func (in *Instance) SetCondition(c Condition) bool {
	for i := range in.Conditions {
		if in.Conditions[i].Type == c.Type {
			old := in.Conditions[i]
			if old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
				return false
			}
			in.Conditions[i] = c
			return true
		}
	}
	in.Conditions = append(in.Conditions, c)
	return true
}

// Live reports whether the instance still holds (or may hold) a guest.
func (in *Instance) Live() bool {
	return in.State != StateDeleted && in.State != StateLost && in.State != StateFailed
}

const instanceColumns = `id, tenant_id, project_id, name, state, flavor_id, flavor_name, vcpus, memory_mib, disk_gib, image, image_sha256,
	ip_pool_id, ip_pool_name, address, prefix_len, gateway, dns, mac, network_policy, ssh_keys, user_data_sealed, pool_id, reservation_id,
	node_id, node_name, cpuset, accel, ssh_address, conditions, message, created_by, create_time, update_time, ssh_principal,
	provider_server_id, on_host_lost, balloon_floor_mib`

func scanInstance(row scanner) (Instance, error) {
	var (
		in               Instance
		dns, keys, conds string
	)
	if err := row.Scan(&in.ID, &in.TenantID, &in.ProjectID, &in.Name, &in.State, &in.FlavorID, &in.FlavorName, &in.VCPUs,
		&in.MemoryMiB, &in.DiskGiB, &in.Image, &in.ImageSHA256, &in.IPPoolID, &in.IPPoolName, &in.Address, &in.PrefixLen,
		&in.Gateway, &dns, &in.MAC, &in.NetworkPolicy, &keys, &in.UserDataSealed, &in.PoolID, &in.ReservationID, &in.NodeID,
		&in.NodeName, &in.CPUSet, &in.Accel, &in.SSHAddress, &conds, &in.Message, &in.CreatedBy, &in.CreateTime,
		&in.UpdateTime, &in.SSHPrincipal, &in.ProviderServerID, &in.OnHostLost, &in.BalloonFloorMiB); err != nil {
		return in, err
	}
	for _, f := range []struct {
		s string
		v any
	}{{dns, &in.DNS}, {keys, &in.SSHKeys}, {conds, &in.Conditions}} {
		if err := json.Unmarshal([]byte(f.s), f.v); err != nil {
			return in, fmt.Errorf("instance %s: %w", in.ID, err)
		}
	}
	return in, nil
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // plain lists and structs only
	}
	return string(b)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// InstanceInsert writes a new instance's row.
func InstanceInsert(ctx context.Context, tx store.Tx, in *Instance) error {
	_, err := tx.Exec(ctx, `INSERT INTO instances (`+instanceColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,
		$13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, $35, $36, $37, $38)`,
		in.ID, in.TenantID, in.ProjectID, in.Name, in.State, in.FlavorID, in.FlavorName, in.VCPUs, in.MemoryMiB, in.DiskGiB,
		in.Image, in.ImageSHA256, in.IPPoolID, in.IPPoolName, in.Address, in.PrefixLen, in.Gateway, jsonText(nonNil(in.DNS)),
		in.MAC, in.NetworkPolicy, jsonText(nonNil(in.SSHKeys)), nonNil(in.UserDataSealed), in.PoolID, in.ReservationID, in.NodeID, in.NodeName,
		in.CPUSet, in.Accel, in.SSHAddress, jsonText(nonNil(in.Conditions)), in.Message, in.CreatedBy, in.CreateTime, in.UpdateTime,
		in.SSHPrincipal, in.ProviderServerID, onHostLostOf(in.OnHostLost), in.BalloonFloorMiB)
	return err
}

// InstanceSave writes back an instance's mutable columns, guarded by the
// state it was read in; it reports false when another writer moved it.
func InstanceSave(ctx context.Context, tx store.Tx, in *Instance, from string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE instances SET state = $2, reservation_id = $3, node_id = $4, node_name = $5, cpuset = $6,
		accel = $7, ssh_address = $8, conditions = $9, message = $10, update_time = $11, address = $13, provider_server_id = $14
		WHERE id = $1 AND state = $12`,
		in.ID, in.State, in.ReservationID, in.NodeID, in.NodeName, in.CPUSet, in.Accel, in.SSHAddress,
		jsonText(nonNil(in.Conditions)), in.Message, in.UpdateTime, from, in.Address, in.ProviderServerID)
	return n == 1, err
}

// InstanceGet resolves a tenant's instance by id, or by name among those
// not deleted; lock adds a row lock clause (store.ForUpdate).
func InstanceGet(ctx context.Context, q store.Querier, tenantID, ref, lock string) (Instance, error) {
	if strings.HasPrefix(ref, InstanceIDPrefix+"_") {
		return scanInstance(q.QueryRow(ctx, `SELECT `+instanceColumns+` FROM instances WHERE tenant_id = $1 AND id = $2`+lock, tenantID, ref))
	}
	return scanInstance(q.QueryRow(ctx, `SELECT `+instanceColumns+` FROM instances WHERE tenant_id = $1 AND name = $2 AND state <> 'deleted'`+lock,
		tenantID, ref))
}

// InstanceByID reads an instance by id alone (the fleet's paths).
func InstanceByID(ctx context.Context, q store.Querier, id, lock string) (Instance, error) {
	return scanInstance(q.QueryRow(ctx, `SELECT `+instanceColumns+` FROM instances WHERE id = $1`+lock, id))
}

func scanInstances(rows store.Rows, err error) ([]Instance, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Instance
	for rows.Next() {
		in, err := scanInstance(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, rows.Err()
}

// InstanceList lists a tenant's instances by id after the cursor.
func InstanceList(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]Instance, error) {
	return scanInstances(q.Query(ctx, `SELECT `+instanceColumns+` FROM instances WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3`,
		tenantID, after, limit))
}

// InstancesOnNode lists the node's instances that may still hold a guest,
// locked for the caller's change.
func InstancesOnNode(ctx context.Context, tx store.Tx, nodeID string) ([]Instance, error) {
	return scanInstances(tx.Query(ctx, `SELECT `+instanceColumns+` FROM instances WHERE node_id = $1
		AND state IN ('pending', 'placing', 'booting', 'running', 'stopped', 'deleting') ORDER BY id`+store.ForUpdate(tx), nodeID))
}

// instancesAwaitingRecreate lists the ids of instances that lost their
// host and wait to be recreated (awaitingRecreate).
func instancesAwaitingRecreate(ctx context.Context, q store.Querier) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT id FROM instances WHERE state = 'placing' AND on_host_lost = 'recreate' AND node_id = '' ORDER BY id`))
}

// Volume is a row of volumes.
type Volume struct {
	ID, TenantID, Name     string
	SizeGiB                int32
	Format, State          string
	InstanceID, NodeID     string
	Message                string
	CreateTime, UpdateTime time.Time
}

const volumeColumns = `id, tenant_id, name, size_gib, format, state, instance_id, node_id, message, create_time, update_time`

func scanVolume(row scanner) (Volume, error) {
	var v Volume
	err := row.Scan(&v.ID, &v.TenantID, &v.Name, &v.SizeGiB, &v.Format, &v.State, &v.InstanceID, &v.NodeID, &v.Message,
		&v.CreateTime, &v.UpdateTime)
	return v, err
}

func scanVolumes(rows store.Rows, err error) ([]Volume, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Volume
	for rows.Next() {
		v, err := scanVolume(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// VolumeInsert writes a new volume's row.
func VolumeInsert(ctx context.Context, tx store.Tx, v *Volume) error {
	_, err := tx.Exec(ctx, `INSERT INTO volumes (`+volumeColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		v.ID, v.TenantID, v.Name, v.SizeGiB, v.Format, v.State, v.InstanceID, v.NodeID, v.Message, v.CreateTime, v.UpdateTime)
	return err
}

// VolumeSave writes back a volume's state, instance and message.
func VolumeSave(ctx context.Context, tx store.Tx, v *Volume) error {
	_, err := tx.Exec(ctx, `UPDATE volumes SET state = $2, instance_id = $3, message = $4, update_time = $5 WHERE id = $1`,
		v.ID, v.State, v.InstanceID, v.Message, v.UpdateTime)
	return err
}

// VolumeGet resolves a tenant's volume by id, or by name among those not
// deleted.
func VolumeGet(ctx context.Context, q store.Querier, tenantID, ref, lock string) (Volume, error) {
	if strings.HasPrefix(ref, VolumeIDPrefix+"_") {
		return scanVolume(q.QueryRow(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE tenant_id = $1 AND id = $2`+lock, tenantID, ref))
	}
	return scanVolume(q.QueryRow(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE tenant_id = $1 AND name = $2 AND state <> 'deleted'`+lock,
		tenantID, ref))
}

// VolumeByID reads a volume by id alone (the fleet's paths).
func VolumeByID(ctx context.Context, q store.Querier, id, lock string) (Volume, error) {
	return scanVolume(q.QueryRow(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE id = $1`+lock, id))
}

// VolumeList lists a tenant's volumes by id after the cursor.
func VolumeList(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]Volume, error) {
	return scanVolumes(q.Query(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3`,
		tenantID, after, limit))
}

// VolumesOfInstance lists the volumes attached to an instance.
func VolumesOfInstance(ctx context.Context, q store.Querier, instanceID string) ([]Volume, error) {
	return scanVolumes(q.Query(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE instance_id = $1 AND state <> 'deleted' ORDER BY id`, instanceID))
}

// PeerAddresses lists the addresses of a tenant's other instances leased
// from one IP pool that may hold a guest: what a private guest admits.
func PeerAddresses(ctx context.Context, q store.Querier, tenantID, ipPoolID, exceptID string) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT address FROM instances WHERE tenant_id = $1 AND ip_pool_id = $2 AND id <> $3
		AND state IN ('pending', 'placing', 'booting', 'running', 'stopped') ORDER BY address`, tenantID, ipPoolID, exceptID))
}

// instanceUserData is an instance's id and sealed user data: what a reseal
// reads.
type instanceUserData struct {
	ID     string
	Sealed []byte
}

// instancesUserDataSealed lists every instance that has user data, in
// every tenant and state, with its sealed user data.
func instancesUserDataSealed(ctx context.Context, q store.Querier) ([]instanceUserData, error) {
	rows, err := q.Query(ctx, `SELECT id, user_data_sealed FROM instances WHERE length(user_data_sealed) > 0 ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []instanceUserData
	for rows.Next() {
		var u instanceUserData
		if err := rows.Scan(&u.ID, &u.Sealed); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, rows.Err()
}

// instanceUserDataReseal replaces an instance's sealed user data with the
// same plaintext sealed anew, only while the row still holds old. It
// reports whether it did.
func instanceUserDataReseal(ctx context.Context, tx store.Tx, id string, old, resealed []byte) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE instances SET user_data_sealed = $3 WHERE id = $1 AND user_data_sealed = $2`, id, old, resealed)
	return n > 0, err
}

// InstancesWithFlavor counts the instances still holding (or about to
// hold) a guest of a flavor: a flavor in use is not deleted.
func InstancesWithFlavor(ctx context.Context, q store.Querier, flavorID string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM instances WHERE flavor_id = $1
		AND state IN ('pending', 'placing', 'booting', 'running', 'stopped', 'deleting')`, flavorID).Scan(&n)
	return n, err
}
