package metal

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/images"
	"github.com/better-compute/better-compute/internal/metal/bmc"
	"github.com/better-compute/better-compute/internal/profiles"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// State is a machine's lifecycle state.
type State string

// Machine states. The -ing states hold an active workflow.
const (
	StateEnrolled      State = "enrolled"
	StateInspecting    State = "inspecting"
	StateCommissioning State = "commissioning"
	StateReady         State = "ready"
	StateDeploying     State = "deploying"
	StateDeployed      State = "deployed"
	StateReleasing     State = "releasing"
	StateRescuing      State = "rescuing"
	StateRescue        State = "rescue"
	StateRetired       State = "retired"
	StateFailed        State = "failed"
)

// States lists every state (a list filter is checked against it).
func States() []State {
	return []State{StateEnrolled, StateInspecting, StateCommissioning, StateReady, StateDeploying, StateDeployed,
		StateReleasing, StateRescuing, StateRescue, StateRetired, StateFailed}
}

// Operations: the profiles a machine transition runs.
const (
	OpInspect    = "inspect"
	OpCommission = "commission"
	OpDeploy     = "deploy"
	OpRelease    = "release"
	OpRescue     = "rescue"
	// A rescue that expired ends by booting the deployed disk again, or,
	// on a machine without an image, by powering it off.
	OpRescueEndDisk = "rescue-end-disk"
	OpRescueEndOff  = "rescue-end-off"
	// Power operations: one BMC call as a one-step workflow; the machine
	// keeps its lifecycle state whatever becomes of it.
	OpPowerOn    = "power-on"
	OpPowerOff   = "power-off"
	OpPowerCycle = "power-cycle"
)

// PowerOps maps a power action (on, off, cycle) to its operation.
var PowerOps = map[string]string{"on": OpPowerOn, "off": OpPowerOff, "cycle": OpPowerCycle}

// powerOp reports whether op is a power operation.
func powerOp(op string) bool { return op == OpPowerOn || op == OpPowerOff || op == OpPowerCycle }

// Step kinds the site agent carries out.
const (
	KindPowerCycle = "power.cycle"
	KindPowerOff   = "power.off"
	KindPowerOn    = "power.on"
	KindInventory  = "inventory.refresh"
	KindDiskWipe   = "disk.wipe"
	KindBurnIn     = "burnin.run"
	KindImageWrite = "image.write"
	KindConfigure  = "machine.configure"
)

// Boot modes a power.cycle step asks the site's iPXE script for (its
// "boot" param): the commissioning ramdisk, the ramdisk with the rescue
// SSH key, or the local disk.
const (
	BootRamdisk = "ramdisk"
	BootRescue  = "rescue"
	BootDisk    = "disk"
)

// MaxRescue bounds a rescue.
const MaxRescue = time.Hour

// transition is what an operation needs and does; an operation without a
// running state (power) leaves the machine's state as it is.
type transition struct {
	from    []State
	running State
}

// powerFrom are the states a power operation starts from: any idle
// machine not retired.
var powerFrom = []State{StateEnrolled, StateReady, StateDeployed, StateRescue, StateFailed}

var transitions = map[string]transition{
	OpInspect:    {from: []State{StateEnrolled, StateReady, StateFailed}, running: StateInspecting},
	OpCommission: {from: []State{StateEnrolled, StateReady, StateFailed}, running: StateCommissioning},
	OpDeploy:     {from: []State{StateReady}, running: StateDeploying},
	OpRelease:    {from: []State{StateDeployed, StateRescue, StateFailed}, running: StateReleasing},
	OpRescue:     {from: []State{StateReady, StateDeployed}, running: StateRescuing},
	OpPowerOn:    {from: powerFrom},
	OpPowerOff:   {from: powerFrom},
	OpPowerCycle: {from: powerFrom},
	OpRotateBMC:  {from: rotateFrom},
}

// retireFrom are the states a machine may be retired from: nothing runs
// and nothing of a tenant is on its disk.
var retireFrom = []State{StateEnrolled, StateReady, StateFailed}

