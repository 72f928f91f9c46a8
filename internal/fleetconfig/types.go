package fleetconfig

// APIVersion is the apiVersion every document carries.
const APIVersion = "bettercompute.io/v1"

// The kinds this version covers.
const (
	KindFlavor = "Flavor"
	KindIPPool = "IPPool"
	KindPool   = "Pool"
	KindQuota  = "Quota"
)

// Kinds lists the kinds in dependency order: pools come before the quotas
// that name them.
var Kinds = []string{KindPool, KindFlavor, KindIPPool, KindQuota}

// Metadata names a document's object. Tenant is a tenant name (or id);
// empty means the platform's for flavors and IP pools, and the default
// tenant (--tenant) for pools and quotas.
type Metadata struct {
	Name   string `yaml:"name" json:"name"`
	Tenant string `yaml:"tenant,omitempty" json:"tenant,omitempty"`
}

// FlavorSpec is a flavor. The API has no update for flavors: any change
// is a replace.
type FlavorSpec struct {
	VCPUs        int32  `yaml:"vcpus,omitempty" json:"vcpus,omitempty"`
	MemoryMiB    int64  `yaml:"memoryMiB,omitempty" json:"memoryMiB,omitempty"`
	DiskGiB      int32  `yaml:"diskGiB,omitempty" json:"diskGiB,omitempty"`
	GPUs         int32  `yaml:"gpus,omitempty" json:"gpus,omitempty"`
	GPUModel     string `yaml:"gpuModel,omitempty" json:"gpuModel,omitempty"`
	NUMAAffine   bool   `yaml:"numaAffine,omitempty" json:"numaAffine,omitempty"`
	Pinned       bool   `yaml:"pinned,omitempty" json:"pinned,omitempty"`
	Hugepages    bool   `yaml:"hugepages,omitempty" json:"hugepages,omitempty"`
	Balloon      bool   `yaml:"balloon,omitempty" json:"balloon,omitempty"`
	MinMemoryMiB int64  `yaml:"minMemoryMiB,omitempty" json:"minMemoryMiB,omitempty"`
	Description  string `yaml:"description,omitempty" json:"description,omitempty"`
}

// IPPoolSpec is an IP pool. The API has no update for IP pools: any
// change is a replace. An empty gateway or range takes the API's default
// and is not compared.
type IPPoolSpec struct {
	CIDR        string   `yaml:"cidr,omitempty" json:"cidr,omitempty"`
	Gateway     string   `yaml:"gateway,omitempty" json:"gateway,omitempty"`
	DNS         []string `yaml:"dns,omitempty" json:"dns,omitempty"`
	RangeStart  string   `yaml:"rangeStart,omitempty" json:"rangeStart,omitempty"`
	RangeEnd    string   `yaml:"rangeEnd,omitempty" json:"rangeEnd,omitempty"`
	Network     string   `yaml:"network,omitempty" json:"network,omitempty"`
	Description string   `yaml:"description,omitempty" json:"description,omitempty"`
}

// QuotaSpec is the quota of one scope: the tenant or a project, optionally
// one GPU model or one pool. The scope is the quota's identity; a limit
// left out is unlimited. metadata.name only names the document.
type QuotaSpec struct {
	Project  string   `yaml:"project,omitempty" json:"project,omitempty"`
	Model    string   `yaml:"model,omitempty" json:"model,omitempty"`
	Pool     string   `yaml:"pool,omitempty" json:"pool,omitempty"`
	GPUs     *int32   `yaml:"gpus,omitempty" json:"gpus,omitempty"`
	GPUHours *float64 `yaml:"gpuHours,omitempty" json:"gpuHours,omitempty"`
}

// PoolSpec is a pool: its selector (the shorthand of pools create
// --selector), who it is offered to, and its policy.
type PoolSpec struct {
	Selector string `yaml:"selector,omitempty" json:"selector,omitempty"`
	// OfferTo is "all", or consumer tenant names; empty keeps the pool
	// private.
	OfferTo []string    `yaml:"offerTo,omitempty" json:"offerTo,omitempty"`
	Policy  *PoolPolicy `yaml:"policy,omitempty" json:"policy,omitempty"`
}

