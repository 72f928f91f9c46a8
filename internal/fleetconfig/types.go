package fleetconfig

// APIVersion is the apiVersion every document carries.
const APIVersion = "bettercompute.io/v1"

// The kinds this version covers.
const (
	KindTenant          = "Tenant"
	KindProject         = "Project"
	KindSite            = "Site"
	KindFlavor          = "Flavor"
	KindIPPool          = "IPPool"
	KindPool            = "Pool"
	KindImage           = "Image"
	KindQuota           = "Quota"
	KindSandboxTemplate = "SandboxTemplate"
	KindWebhook         = "Webhook"
	KindIAMPolicy       = "IAMPolicy"
)

// Kinds lists the kinds in dependency order: a tenant before what it
// owns, projects and pools before the quotas that name them, flavors,
// pools, IP pools and images before the sandbox templates that name them.
var Kinds = []string{KindTenant, KindProject, KindSite, KindPool, KindFlavor, KindIPPool, KindImage, KindQuota,
	KindSandboxTemplate, KindWebhook, KindIAMPolicy}

// Metadata names a document's object. Tenant is a tenant name (or id);
// empty means the platform's for flavors and IP pools, and the default
// tenant (--tenant) for pools and quotas.
type Metadata struct {
	Name   string `yaml:"name" json:"name" required:"true" desc:"The object's name; for a quota or a webhook, a label of the document only (the quota's scope, the webhook's url is its identity)."`
	Tenant string `yaml:"tenant,omitempty" json:"tenant,omitempty" desc:"Tenant name or id. Left out: the platform's for a Flavor, IPPool or Image; for the other kinds, the tenant given with --tenant. A Tenant document has none."`
}

// ProjectSpec is a project of a tenant. The API has no project update:
// a change is a replace.
type ProjectSpec struct {
	DisplayName string `yaml:"displayName,omitempty" json:"displayName,omitempty" desc:"The project's display name (left out: the API's default, not compared)."`
}

// FlavorSpec is a flavor. The API has no update for flavors: any change
// is a replace.
type FlavorSpec struct {
	VCPUs        int32  `yaml:"vcpus,omitempty" json:"vcpus,omitempty" required:"true" min:"1" desc:"Virtual CPUs."`
	MemoryMiB    int64  `yaml:"memoryMiB,omitempty" json:"memoryMiB,omitempty" required:"true" min:"1" desc:"Memory in MiB."`
	DiskGiB      int32  `yaml:"diskGiB,omitempty" json:"diskGiB,omitempty" min:"0" desc:"Root disk in GiB."`
	GPUs         int32  `yaml:"gpus,omitempty" json:"gpus,omitempty" min:"0" desc:"GPUs passed through."`
	GPUModel     string `yaml:"gpuModel,omitempty" json:"gpuModel,omitempty" desc:"The GPU model the GPUs must be (left out: any)."`
	NUMAAffine   bool   `yaml:"numaAffine,omitempty" json:"numaAffine,omitempty" desc:"CPUs, memory and GPUs on one NUMA node."`
	Pinned       bool   `yaml:"pinned,omitempty" json:"pinned,omitempty" desc:"Dedicated host CPUs, isolated ones first."`
	Hugepages    bool   `yaml:"hugepages,omitempty" json:"hugepages,omitempty" desc:"Guest memory backed by the host's hugepages."`
	Balloon      bool   `yaml:"balloon,omitempty" json:"balloon,omitempty" desc:"The host may balloon guest memory back (not with hugepages or GPUs)."`
	MinMemoryMiB int64  `yaml:"minMemoryMiB,omitempty" json:"minMemoryMiB,omitempty" min:"0" desc:"With balloon: the least memory the balloon leaves the guest."`
	Description  string `yaml:"description,omitempty" json:"description,omitempty" desc:"What the flavor is for."`
}

// IPPoolSpec is an IP pool. The API has no update for IP pools: any
// change is a replace. An empty gateway or range takes the API's default
// and is not compared.
type IPPoolSpec struct {
	CIDR        string   `yaml:"cidr,omitempty" json:"cidr,omitempty" required:"true" desc:"The IPv4 network, e.g. 10.20.0.0/24."`
	Gateway     string   `yaml:"gateway,omitempty" json:"gateway,omitempty" desc:"The guests' gateway (left out: the network's first host)."`
	DNS         []string `yaml:"dns,omitempty" json:"dns,omitempty" desc:"Nameservers guests get."`
	RangeStart  string   `yaml:"rangeStart,omitempty" json:"rangeStart,omitempty" desc:"First address leased (left out: the first host after the gateway)."`
	RangeEnd    string   `yaml:"rangeEnd,omitempty" json:"rangeEnd,omitempty" desc:"Last address leased (left out: the last host)."`
	Network     string   `yaml:"network,omitempty" json:"network,omitempty" desc:"The site or host network the pool serves, e.g. dc1/br0."`
	Description string   `yaml:"description,omitempty" json:"description,omitempty" desc:"What the pool is for."`
}