// Profiles are the machine profiles, shipped as documents
// (internal/profiles/builtin): inspect (inventory), commission (inventory +
// wipe + burn-in), deploy (write the image, configure, reboot into it),
// release (wipe), rescue (the ramdisk with an SSH key), its ends, the
// operator's power actions, the BMC rotation and a lease's deploy and
// teardown.
func Profiles() []provision.Profile {
	return profiles.MustProfiles(OpLeaseDeploy, OpLeaseTeardown, OpInspect, OpCommission, OpDeploy, OpRelease, OpRescue,
		OpRescueEndDisk, OpRescueEndOff, OpPowerOn, OpPowerOff, OpPowerCycle, OpRotateBMC)
}

// Target is the machine a step acts on, as its site agent needs it: the
// only place the BMC password is unsealed.
type Target struct {
	MachineID       string
	TenantID        string
	SiteID          string
	Name            string
	MAC             string
	BMCDriver       string
	BMCAddress      string
	Credentials     bmc.Credentials
	HardwareProfile string
	// DiscoveryToken is set on a power.cycle into the ramdisk (or rescue)
	// when the control plane mints them: the single-use token the site's
	// iPXE script puts on the ramdisk's kernel command line (pxe.Ramdisk's
	// Token). A secret: never log it.
	DiscoveryToken string
}

// SiteAgent carries out steps at one site: BMC calls and ramdisk commands.
// Dispatch and Lookup have the provision.StepRunner contract (a key is
// applied at most once; OutcomeNotDispatched fences it). Results that come
// later arrive through Runtime.Complete, and a machine whose ramdisk or OS
// joined through Runtime.Joined.
type SiteAgent interface {
	Dispatch(ctx context.Context, t Target, run provision.StepRun) (provision.Dispatched, error)
	Lookup(ctx context.Context, t Target, run provision.StepRun) (provision.Outcome, error)
	// PowerStatus reads the machine's power from its BMC: a read, so it
	// is asked directly rather than run as a workflow step.
	PowerStatus(ctx context.Context, t Target) (bmc.PowerState, error)
}

// RamdiskAgent carries the ramdisk's steps (RamdiskKinds) to the ramdisk
// node that joined for the machine's boot, as fleet commands keyed by the
// step's idempotency key; Dispatch and Lookup have the provision.StepRunner
// contract.
type RamdiskAgent interface {
	Dispatch(ctx context.Context, t Target, nodeID string, run provision.StepRun) (provision.Dispatched, error)
	Lookup(ctx context.Context, t Target, nodeID string, run provision.StepRun) (provision.Outcome, error)
}

// RamdiskKinds are the step kinds a RamdiskAgent runs on the machine's
// ramdisk (the image write fetches from the site's cache); the power steps
// stay with the site agent.
var RamdiskKinds = []string{KindInventory, KindDiskWipe, KindBurnIn, KindImageWrite, KindConfigure}

// Agents holds the site agents connected to this replica, by site id, and
// the one for every other site: the gateway-backed SiteCommands, which
// reach whichever bcd holds the site's boot lease, on any replica.
type Agents struct {
	mu     sync.Mutex
	bySite map[string]SiteAgent
	remote SiteAgent
}

// Register connects a site's agent (replacing one before it); the returned
// function disconnects it.
func (a *Agents) Register(siteID string, agent SiteAgent) func() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.bySite == nil {
		a.bySite = map[string]SiteAgent{}
	}
	a.bySite[siteID] = agent
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.bySite[siteID] == agent {
			delete(a.bySite, siteID)
		}
	}
}

func (a *Agents) get(siteID string) (SiteAgent, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s, ok := a.bySite[siteID]; ok {
		return s, true
	}
	return a.remote, a.remote != nil
}

// Sealer seals BMC passwords at rest (the PKI's sealer).
type Sealer interface {
	Seal(ref string, plaintext []byte) ([]byte, error)
	Open(ref string, sealed []byte) ([]byte, error)
}

func sealRef(credRef string) string { return "machine-bmc/" + credRef }

