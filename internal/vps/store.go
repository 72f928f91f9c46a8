package vps

import (
	"context"
	"embed"
	"encoding/json"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Module is the migration module name.
const Module = "vps"

// Migrations returns the module's tables.
func Migrations() store.Migrations { return store.Embedded(Module, migrationsFS) }

// Id prefixes (envelope.NewID).
const (
	FlavorIDPrefix = "flv"
	IPPoolIDPrefix = "ipp"
)

// Flavor is a row of flavors.
type Flavor struct {
	ID          string
	TenantID    string
	Name        string
	VCPUs       int32
	MemoryMiB   int64
	DiskGiB     int32
	GPUs        int32
	GPUModel    string
	NUMAAffine  bool
	Pinned      bool
	Hugepages   bool
	Description string
	CreateTime  time.Time
	// Balloon lets the guest's memory be ballooned; MinMemoryMiB is the
	// floor (0: what the instance books).
	Balloon      bool
	MinMemoryMiB int64
}

// IPPool is a row of ip_pools. RangeFirst and RangeLast are the range's
// addresses as integers (IPv4 big-endian).
type IPPool struct {
	ID          string
	TenantID    string
	Name        string
	CIDR        string
	Gateway     string
	DNS         []string
	RangeFirst  int64
	RangeLast   int64
	Network     string
	Description string
	CreateTime  time.Time
	// Leased is the number of leases (filled by reads).
	Leased int64
}

// Size is the number of addresses in the pool's range.
func (p IPPool) Size() int64 { return p.RangeLast - p.RangeFirst + 1 }

// IPLease is a row of ip_leases.
type IPLease struct {
	PoolID     string
	Ordinal    int64
	Address    string
	Holder     string
	MAC        string
	CreateTime time.Time
}

type scanner interface{ Scan(...any) error }

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// refColumn is the column a reference names: the id when it carries the
// prefix, else the name.
func refColumn(ref, prefix string) string {
	if strings.HasPrefix(ref, prefix+"_") {
		return "id"
	}
	return "name"
}

const flavorColumns = `id, tenant_id, name, vcpus, memory_mib, disk_gib, gpus, gpu_model, numa_affine, pinned, hugepages,
	description, create_time, balloon, min_memory_mib`

func scanFlavor(row scanner) (Flavor, error) {
	var (
		f                           Flavor
		numa, pinned, huge, balloon int
	)
	err := row.Scan(&f.ID, &f.TenantID, &f.Name, &f.VCPUs, &f.MemoryMiB, &f.DiskGiB, &f.GPUs, &f.GPUModel, &numa, &pinned, &huge,
		&f.Description, &f.CreateTime, &balloon, &f.MinMemoryMiB)
	f.NUMAAffine, f.Pinned, f.Hugepages, f.Balloon = numa != 0, pinned != 0, huge != 0, balloon != 0
	return f, err
}

// FlavorInsert creates a flavor's row.
func FlavorInsert(ctx context.Context, tx store.Tx, f *Flavor) error {
	_, err := tx.Exec(ctx, `INSERT INTO flavors (`+flavorColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`,
		f.ID, f.TenantID, f.Name, f.VCPUs, f.MemoryMiB, f.DiskGiB, f.GPUs, f.GPUModel, boolInt(f.NUMAAffine), boolInt(f.Pinned),
		boolInt(f.Hugepages), f.Description, f.CreateTime, boolInt(f.Balloon), f.MinMemoryMiB)
	return err
}

// FlavorGet resolves a flavor of an owner (tenant id, "" for the platform)
// by id or name; lock adds a row lock clause (store.ForUpdate).
func FlavorGet(ctx context.Context, q store.Querier, tenantID, ref, lock string) (Flavor, error) {
	return scanFlavor(q.QueryRow(ctx, `SELECT `+flavorColumns+` FROM flavors WHERE tenant_id = $1 AND `+
		refColumn(ref, FlavorIDPrefix)+` = $2`+lock, tenantID, ref))
}

// FlavorList lists the flavors of the owners by id after the cursor.
func FlavorList(ctx context.Context, q store.Querier, tenantIDs []string, after string, limit int) ([]Flavor, error) {
	// At most two owners: the scope and the platform.
	t2 := tenantIDs[0]
	if len(tenantIDs) > 1 {
		t2 = tenantIDs[1]
	}
	rows, err := q.Query(ctx, `SELECT `+flavorColumns+` FROM flavors WHERE tenant_id IN ($1, $2) AND id > $3 ORDER BY id LIMIT $4`,
		tenantIDs[0], t2, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Flavor
	for rows.Next() {
		f, err := scanFlavor(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, rows.Err()
}

// FlavorDelete removes a flavor's row.
func FlavorDelete(ctx context.Context, tx store.Tx, id string) error {
	_, err := tx.Exec(ctx, `DELETE FROM flavors WHERE id = $1`, id)
	return err
}

const ipPoolColumns = `id, tenant_id, name, cidr, gateway, dns, range_first, range_last, network, description, create_time`

// ipPoolSelect reads pools with their lease counts.
const ipPoolSelect = `SELECT ` + ipPoolColumns + `, (SELECT COUNT(*) FROM ip_leases l WHERE l.pool_id = ip_pools.id) FROM ip_pools`

func scanIPPool(row scanner) (IPPool, error) {
	var (
		p   IPPool
		dns string
	)
	if err := row.Scan(&p.ID, &p.TenantID, &p.Name, &p.CIDR, &p.Gateway, &dns, &p.RangeFirst, &p.RangeLast, &p.Network,
		&p.Description, &p.CreateTime, &p.Leased); err != nil {
		return p, err
	}
	return p, json.Unmarshal([]byte(dns), &p.DNS)
}

// IPPoolInsert creates a pool's row.
func IPPoolInsert(ctx context.Context, tx store.Tx, p *IPPool) error {
	dns, err := json.Marshal(p.DNS)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO ip_pools (`+ipPoolColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		p.ID, p.TenantID, p.Name, p.CIDR, p.Gateway, string(dns), p.RangeFirst, p.RangeLast, p.Network, p.Description, p.CreateTime)
	return err
}

// IPPoolGet resolves a pool of an owner by id or name.
func IPPoolGet(ctx context.Context, q store.Querier, tenantID, ref string) (IPPool, error) {
	return scanIPPool(q.QueryRow(ctx, ipPoolSelect+` WHERE tenant_id = $1 AND `+refColumn(ref, IPPoolIDPrefix)+` = $2`, tenantID, ref))
}

// IPPoolLock takes the pool's row lock: leases of one pool are allocated
// one at a time.
func IPPoolLock(ctx context.Context, tx store.Tx, id string) (IPPool, error) {
	p, err := scanIPPool(tx.QueryRow(ctx, `SELECT `+ipPoolColumns+`, 0 FROM ip_pools WHERE id = $1`+store.ForUpdate(tx), id))
	return p, err
}

// IPPoolList lists an owner's pools by id after the cursor.
func IPPoolList(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]IPPool, error) {
	return IPPoolListOwners(ctx, q, tenantID, tenantID, after, limit)
}