// QuotaSpec is the quota of one scope: the tenant or a project, optionally
// one GPU model or one pool. The scope is the quota's identity; a limit
// left out is unlimited. metadata.name only names the document.
type QuotaSpec struct {
	Project  string   `yaml:"project,omitempty" json:"project,omitempty" desc:"Project name: the quota of that project (left out: the tenant-wide quota)."`
	Model    string   `yaml:"model,omitempty" json:"model,omitempty" desc:"Count only this GPU model, e.g. H100."`
	Pool     string   `yaml:"pool,omitempty" json:"pool,omitempty" desc:"Count only this pool (its name)."`
	GPUs     *int32   `yaml:"gpus,omitempty" json:"gpus,omitempty" min:"0" desc:"GPUs held at once (left out: unlimited)."`
	GPUHours *float64 `yaml:"gpuHours,omitempty" json:"gpuHours,omitempty" min:"0" desc:"GPU-hours booked in all (left out: unlimited)."`
}

// PoolSpec is a pool: its selector (the shorthand of pools create
// --selector), who it is offered to, and its policy.
type PoolSpec struct {
	Selector string `yaml:"selector,omitempty" json:"selector,omitempty" desc:"Node selector shorthand, e.g. 'gpu.model=H100,zone in (a,b),!spot' (left out: every node of the tenant)."`
	// OfferTo is "all", or consumer tenant names; empty keeps the pool
	// private.
	OfferTo []string    `yaml:"offerTo,omitempty" json:"offerTo,omitempty" desc:"all, or consumer tenant names; left out: the pool is private."`
	Policy  *PoolPolicy `yaml:"policy,omitempty" json:"policy,omitempty" desc:"How the pool's GPUs are shared and booked (docs/capacity.md); left out fields take the defaults."`
}

// PoolPolicy mirrors the API's PoolPolicy (docs/capacity.md).
type PoolPolicy struct {
	PerGPU              *PerGPU      `yaml:"perGpu,omitempty" json:"perGpu,omitempty" desc:"The host share that comes with each GPU."`
	HostReserve         *HostReserve `yaml:"hostReserve,omitempty" json:"hostReserve,omitempty" desc:"What each node keeps for itself."`
	GPUSharing          string       `yaml:"gpuSharing,omitempty" json:"gpuSharing,omitempty" enum:"exclusive,mig,timeslice,mps" desc:"How GPUs are shared (default exclusive)."`
	SlotsPerGPU         int32        `yaml:"slotsPerGpu,omitempty" json:"slotsPerGpu,omitempty" min:"0" desc:"Slots per GPU, at most 48: required for timeslice and mps."`
	SingleTenant        bool         `yaml:"singleTenant,omitempty" json:"singleTenant,omitempty" desc:"Nodes serve one tenant's workloads at a time."`
	MaxPending          int32        `yaml:"maxPending,omitempty" json:"maxPending,omitempty" min:"-1" desc:"Reservations that may wait for capacity: left out 1000, -1 none."`
	MinDurationSeconds  int64        `yaml:"minDurationSeconds,omitempty" json:"minDurationSeconds,omitempty" min:"0" desc:"Shortest booking in seconds (left out: unbounded)."`
	MaxDurationSeconds  int64        `yaml:"maxDurationSeconds,omitempty" json:"maxDurationSeconds,omitempty" min:"0" desc:"Longest booking in seconds, at most 30 days (left out: unbounded)."`
	OnNodeLost          string       `yaml:"onNodeLost,omitempty" json:"onNodeLost,omitempty" enum:"release,replace" desc:"What a lost node does to its reservations (default release)."`
	StartHorizonSeconds int64        `yaml:"startHorizonSeconds,omitempty" json:"startHorizonSeconds,omitempty" min:"0" desc:"How far ahead a reservation may start, in seconds (default 90 days)."`
	RequiredAttestor    string       `yaml:"requiredAttestor,omitempty" json:"requiredAttestor,omitempty" desc:"The attestor a machine joining for this pool must bring evidence from (docs/attestation.md)."`
	Health              *Health      `yaml:"health,omitempty" json:"health,omitempty" desc:"What GPU health findings do in this pool (docs/health.md)."`
	MIG                 string       `yaml:"mig,omitempty" json:"mig,omitempty" enum:"manual,auto" desc:"MIG layouts, for gpuSharing mig (default manual)."`
	Provider            *Provider    `yaml:"provider,omitempty" json:"provider,omitempty" desc:"Makes this a provider pool (docs/providers.md)."`
	Prices              *Prices      `yaml:"prices,omitempty" json:"prices,omitempty" desc:"What the owner charges per hour (docs/billing.md)."`
	MemoryOvercommit    string       `yaml:"memoryOvercommit,omitempty" json:"memoryOvercommit,omitempty" desc:"Memory overcommit ratio for ballooning flavors, 1 to 2, e.g. \"1.5\"."`
}