// Config wires a Runtime.
type Config struct {
	DB       *store.DB
	Recorder envelope.Recorder
	// Sealer seals and opens BMC passwords; without one enrolment is
	// refused (no BETTER_COMPUTE_SECRET).
	Sealer Sealer
	Clock  clock.Clock
	Logger *slog.Logger
	// BootLeaseTTL is how long a site agent's boot lease lasts after its
	// last heartbeat (default DefaultBootLeaseTTL).
	BootLeaseTTL time.Duration
	// Engine tunes the provision engine (Lease, SweepInterval, ...); its
	// DB, Recorder, Profiles, Runners and OnEnd are the runtime's.
	Engine provision.Config
	// DiscoveryPin returns the gateway's pin for discovery tokens; nil
	// mints none (an in-process site agent plays the ramdisk).
	DiscoveryPin func() string
	// RamdiskEnded retires the nodes of a machine's ramdisk boot when its
	// workflow ends, in the workflow's transaction: a ramdisk's identity
	// lives for one boot.
	RamdiskEnded func(ctx context.Context, tx store.Tx, nodeIDs []string) error
	// NodeTokens mints a deploy's single-use node join token, in the
	// transaction that queues machine.configure: role node, labelled
	// MachineLabel, created_by "system:metal". Nil: a deploy through a
	// joined ramdisk cannot configure the OS to join.
	NodeTokens func(ctx context.Context, tx store.Tx, req NodeTokenRequest) (string, error)
	// ExtraProfiles and ExtraRunners are other modules' workflows on the
	// same engine (the health module's remediations, whose target is a
	// node); OtherEnded is told, in the ending transaction, of each
	// workflow whose target is not a machine.
	ExtraProfiles []provision.Profile
	ExtraRunners  map[string]provision.StepRunner
	OtherEnded    func(ctx context.Context, tx store.Tx, w provision.Workflow) error
}

// Runtime is the machine lifecycle: the provision engine with the machine
// profiles, the step runner that hands steps to site agents, and the hook
// that moves a machine on when its workflow ends.
type Runtime struct {
	Engine *provision.Engine
	// Agents are the site agents steps go to.
	Agents *Agents
	// Ramdisk, when set, runs RamdiskKinds on the machine's joined ramdisk
	// node instead of the site agent.
	Ramdisk RamdiskAgent
	// Sites reaches bcd site agents through the gateway (the app hands it
	// to the gateway as its site hooks).
	Sites      *SiteCommands
	pin        func() string
	ended      func(ctx context.Context, tx store.Tx, nodeIDs []string) error
	nodeTokens func(ctx context.Context, tx store.Tx, req NodeTokenRequest) (string, error)
	// nodeRoots is the node CA pool a rotation's signed report must chain
	// to (SetNodeRoots).
	nodeRoots  func() *x509.CertPool
	otherEnded func(ctx context.Context, tx store.Tx, w provision.Workflow) error
	// LeaseHooks tell the capacity module how a binding machine
	// reservation's lease goes (set by the app before it serves).
	LeaseHooks LeaseHooks
	db         *store.DB
	rec        envelope.Recorder
	sealer     Sealer
	clock      clock.Clock
	log        *slog.Logger
}

// LeaseHooks are the capacity module's side of a reservation's lease, each
// in the lease's transaction. Live reports whether the reservation still
// holds the machine (its lease is then released only through it).
type LeaseHooks struct {
	Deploying func(ctx context.Context, tx store.Tx, reservationID, leaseID string) error
	Active    func(ctx context.Context, tx store.Tx, reservationID, leaseID string) error
	Failed    func(ctx context.Context, tx store.Tx, reservationID, leaseID, reason string) error
	Live      func(ctx context.Context, tx store.Tx, reservationID string) (bool, error)
}

// NewRuntime builds the lifecycle.
func NewRuntime(cfg Config) (*Runtime, error) {
	if cfg.DB == nil {
		return nil, errors.New("metal: DB is required")
	}
	r := &Runtime{Agents: &Agents{}, pin: cfg.DiscoveryPin, ended: cfg.RamdiskEnded, nodeTokens: cfg.NodeTokens, db: cfg.DB, rec: cfg.Recorder, sealer: cfg.Sealer,
		clock: cmp.Or[clock.Clock](cfg.Clock, cfg.DB.Clock()), log: cmp.Or(cfg.Logger, slog.Default())}
	r.Sites = &SiteCommands{r: r, ttl: cmp.Or(cfg.BootLeaseTTL, DefaultBootLeaseTTL)}
	r.Agents.remote = r.Sites
	ec := cfg.Engine
	ec.DB, ec.Recorder, ec.Clock, ec.Logger = cfg.DB, cfg.Recorder, r.clock, r.log
	// The built-in profiles are documents: a bad one stops the start.
	if _, err := profiles.Builtins(); err != nil {
		return nil, fmt.Errorf("metal: %w", err)
	}
	ec.Profiles = append(Profiles(), cfg.ExtraProfiles...)
	run := stepRunner{r}
	ec.Runners = map[string]provision.StepRunner{}
	for k, v := range cfg.ExtraRunners {
		ec.Runners[k] = v
	}
	r.otherEnded = cfg.OtherEnded
	for _, k := range []string{KindPowerCycle, KindPowerOff, KindPowerOn, KindInventory, KindDiskWipe, KindBurnIn, KindImageWrite, KindConfigure, KindBMCRotate,
		KindDriverInvoke} {
		ec.Runners[k] = run
	}
	if ec.Facts == nil {
		ec.Facts = machineFacts
	}
	ec.OnEnd = r.onEnd
	var err error
	if r.Engine, err = provision.New(ec); err != nil {
		return nil, err
	}
	return r, nil
}