// PoolPolicy mirrors the API's PoolPolicy (docs/capacity.md).
type PoolPolicy struct {
	PerGPU              *PerGPU      `yaml:"perGpu,omitempty" json:"perGpu,omitempty"`
	HostReserve         *HostReserve `yaml:"hostReserve,omitempty" json:"hostReserve,omitempty"`
	GPUSharing          string       `yaml:"gpuSharing,omitempty" json:"gpuSharing,omitempty"`
	SlotsPerGPU         int32        `yaml:"slotsPerGpu,omitempty" json:"slotsPerGpu,omitempty"`
	SingleTenant        bool         `yaml:"singleTenant,omitempty" json:"singleTenant,omitempty"`
	MaxPending          int32        `yaml:"maxPending,omitempty" json:"maxPending,omitempty"`
	MinDurationSeconds  int64        `yaml:"minDurationSeconds,omitempty" json:"minDurationSeconds,omitempty"`
	MaxDurationSeconds  int64        `yaml:"maxDurationSeconds,omitempty" json:"maxDurationSeconds,omitempty"`
	OnNodeLost          string       `yaml:"onNodeLost,omitempty" json:"onNodeLost,omitempty"`
	StartHorizonSeconds int64        `yaml:"startHorizonSeconds,omitempty" json:"startHorizonSeconds,omitempty"`
	RequiredAttestor    string       `yaml:"requiredAttestor,omitempty" json:"requiredAttestor,omitempty"`
	Health              *Health      `yaml:"health,omitempty" json:"health,omitempty"`
	MIG                 string       `yaml:"mig,omitempty" json:"mig,omitempty"`
	Provider            *Provider    `yaml:"provider,omitempty" json:"provider,omitempty"`
	Prices              *Prices      `yaml:"prices,omitempty" json:"prices,omitempty"`
	MemoryOvercommit    string       `yaml:"memoryOvercommit,omitempty" json:"memoryOvercommit,omitempty"`
}

// PerGPU is the host share that comes with each GPU.
type PerGPU struct {
	VCPU         int32 `yaml:"vcpu,omitempty" json:"vcpu,omitempty"`
	MemoryGiB    int32 `yaml:"memoryGiB,omitempty" json:"memoryGiB,omitempty"`
	Hugepages1Gi int32 `yaml:"hugepages1Gi,omitempty" json:"hugepages1Gi,omitempty"`
}

// HostReserve is what each node keeps for itself.
type HostReserve struct {
	VCPU      int32 `yaml:"vcpu,omitempty" json:"vcpu,omitempty"`
	MemoryGiB int32 `yaml:"memoryGiB,omitempty" json:"memoryGiB,omitempty"`
}

// Health is a pool's answer to GPU health findings.
type Health struct {
	XIDActions              map[int64]string `yaml:"xidActions,omitempty" json:"xidActions,omitempty"`
	DisruptionBudgetPercent int32            `yaml:"disruptionBudgetPercent,omitempty" json:"disruptionBudgetPercent,omitempty"`
	BreakerPercent          int32            `yaml:"breakerPercent,omitempty" json:"breakerPercent,omitempty"`
	BreakerWindowSeconds    int64            `yaml:"breakerWindowSeconds,omitempty" json:"breakerWindowSeconds,omitempty"`
	KeepReservations        bool             `yaml:"keepReservations,omitempty" json:"keepReservations,omitempty"`
}

// Provider makes a provider pool.
type Provider struct {
	Account    string `yaml:"account,omitempty" json:"account,omitempty"`
	ServerType string `yaml:"serverType,omitempty" json:"serverType,omitempty"`
	Image      string `yaml:"image,omitempty" json:"image,omitempty"`
	Location   string `yaml:"location,omitempty" json:"location,omitempty"`
}

// Prices are a pool's prices per hour (docs/billing.md).
type Prices struct {
	GPUHour       map[string]string `yaml:"gpuHour,omitempty" json:"gpuHour,omitempty"`
	VCPUHour      string            `yaml:"vcpuHour,omitempty" json:"vcpuHour,omitempty"`
	MemoryGiBHour string            `yaml:"memoryGibHour,omitempty" json:"memoryGibHour,omitempty"`
	InstanceHour  map[string]string `yaml:"instanceHour,omitempty" json:"instanceHour,omitempty"`
}

// specTypes maps each kind to an empty value of its spec, for the strict
// parser and the schema test.
func newSpec(kind string) any {
	switch kind {
	case KindFlavor:
		return &FlavorSpec{}
	case KindIPPool:
		return &IPPoolSpec{}
	case KindQuota:
		return &QuotaSpec{}
	case KindPool:
		return &PoolSpec{}
	}
	return nil
}

// Document is one parsed document.
type Document struct {
	// File and Index (1-based) say where it came from.
	File     string
	Index    int
	Kind     string
	Metadata Metadata
	// Spec is a *FlavorSpec, *IPPoolSpec, *QuotaSpec or *PoolSpec.
	Spec any
}

// Where names the document for messages: file:N.
func (d Document) Where() string {
	return d.File + ":" + itoa(d.Index)
}