// PerGPU is the host share that comes with each GPU.
type PerGPU struct {
	VCPU         int32 `yaml:"vcpu,omitempty" json:"vcpu,omitempty" min:"0" desc:"vCPUs."`
	MemoryGiB    int32 `yaml:"memoryGiB,omitempty" json:"memoryGiB,omitempty" min:"0" desc:"Memory in GiB."`
	Hugepages1Gi int32 `yaml:"hugepages1Gi,omitempty" json:"hugepages1Gi,omitempty" min:"0" desc:"1 GiB huge pages."`
}

// HostReserve is what each node keeps for itself.
type HostReserve struct {
	VCPU      int32 `yaml:"vcpu,omitempty" json:"vcpu,omitempty" min:"0" desc:"vCPUs."`
	MemoryGiB int32 `yaml:"memoryGiB,omitempty" json:"memoryGiB,omitempty" min:"0" desc:"Memory in GiB."`
}

// Health is a pool's answer to GPU health findings.
type Health struct {
	XIDActions              map[int64]string `yaml:"xidActions,omitempty" json:"xidActions,omitempty" desc:"Action per XID code: quarantine, reset, rma, reboot, record."`
	DisruptionBudgetPercent int32            `yaml:"disruptionBudgetPercent,omitempty" json:"disruptionBudgetPercent,omitempty" min:"0" desc:"Most nodes under remediation at once, in percent (default 5)."`
	BreakerPercent          int32            `yaml:"breakerPercent,omitempty" json:"breakerPercent,omitempty" min:"0" desc:"Remediation stops past this percentage of nodes turned unhealthy (default 10)."`
	BreakerWindowSeconds    int64            `yaml:"breakerWindowSeconds,omitempty" json:"breakerWindowSeconds,omitempty" min:"0" desc:"The breaker's window in seconds (default 600)."`
	KeepReservations        bool             `yaml:"keepReservations,omitempty" json:"keepReservations,omitempty" desc:"Do not re-place reservations off a GPU that goes bad."`
}

// Provider makes a provider pool.
type Provider struct {
	Account    string `yaml:"account,omitempty" json:"account,omitempty" desc:"A provider account of the pool's tenant."`
	ServerType string `yaml:"serverType,omitempty" json:"serverType,omitempty" desc:"The provider's server type, e.g. cx22."`
	Image      string `yaml:"image,omitempty" json:"image,omitempty" desc:"What the servers boot."`
	Location   string `yaml:"location,omitempty" json:"location,omitempty" desc:"Where the servers run (default the account's)."`
}

// Prices are a pool's prices per hour (docs/billing.md).
type Prices struct {
	GPUHour       map[string]string `yaml:"gpuHour,omitempty" json:"gpuHour,omitempty" desc:"Price of a GPU-hour per model; * prices every other model."`
	VCPUHour      string            `yaml:"vcpuHour,omitempty" json:"vcpuHour,omitempty" desc:"Price of a vCPU-hour."`
	MemoryGiBHour string            `yaml:"memoryGibHour,omitempty" json:"memoryGibHour,omitempty" desc:"Price of a GiB-hour of memory."`
	InstanceHour  map[string]string `yaml:"instanceHour,omitempty" json:"instanceHour,omitempty" desc:"Price of an instance-hour per flavor name."`
}