// AddWorkers registers the engine's jobs and the rescue expiry.
func (r *Runtime) AddWorkers(w *river.Workers) {
	r.Engine.AddWorkers(w)
	river.AddWorker(w, &rescueExpireWorker{r: r})
}

// RescueExpireArgs runs ExpireRescues.
type RescueExpireArgs struct{}

// Kind is the job kind.
func (RescueExpireArgs) Kind() string { return "metal.rescue_expire" }

type rescueExpireWorker struct {
	river.WorkerDefaults[RescueExpireArgs]
	r *Runtime
}

func (w *rescueExpireWorker) Work(ctx context.Context, _ *river.Job[RescueExpireArgs]) error {
	_, err := w.r.ExpireRescues(ctx)
	return err
}

// rescueSweep is how often expired rescues are looked for.
const rescueSweep = time.Minute

// PeriodicJobs are the engine's sweep and the rescue expiry, on the leader.
func (r *Runtime) PeriodicJobs() []*river.PeriodicJob {
	opts := &river.InsertOpts{MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: rescueSweep}}
	return append(r.Engine.PeriodicJobs(), river.NewPeriodicJob(river.PeriodicInterval(rescueSweep),
		func() (river.JobArgs, *river.InsertOpts) { return RescueExpireArgs{}, opts }, &river.PeriodicJobOpts{RunOnStart: true}))
}

// ExpireRescues ends every rescue past its expiry (by the database's
// clock): a machine with a deployed image boots its disk again and ends
// deployed; one without powers off and ends ready. It returns how many it
// started; it is level-triggered and safe to run twice.
func (r *Runtime) ExpireRescues(ctx context.Context) (int, error) {
	n := 0
	err := r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		ids, err := MachinesRescueExpired(ctx, tx, 100)
		if err != nil {
			return err
		}
		for _, id := range ids {
			m, err := MachineByID(ctx, tx, id, store.ForUpdate(tx))
			if err != nil {
				return err
			}
			if m.State != StateRescue || m.WorkflowID != "" {
				continue
			}
			op := OpRescueEndOff
			if m.ImageID != "" {
				op = OpRescueEndDisk
			}
			w, err := r.Engine.StartTx(ctx, tx, provision.StartParams{TenantID: cmp.Or(m.TenantID, "platform"), TargetID: m.ID,
				Profile: op, CreatedBy: "system:rescue-expiry"})
			if err != nil {
				return err
			}
			m.WorkflowID, m.Operation, m.UpdateTime = w.ID, op, r.clock.Now()
			if err := MachineUpdate(ctx, tx, &m); err != nil {
				return err
			}
			if r.rec != nil {
				if err := r.rec.InsertEvents(ctx, tx, []envelope.Event{{Type: "machine.rescue_expired", TenantID: m.TenantID,
					ResourceType: "Machine", ResourceID: m.ID, Time: m.UpdateTime,
					Data: map[string]any{"operation": op, "workflow_id": w.ID}}}); err != nil {
					return err
				}
			}
			n++
		}
		return nil
	})
	return n, err
}

// SetEnqueue hands the engine the job inserter.
func (r *Runtime) SetEnqueue(fn func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error) {
	r.Engine.SetEnqueue(fn)
}