// IPPoolListOwners lists the pools of two owners by id: a tenant's and the
// platform's ("") that it leases from as well.
func IPPoolListOwners(ctx context.Context, q store.Querier, owner1, owner2, after string, limit int) ([]IPPool, error) {
	rows, err := q.Query(ctx, ipPoolSelect+` WHERE tenant_id IN ($1, $2) AND id > $3 ORDER BY id LIMIT $4`, owner1, owner2, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []IPPool
	for rows.Next() {
		p, err := scanIPPool(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// IPPoolDelete removes a pool's row.
func IPPoolDelete(ctx context.Context, tx store.Tx, id string) error {
	_, err := tx.Exec(ctx, `DELETE FROM ip_pools WHERE id = $1`, id)
	return err
}

// IPLeaseOrdinals lists a pool's leased addresses (as integers) in order.
func IPLeaseOrdinals(ctx context.Context, q store.Querier, poolID string) ([]int64, error) {
	rows, err := q.Query(ctx, `SELECT ordinal FROM ip_leases WHERE pool_id = $1 ORDER BY ordinal`, poolID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var n int64
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// IPLeaseInsert writes a lease's row.
func IPLeaseInsert(ctx context.Context, tx store.Tx, l *IPLease) error {
	_, err := tx.Exec(ctx, `INSERT INTO ip_leases (pool_id, ordinal, address, holder, mac, create_time) VALUES ($1, $2, $3, $4, $5, $6)`,
		l.PoolID, l.Ordinal, l.Address, l.Holder, l.MAC, l.CreateTime)
	return err
}

// IPLeaseDeleteHolder removes the holder's lease of a pool; it reports
// whether there was one.
func IPLeaseDeleteHolder(ctx context.Context, tx store.Tx, poolID, holder string) (bool, error) {
	n, err := tx.Exec(ctx, `DELETE FROM ip_leases WHERE pool_id = $1 AND holder = $2`, poolID, holder)
	return n == 1, err
}

// IPLeaseList lists a pool's leases by address.
func IPLeaseList(ctx context.Context, q store.Querier, poolID string) ([]IPLease, error) {
	rows, err := q.Query(ctx, `SELECT pool_id, ordinal, address, holder, mac, create_time FROM ip_leases WHERE pool_id = $1 ORDER BY ordinal`, poolID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []IPLease
	for rows.Next() {
		var l IPLease
		if err := rows.Scan(&l.PoolID, &l.Ordinal, &l.Address, &l.Holder, &l.MAC, &l.CreateTime); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}