// specTypes maps each kind to an empty value of its spec, for the strict
// parser and the schema test.
func newSpec(kind string) any {
	switch kind {
	case KindProject:
		return &ProjectSpec{}
	case KindFlavor:
		return &FlavorSpec{}
	case KindIPPool:
		return &IPPoolSpec{}
	case KindQuota:
		return &QuotaSpec{}
	case KindPool:
		return &PoolSpec{}
	case KindTenant:
		return &TenantSpec{}
	case KindSite:
		return &SiteSpec{}
	case KindImage:
		return &ImageSpec{}
	case KindSandboxTemplate:
		return &SandboxTemplateSpec{}
	case KindWebhook:
		return &WebhookSpec{}
	case KindIAMPolicy:
		return &IAMPolicySpec{}
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

// TenantSpec is a tenant, the platform's to declare. The API has no
// tenant update: a display name changed is a replace; suspended is
// changed in place (Suspend, Resume). Tenants are never pruned: a tenant
// delete removes everything it owns, so it stays a deliberate
// `tenants delete`.
type TenantSpec struct {
	DisplayName string `yaml:"displayName,omitempty" json:"displayName,omitempty" desc:"The tenant's display name (left out: the API's default, not compared)."`
	Suspended   bool   `yaml:"suspended,omitempty" json:"suspended,omitempty" desc:"Refuse every mutation of the tenant's principals; its running work keeps running."`
}

// SiteSpec is a bare-metal site (docs/bare-metal.md), changed in place.
type SiteSpec struct {
	Networks    []string `yaml:"networks,omitempty" json:"networks,omitempty" desc:"The provisioning networks the site's agent serves (CIDRs)."`
	DHCPMode    string   `yaml:"dhcpMode,omitempty" json:"dhcpMode,omitempty" enum:"full,proxy" desc:"full (the site agent answers DHCP) or proxy (proxyDHCP beside an existing server); left out: the API's default, not compared."`
	Description string   `yaml:"description,omitempty" json:"description,omitempty" desc:"What the site is."`
}

// ImageSpec references an image in the image store (docs/images.md): a
// document pins what must be there, it does not carry the bytes. An image
// that is not there is pushed with `images push`; apply refuses to create
// one. Only making a private image public (Promote) is a change in place;
// images are never pruned, since apply could not bring their bytes back.
type ImageSpec struct {
	Kind       string `yaml:"kind,omitempty" json:"kind,omitempty" required:"true" enum:"raw,qcow2,kernel,initrd,ramdisk" desc:"What the image is."`
	SHA256     string `yaml:"sha256,omitempty" json:"sha256,omitempty" required:"true" desc:"Lower-case hex sha256 of the content: the image the fleet expects."`
	Visibility string `yaml:"visibility,omitempty" json:"visibility,omitempty" enum:"private,public" desc:"private (its owner only, the default) or public (every tenant; platform-signed platform images)."`
}

// SandboxTemplateSpec is a sandbox template (docs/sandboxes.md). The API
// has no template update: any change is a replace.
type SandboxTemplateSpec struct {
	Image         string            `yaml:"image,omitempty" json:"image,omitempty" desc:"A guest image the hosts hold (left out: the control plane's only one, not compared)."`
	Flavor        string            `yaml:"flavor,omitempty" json:"flavor,omitempty" required:"true" desc:"The flavor's name."`
	Pool          string            `yaml:"pool,omitempty" json:"pool,omitempty" desc:"A pool (its name) of the tenant's or offered to it (left out: the only one it sees, not compared)."`
	IPPool        string            `yaml:"ipPool,omitempty" json:"ipPool,omitempty" desc:"The IP pool (its name) the guests lease from (left out: the only one the tenant sees, not compared)."`
	Project       string            `yaml:"project,omitempty" json:"project,omitempty" desc:"The project (its name) sandboxes book capacity in (left out: the tenant's default project at each boot)."`
	DefaultTTL    string            `yaml:"defaultTTL,omitempty" json:"defaultTTL,omitempty" desc:"A sandbox's lifetime when its create names none, e.g. 30m (default 1h)."`
	MaxTTL        string            `yaml:"maxTTL,omitempty" json:"maxTTL,omitempty" desc:"The most a create or an extend may ask for, counted from create, e.g. 4h (default 24h)."`
	WarmMin       int32             `yaml:"warmMin,omitempty" json:"warmMin,omitempty" min:"0" desc:"Booted guests kept waiting."`
	WarmMax       int32             `yaml:"warmMax,omitempty" json:"warmMax,omitempty" min:"0" desc:"The most booted guests kept waiting."`
	Env           map[string]string `yaml:"env,omitempty" json:"env,omitempty" desc:"Environment variable name → secret://NAME of the tenant's own secrets."`
	NetworkPolicy string            `yaml:"networkPolicy,omitempty" json:"networkPolicy,omitempty" enum:"egress,private,none" desc:"egress, private or none (left out: the API's default, not compared)."`
}

// WebhookSpec is a webhook subscription (docs/webhooks.md). Its url is
// its identity; metadata.name only labels the document. The signing
// secret is never part of a document or an export: apply does not print
// it either, and `webhooks rotate-secret` hands one out.
type WebhookSpec struct {
	URL         string   `yaml:"url,omitempty" json:"url,omitempty" required:"true" desc:"The https endpoint deliveries are posted to: the webhook's identity."`
	Types       []string `yaml:"types,omitempty" json:"types,omitempty" desc:"Event types or families (pool, reservation.*); left out: every event."`
	Description string   `yaml:"description,omitempty" json:"description,omitempty" desc:"What the webhook is for."`
}

// IAMPolicySpec is one of a tenant's Cedar policies (docs/iam.md), put
// whole (PolicyService/Put). The API has no policy delete: policies are
// never pruned.
type IAMPolicySpec struct {
	Text string `yaml:"text,omitempty" json:"text,omitempty" required:"true" desc:"The Cedar policy text, validated against the schema when applied."`
}