// Complete records a site agent's result for a dispatched step, by its
// idempotency key.
func (r *Runtime) Complete(ctx context.Context, key string, res provision.Result) error {
	return r.Engine.Complete(ctx, key, res)
}

// Joined reports that a machine's ramdisk (or its deployed OS) joined
// through the site agent of siteID: the machine's await.rejoin step ends.
// A machine of another site is refused.
func (r *Runtime) Joined(ctx context.Context, siteID, machineID string) error {
	return r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		m, err := MachineByID(ctx, tx, machineID, "")
		if errors.Is(err, store.ErrNotFound) || err == nil && m.SiteID != siteID {
			return envelope.Errorf(envelope.CodePermissionDenied, "machine %s is not enrolled at site %s", machineID, siteID)
		}
		if err != nil {
			return err
		}
		_, err = r.Engine.SignalProvingTx(ctx, tx, machineID, provision.KindAwaitRejoin, KindPowerCycle, provision.Result{})
		return err
	})
}

// target reads a machine and unseals its BMC password.
func (r *Runtime) target(ctx context.Context, machineID string) (Target, error) {
	var m Machine
	if err := r.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		m, err = MachineByID(ctx, tx, machineID, "")
		return err
	}); err != nil {
		return Target{}, fmt.Errorf("machine %s: %w", machineID, err)
	}
	if r.sealer == nil {
		return Target{}, errors.New("no sealer (BETTER_COMPUTE_SECRET) to open the BMC credential")
	}
	pw, err := r.sealer.Open(sealRef(m.BMCCredentialRef), m.BMCCredential)
	if err != nil {
		return Target{}, fmt.Errorf("open the BMC credential %s: %w", m.BMCCredentialRef, err)
	}
	return Target{MachineID: m.ID, TenantID: m.TenantID, SiteID: m.SiteID, Name: m.Name, MAC: m.MAC, BMCDriver: m.BMCDriver,
		BMCAddress: m.BMCAddress, Credentials: bmc.NewCredentials(m.BMCUsername, string(pw)), HardwareProfile: m.HardwareProfile}, nil
}

// PowerStatus asks the site agent of the machine's site for its power.
func (r *Runtime) PowerStatus(ctx context.Context, machineID string) (bmc.PowerState, error) {
	t, err := r.target(ctx, machineID)
	if err != nil {
		return "", err
	}
	agent, ok := r.Agents.get(t.SiteID)
	if !ok {
		return "", envelope.Errorf(envelope.CodeUnavailable, "site %s has no connected site agent to ask the BMC", t.SiteID)
	}
	return agent.PowerStatus(ctx, t)
}

// stepRunner hands every machine step to the site agent of its machine's
// site.
type stepRunner struct{ r *Runtime }

func (s stepRunner) Dispatch(ctx context.Context, run provision.StepRun) (provision.Dispatched, error) {
	t, err := s.r.target(ctx, run.TargetID)
	if err != nil {
		return provision.Dispatched{}, fmt.Errorf("%w: %w", provision.ErrNotDispatched, err)
	}
	nodeID, err := s.ramdiskNode(ctx, run)
	if err != nil {
		return provision.Dispatched{}, fmt.Errorf("%w: %w", provision.ErrNotDispatched, err)
	}
	if nodeID != "" {
		return s.r.Ramdisk.Dispatch(ctx, t, nodeID, run)
	}
	agent, ok := s.r.Agents.get(t.SiteID)
	if !ok {
		return provision.Dispatched{}, fmt.Errorf("%w: site %s has no connected site agent", provision.ErrNotDispatched, t.SiteID)
	}
	if boot, _ := run.Params["boot"].(string); run.Kind == KindPowerCycle && (boot == BootRamdisk || boot == BootRescue) {
		var m Machine
		if err := s.r.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			m, err = MachineByID(ctx, tx, run.TargetID, "")
			return err
		}); err != nil {
			return provision.Dispatched{}, fmt.Errorf("%w: %w", provision.ErrNotDispatched, err)
		}
		if t.DiscoveryToken, err = s.r.mintDiscovery(ctx, m); err != nil {
			return provision.Dispatched{}, fmt.Errorf("%w: %w", provision.ErrNotDispatched, err)
		}
	}
	return agent.Dispatch(ctx, t, run)
}

