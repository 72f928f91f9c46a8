package providerpools

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/riverqueue/river"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/usage"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/provideraccounts"
	"github.com/better-compute/better-compute/internal/providers"
	"github.com/better-compute/better-compute/internal/secrets"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

// DefaultTokenTTL is how long a server has to join after its create: a
// server that has not joined by then is failed and deleted.
const DefaultTokenTTL = 24 * time.Hour

// CreatedBy is the principal recorded on the join tokens this module mints.
const CreatedBy = "system:providerpools"

// Config wires a Module.
type Config struct {
	DB       *store.DB
	Recorder envelope.Recorder
	// Enqueue inserts a River job in the caller's transaction; it may be
	// set after New (SetEnqueue), before work starts.
	Enqueue func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error
	// Secrets opens the accounts' credentials (the tenants' sealed
	// secrets).
	Secrets secrets.Sealer
	// Tokens seals the join token each server's cloud-init carries.
	Tokens fleet.TokenSealer
	// Gateway is the HOST:PORT a server's bcd joins at.
	Gateway func() string
	// ControlPlaneID marks the servers this control plane made
	// (providers.ManagedLabel).
	ControlPlaneID string
	HTTPClient     *http.Client
	Clock          clock.Clock
	Logger         *slog.Logger
	// TokenTTL: default DefaultTokenTTL.
	TokenTTL time.Duration
}

// Module runs the instances of provider pools.
type Module struct {
	cfg Config
}

var _ vps.ProviderInstances = (*Module)(nil)

// New returns the module.
func New(cfg Config) *Module {
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, cfg.DB.Clock())
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.TokenTTL = cmp.Or(cfg.TokenTTL, DefaultTokenTTL)
	cfg.ControlPlaneID = cmp.Or(cfg.ControlPlaneID, "better-compute")
	return &Module{cfg: cfg}
}

// SetEnqueue sets the job inserter when the job runtime is built after the
// module.
func (m *Module) SetEnqueue(fn func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error) {
	m.cfg.Enqueue = fn
}

// ConvergeArgs converges one instance with its server: create, power,
// delete.
type ConvergeArgs struct {
	InstanceID string `json:"instance_id"`
}

// Kind is the job kind.
func (ConvergeArgs) Kind() string { return "providerpools.converge" }

// ReconcileArgs runs Reconcile.
type ReconcileArgs struct{}

// Kind is the job kind.
func (ReconcileArgs) Kind() string { return "providerpools.reconcile" }

// ReconcileInterval is how often every account's servers are listed.
const ReconcileInterval = time.Minute

type convergeWorker struct {
	river.WorkerDefaults[ConvergeArgs]
	m *Module
}

func (w *convergeWorker) Work(ctx context.Context, job *river.Job[ConvergeArgs]) error {
	return w.m.Converge(ctx, job.Args.InstanceID)
}

// A provider can take minutes to answer a create (Hetzner's action).
func (w *convergeWorker) Timeout(*river.Job[ConvergeArgs]) time.Duration { return 10 * time.Minute }

type reconcileWorker struct {
	river.WorkerDefaults[ReconcileArgs]
	m *Module
}

func (w *reconcileWorker) Work(ctx context.Context, _ *river.Job[ReconcileArgs]) error {
	_, err := w.m.Reconcile(ctx)
	return err
}

// AddWorkers registers the module's jobs.
func (m *Module) AddWorkers(workers *river.Workers) {
	river.AddWorker(workers, &convergeWorker{m: m})
	river.AddWorker(workers, &reconcileWorker{m: m})
}

// PeriodicJobs is the reconciler's period.
func (m *Module) PeriodicJobs() []*river.PeriodicJob {
	opts := &river.InsertOpts{MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: ReconcileInterval}}
	return []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(ReconcileInterval),
		func() (river.JobArgs, *river.InsertOpts) { return ReconcileArgs{}, opts }, &river.PeriodicJobOpts{RunOnStart: true})}
}

func (m *Module) enqueue(ctx context.Context, tx store.Tx, instanceID string) error {
	if m.cfg.Enqueue == nil {
		return errors.New("providerpools: no job queue")
	}
	// Every change queues a converge (a running one may have read the
	// row before it); the instance's lease runs them one at a time.
	return m.cfg.Enqueue(ctx, tx, ConvergeArgs{InstanceID: instanceID}, &river.InsertOpts{MaxAttempts: 50})
}