// ramdiskNode is the node of the ramdisk that joined through the gateway
// for run's workflow, when run is a ramdisk step and a RamdiskAgent is
// configured; "" sends the step to the site agent (whose in-process
// ramdisk, like bctest.SimSite's, joined without a node).
func (s stepRunner) ramdiskNode(ctx context.Context, run provision.StepRun) (string, error) {
	if s.r.Ramdisk == nil || !slices.Contains(RamdiskKinds, run.Kind) {
		return "", nil
	}
	var nodeID string
	err := s.r.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		nodeID, _, err = ramdiskOf(ctx, tx, run.TargetID, run.WorkflowID)
		return err
	})
	return nodeID, err
}

func (s stepRunner) Lookup(ctx context.Context, run provision.StepRun) (provision.Outcome, error) {
	t, err := s.r.target(ctx, run.TargetID)
	if err != nil {
		return provision.Outcome{}, err
	}
	nodeID, err := s.ramdiskNode(ctx, run)
	if err != nil {
		return provision.Outcome{}, err
	}
	if nodeID != "" {
		return s.r.Ramdisk.Lookup(ctx, t, nodeID, run)
	}
	agent, ok := s.r.Agents.get(t.SiteID)
	if !ok {
		// Nothing is decided while the site is away: the sweep asks again.
		return provision.Outcome{}, fmt.Errorf("site %s has no connected site agent", t.SiteID)
	}
	return agent.Lookup(ctx, t, run)
}

// onEnd moves a machine on when its workflow ends, in the workflow's
// transaction.
func (r *Runtime) onEnd(ctx context.Context, tx store.Tx, w provision.Workflow) error {
	m, err := MachineByID(ctx, tx, w.TargetID, store.ForUpdate(tx))
	if errors.Is(err, store.ErrNotFound) {
		if r.otherEnded != nil {
			return r.otherEnded(ctx, tx, w)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if m.WorkflowID != w.ID {
		return nil
	}
	full, err := provision.Get(ctx, tx, w.ID)
	if err != nil {
		return err
	}
	now := r.clock.Now()
	_, ramdiskKey, err := ramdiskOf(ctx, tx, m.ID, w.ID)
	if err != nil {
		return err
	}
	op := w.Profile
	// The ramdisk boot is over: its discovery tokens go, and the nodes
	// its ramdisks joined as are retired.
	nodes, err := ramdiskNodes(ctx, tx, m.ID)
	if err != nil {
		return err
	}
	if w.State == provision.WorkflowSucceeded && (op == OpRelease || op == OpCommission || op == OpLeaseTeardown) {
		// The wipe took the deployed OS: the nodes it joined as go too.
		osNodes, err := deployedNodes(ctx, tx, m.ID)
		if err != nil {
			return err
		}
		nodes = append(nodes, osNodes...)
	}
	if len(nodes) > 0 && r.ended != nil {
		if err := r.ended(ctx, tx, nodes); err != nil {
			return err
		}
	}
	if err := discoveryDelete(ctx, tx, m.ID); err != nil {
		return err
	}
	var failedLogs, wipeStep string
	var wipeErr error
	for _, s := range full.Steps {
		if s.State == provision.StepSucceeded {
			switch s.Kind {
			case KindInventory:
				m.Inventory = s.Output
			case KindDiskWipe:
				rec, err := attestedWipe(s.Output, ramdiskKey, m.ID, w.ID)
				if err != nil {
					wipeStep, wipeErr = s.Name, err
					continue
				}
				m.EraseRecord = rec
			}
		}
		if s.Name == w.FailedStep && s.Phase == provision.PhaseMain {
			failedLogs = cmp.Or(s.Logs, s.Error)
		}
	}
	m.WorkflowID, m.Operation, m.UpdateTime = "", "", now
	if leaseOp(op) && m.LeaseID != "" {
		return r.leaseEnded(ctx, tx, &m, w, full.Steps, ramdiskKey, failedLogs)
	}
	if op == OpRotateBMC {
		// Like a power action, a rotation leaves the lifecycle state as
		// it is; its outcome is the credential's and maintenance's.
		return r.rotationEnded(ctx, tx, &m, w, full.Steps)
	}
	if powerOp(op) {
		// A power action changes nothing of the lifecycle: the machine
		// keeps its state, and a failure is the workflow's and the
		// event's to tell.
		if err := MachineUpdate(ctx, tx, &m); err != nil {
			return err
		}
		if r.rec == nil {
			return nil
		}
		data := map[string]any{"state": string(m.State), "operation": op, "workflow_id": w.ID, "result": string(w.State)}
		if w.State != provision.WorkflowSucceeded {
			data["failed_step"], data["reason"] = w.FailedStep, cmp.Or(w.Reason, string(w.State))
		}
		return r.rec.InsertEvents(ctx, tx, []envelope.Event{{Type: "machine.power", TenantID: m.TenantID,
			ResourceType: "Machine", ResourceID: m.ID, Time: now, Data: data}})
	}
	if wipeErr != nil && w.State == provision.WorkflowSucceeded {
		// A machine returns to ready only after a wipe the control plane
		// verified: an unsigned or forged record fails it.
		return r.refuseWipe(ctx, tx, &m, op, wipeStep, wipeErr)
	}
	if w.State == provision.WorkflowSucceeded {
		m.FailedOperation, m.FailedStep, m.FailureReason, m.FailureLogs = "", "", "", ""
		switch op {
		case OpInspect:
			m.State = StateEnrolled
			if m.Commissioned {
				m.State = StateReady
			}
		case OpCommission:
			m.State, m.Commissioned = StateReady, true
			// The firmware a lease's teardown must find again: only what
			// the ramdisk signed counts.
			m.FirmwareBaseline = signedFirmware(full.Steps, ramdiskKey, m.ID, w.ID)
			// The wipe took whatever a failed deploy left on the disk.
			if err := r.unpinImage(ctx, tx, &m); err != nil {
				return err
			}
		case OpDeploy:
			m.State = StateDeployed
		case OpRelease:
			if err := r.unpinImage(ctx, tx, &m); err != nil {
				return err
			}
			m.State, m.RescueExpireTime = StateReady, nil
		case OpRescue:
			exp := now.Add(inputSeconds(w.Input["duration_seconds"]))
			m.State, m.RescueExpireTime = StateRescue, &exp
		case OpRescueEndDisk:
			m.State, m.RescueExpireTime = StateDeployed, nil
		case OpRescueEndOff:
			m.State, m.RescueExpireTime = StateReady, nil
		}
	} else {
		m.State = StateFailed
		m.FailedOperation, m.FailedStep = op, w.FailedStep
		m.FailureReason = cmp.Or(w.Reason, string(w.State))
		if w.State == provision.WorkflowCancelled {
			m.FailureReason = "the workflow was cancelled"
		}
		m.FailureLogs = failedLogs
	}
	if err := MachineUpdate(ctx, tx, &m); err != nil {
		return err
	}
	if r.rec == nil {
		return nil
	}
	data := map[string]any{"state": string(m.State), "operation": op, "workflow_id": w.ID}
	if m.State == StateFailed {
		data["failed_step"], data["reason"] = m.FailedStep, m.FailureReason
	}
	return r.rec.InsertEvents(ctx, tx, []envelope.Event{{Type: "machine." + string(m.State), TenantID: m.TenantID,
		ResourceType: "Machine", ResourceID: m.ID, Time: now, Data: data}})
}

// inputSeconds reads a number of seconds from a workflow's input (JSON
// numbers decode as float64).
func inputSeconds(v any) time.Duration {
	switch n := v.(type) {
	case float64:
		return time.Duration(n) * time.Second
	case int64:
		return time.Duration(n) * time.Second
	case int:
		return time.Duration(n) * time.Second
	}
	return 0
}

// unpinImage drops a machine's use of its image (image_refs) once its disk
// was wiped.
func (r *Runtime) unpinImage(ctx context.Context, tx store.Tx, m *Machine) error {
	if m.ImageID == "" {
		return nil
	}
	if _, err := images.RefDelete(ctx, tx, m.ImageID, "machine", m.ID); err != nil {
		return err
	}
	m.ImageID, m.ImageName = "", ""
	return nil
}

// BMCRunner is the runner of the lifecycle's BMC steps (power.cycle,
// power.off, power.on) for another module's workflow whose step names a
// machine as its target (the health module's reboot of an unresponsive
// node); the step completes through the site agent's report, by its key.
func (r *Runtime) BMCRunner() provision.StepRunner { return stepRunner{r} }