// CreateTx records a new instance's provider row and queues its create.
func (m *Module) CreateTx(ctx context.Context, tx store.Tx, in *vps.Instance, p pool.Pool, policy *apiv1.ProviderPolicy) error {
	a, err := provideraccounts.Get(ctx, tx, p.TenantID, policy.GetAccount(), "")
	if errors.Is(err, store.ErrNotFound) {
		return envelope.Errorf(envelope.CodeFailedPrecondition, "pool %s names provider account %s, which is gone: update the pool", p.Name, policy.GetAccount())
	}
	if err != nil {
		return err
	}
	if _, ok := providers.Lookup(a.Type); !ok {
		return envelope.Errorf(envelope.CodeFailedPrecondition, "pool %s's account %s is of provider type %s, which this control plane does not run", p.Name, a.Name, a.Type)
	}
	now := m.cfg.Clock.Now()
	r := Row{InstanceID: in.ID, TenantID: in.TenantID, ProjectID: in.ProjectID, PoolID: p.ID, AccountID: a.ID,
		ServerType: policy.GetServerType(), Image: in.Image, Location: policy.GetLocation(), SSHKeys: in.SSHKeys,
		Desired: DesiredRunning, CreateTime: now, UpdateTime: now}
	if err := insert(ctx, tx, &r); err != nil {
		return err
	}
	return m.enqueue(ctx, tx, in.ID)
}

// Owns reports whether an instance is a provider pool's.
func (m *Module) Owns(ctx context.Context, q store.Querier, instanceID string) (bool, error) {
	return exists(ctx, q, instanceID)
}

// DeleteTx queues the delete of the instance's server.
func (m *Module) DeleteTx(ctx context.Context, tx store.Tx, in *vps.Instance) error {
	r, err := get(ctx, tx, in.ID, store.ForUpdate(tx))
	if err != nil {
		return err
	}
	r.Desired, r.Power, r.UpdateTime = DesiredDeleted, "", m.cfg.Clock.Now()
	if err := save(ctx, tx, &r, false); err != nil {
		return err
	}
	return m.enqueue(ctx, tx, in.ID)
}

// PowerTx queues a power action on the instance's server.
func (m *Module) PowerTx(ctx context.Context, tx store.Tx, in *vps.Instance, action string) error {
	r, err := get(ctx, tx, in.ID, store.ForUpdate(tx))
	if err != nil {
		return err
	}
	if r.Desired == DesiredDeleted {
		return envelope.Errorf(envelope.CodeFailedPrecondition, "instance %s is being deleted", in.Name)
	}
	switch providers.PowerAction(action) {
	case providers.PowerOff:
		r.Desired = DesiredStopped
	case providers.PowerOn:
		r.Desired = DesiredRunning
	case providers.PowerReboot:
	default:
		return fmt.Errorf("providerpools: unknown power action %q", action)
	}
	r.Power, r.UpdateTime = action, m.cfg.Clock.Now()
	if err := save(ctx, tx, &r, false); err != nil {
		return err
	}
	return m.enqueue(ctx, tx, in.ID)
}

// provider builds the provider of an account, with its credentials.
func (m *Module) provider(ctx context.Context, accountID string) (providers.Provider, provideraccounts.Account, error) {
	var (
		a     provideraccounts.Account
		creds map[string]string
	)
	err := m.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		if a, err = provideraccounts.ByID(ctx, tx, accountID); err != nil {
			return fmt.Errorf("provider account %s: %w", accountID, err)
		}
		creds, err = provideraccounts.Credentials(ctx, tx, m.cfg.Secrets, a)
		return err
	})
	if err != nil {
		return nil, a, err
	}
	f, ok := providers.Lookup(a.Type)
	if !ok {
		return nil, a, fmt.Errorf("provider account %s: type %s is not linked in", a.Name, a.Type)
	}
	p, err := f.New(providers.Config{Endpoint: a.Endpoint, Credentials: creds, Settings: a.Settings,
		ControlPlaneID: m.cfg.ControlPlaneID, HTTPClient: m.cfg.HTTPClient, Logger: m.cfg.Logger})
	return p, a, err
}

func instanceEvent(typ string, in *vps.Instance, data map[string]any) envelope.Event {
	if data == nil {
		data = map[string]any{}
	}
	data["state"], data["name"] = in.State, in.Name
	return envelope.Event{Type: typ, TenantID: in.TenantID, ResourceType: "Instance", ResourceID: in.ID, Data: data}
}

// Intervals are the provider instances' metered intervals overlapping
// [from, closeAt): one instance.<server type>.hours per hour a server ran
// for its tenant, from its join to its delete: the usage.IntervalSource the
// rollup job and the usage service pass.
func Intervals(ctx context.Context, q store.Querier, from, closeAt time.Time) ([]usage.Interval, error) {
	rows, err := activeIn(ctx, q, from, closeAt)
	if err != nil {
		return nil, err
	}
	out := make([]usage.Interval, 0, len(rows))
	for _, r := range rows {
		out = append(out, usage.Interval{ID: r.InstanceID, TenantID: r.TenantID, ProjectID: r.ProjectID,
			Metric: usage.InstanceMetric(r.ServerType), Quantity: 1, Since: *r.ActiveSince, Until: r.ActiveUntil})
	}
	return out, nil
}

func labelsJSON(m map[string]string) string {
	b, _ := json.Marshal(m) // strings always encode
	return string(b)
}
