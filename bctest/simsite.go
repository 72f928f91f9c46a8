package bctest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bctest/redfish"
	"github.com/better-compute/better-compute/internal/erase"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/metal/bmc"
	"github.com/better-compute/better-compute/internal/provision"
)

// SimSite is a simulated site agent for fast bare-metal tests: it takes the
// control plane's machine steps like bcd in site mode would, drives each
// machine's power through the real Redfish driver against a bctest/redfish
// emulator on loopback, and plays the machine's ramdisk (inventory, wipe,
// image write) in memory, reporting results and rejoins back to the
// control plane. Its ramdisk has a key of its own per boot, registered
// with metal.Runtime.JoinedRamdisk, and signs its wipe records with it,
// as bcd --mode ramdisk does (the control plane verifies them). Every step runs in its own goroutine and reports through
// metal.Runtime.Complete, as a site agent's command updates would.
type SimSite struct {
	rt     *metal.Runtime
	siteID string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	unregister func()
	closeOnce  sync.Once

	mu       sync.Mutex
	machines map[string]*SimMachine // by BMC address
	servers  []*httptest.Server
	keys     map[string]*simKey
	failNext map[string]string        // step kind -> error
	holdNext map[string]chan struct{} // step kind -> closed to let it go on
	// delay is how long each step takes (0: at once).
	delay time.Duration
	forge bool // sign wipe records with a key the control plane never saw
	// signer, when set, signs BMC steps' results as a site node
	// (SignSiteReports).
	signer    *siteSigner
	ipmiPorts int
}

// SimMachine is a simulated machine: a Redfish BMC on loopback and a disk.
type SimMachine struct {
	Name string
	MAC  string
	// BMCAddress is the emulator's URL (http://127.0.0.1:port).
	BMCAddress string
	Username   string
	Password   string
	// Power is the machine behind the BMC: it records every boot.
	Power *redfish.MemoryPower
	// BMCDriver is "" (redfish) or "ipmi" (AddIPMIMachine).
	BMCDriver   string
	inMemoryBMC bool
	firmware    map[string]any

	mu     sync.Mutex
	image  string // sha256 of the image on its disk
	wipes  int
	booted []string      // boot modes the site's iPXE script chose
	key    crypto.Signer // the running ramdisk's key
	// rotated counts the BMC password rotations the site applied.
	rotated int
}

type simKey struct {
	state   provision.OutcomeStatus
	result  provision.Result
	applied int
	handle  string
}

// NewSimSite connects a simulated site agent for siteID to the control
// plane's machine runtime; it disconnects when the test ends.
func NewSimSite(t testing.TB, rt *metal.Runtime, siteID string) *SimSite {
	t.Helper()
	s := StartSimSite(rt, siteID)
	t.Cleanup(s.Close)
	return s
}

// StartSimSite connects a simulated site agent for siteID to the control
// plane's machine runtime, for a caller that is not a test (dev
// --sim-machines); Close disconnects it and stops its BMCs.
func StartSimSite(rt *metal.Runtime, siteID string) *SimSite {
	ctx, cancel := context.WithCancel(context.Background())
	s := &SimSite{rt: rt, siteID: siteID, ctx: ctx, cancel: cancel, machines: map[string]*SimMachine{},
		keys: map[string]*simKey{}, failNext: map[string]string{}, holdNext: map[string]chan struct{}{}}
	s.unregister = rt.Agents.Register(siteID, s)
	return s
}

// Close disconnects the site agent, waits for the steps it is carrying
// out and stops its machines' BMCs. It is safe to call twice.
func (s *SimSite) Close() {
	s.closeOnce.Do(func() {
		s.unregister()
		s.cancel()
		s.wg.Wait()
		s.mu.Lock()
		servers := s.servers
		s.servers = nil
		s.mu.Unlock()
		for _, srv := range servers {
			srv.Close()
		}
	})
}

// SetStepDelay makes every step take d before it reports, as a real
// machine's would take seconds (dev uses it so that a lifecycle can be
// watched); 0, the default, reports at once.
func (s *SimSite) SetStepDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

var simMACs sync.Map

// AddMachine starts a machine's BMC: a Redfish emulator with its own random
// password, on loopback.
func (s *SimSite) AddMachine(t testing.TB, name string) *SimMachine {
	t.Helper()
	m, err := s.NewMachine(name)
	if err != nil {
		t.Fatalf("bctest: simulated machine %s: %v", name, err)
	}
	return m
}

// NewMachine is AddMachine for a caller that is not a test: the BMC stops
// when the site is closed.
func (s *SimSite) NewMachine(name string) (*SimMachine, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	spec := SimMachineSpec{Name: name, Username: "admin", Password: "pw-" + hex.EncodeToString(b[:])}
	// A locally administered unicast MAC, unique in this process.
	for {
		if _, err := rand.Read(b[:5]); err != nil {
			return nil, err
		}
		mac := fmt.Sprintf("52:54:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3])
		if _, dup := simMACs.LoadOrStore(mac, true); !dup {
			spec.MAC = mac
			break
		}
	}
	return s.RestoreMachine(spec)
}

// SimMachineSpec is what identifies a simulated machine to the control
// plane: kept by a caller that brings the same machines back after a
// restart (dev --sim-machines).
type SimMachineSpec struct {
	Name       string `json:"name"`
	MAC        string `json:"mac"`
	BMCAddress string `json:"bmc_address,omitempty"`
	Username   string `json:"username"`
	Password   string `json:"password"`
}

// Spec returns the machine's identity.
func (m *SimMachine) Spec() SimMachineSpec {
	return SimMachineSpec{Name: m.Name, MAC: m.MAC, BMCAddress: m.BMCAddress, Username: m.Username, Password: m.Password}
}

// RestoreMachine starts a machine's BMC with spec's login, on spec's BMC
// address when it has one (an http://127.0.0.1:port URL, which must be
// free), else on a free loopback port.
func (s *SimSite) RestoreMachine(spec SimMachineSpec) (*SimMachine, error) {
	addr := "127.0.0.1:0"
	if spec.BMCAddress != "" {
		u, err := url.Parse(spec.BMCAddress)
		if err != nil || u.Scheme != "http" || u.Host == "" {
			return nil, fmt.Errorf("machine %s: BMC address %q is not an http://host:port URL", spec.Name, spec.BMCAddress)
		}
		addr = u.Host
	}
	// A restored MAC is taken: a new machine of this process must not
	// draw it.
	simMACs.Store(spec.MAC, true)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("machine %s: listen for its BMC: %w", spec.Name, err)
	}
	m := &SimMachine{Name: spec.Name, MAC: spec.MAC, Username: spec.Username, Password: spec.Password, Power: &redfish.MemoryPower{}}
	srv := httptest.NewUnstartedServer(redfish.New(redfish.Config{Username: m.Username, Password: m.Password, Power: m.Power}))
	_ = srv.Listener.Close()
	srv.Listener = ln
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		_ = ln.Close()
		return nil, errors.New("the simulated site is closed")
	}
	srv.Start()
	m.BMCAddress = srv.URL
	s.servers = append(s.servers, srv)
	s.machines[m.BMCAddress] = m
	return m, nil
}

// Machines lists the site's machines in the order they were added.
func (s *SimSite) Machines() []*SimMachine {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*SimMachine, 0, len(s.servers))
	for _, srv := range s.servers {
		out = append(out, s.machines[srv.URL])
	}
	return out
}

// FailNext makes the next step of kind fail with reason (and the logs a
// ramdisk would leave).
func (s *SimSite) FailNext(kind, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext[kind] = reason
}

// HoldNext keeps the next step of kind in flight (dispatched, not yet
// carried out) until the returned function is called, as a slow BMC or
// wipe would: a test can act on a workflow while its step is in flight.
func (s *SimSite) HoldNext(kind string) (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.holdNext[kind] = ch
	s.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// Applied reports how many times the site applied an idempotency key.
func (s *SimSite) Applied(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.keys[key]; k != nil {
		return k.applied
	}
	return 0
}

// MaxApplied is the most times any key was applied (1 when every
// destructive step ran at most once).
func (s *SimSite) MaxApplied() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range s.keys {
		n = max(n, k.applied)
	}
	return n
}

// Image is the sha256 of the image on the machine's disk ("" when wiped).
func (m *SimMachine) Image() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.image
}

// ForgeWipes makes the site's ramdisks sign wipe records with a key the
// control plane never saw (a forged attestation), or stop doing so.
func (s *SimSite) ForgeWipes(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forge = on
}

// Wipes counts the machine's disk wipes.
func (m *SimMachine) Wipes() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.wipes
}

// Booted lists the boot modes (ramdisk, rescue, disk) of the machine's
// boots so far.
func (m *SimMachine) Booted() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.booted...)
}

// Dispatch takes a step: a target that is not a machine of this site, or a
// key already fenced, is refused.
func (s *SimSite) Dispatch(_ context.Context, t metal.Target, run provision.StepRun) (provision.Dispatched, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[t.BMCAddress]
	if !ok || t.SiteID != s.siteID {
		return provision.Dispatched{}, fmt.Errorf("%w: %s is not a machine of site %s", provision.ErrNotDispatched, t.MachineID, s.siteID)
	}
	k := s.keys[run.IdempotencyKey]
	switch {
	case k != nil && k.state == provision.OutcomeNotDispatched:
		return provision.Dispatched{}, fmt.Errorf("%w: key %s is fenced", provision.ErrNotDispatched, run.IdempotencyKey)
	case k != nil:
		// A repeated delivery of a key: applied once.
		return provision.Dispatched{Handle: k.handle}, nil
	}
	handle := "sim-" + run.IdempotencyKey
	signer := s.signer
	if signer != nil && siteStep(run.Kind) {
		id, err := signer.command(s.ctx, t, run)
		if err != nil {
			return provision.Dispatched{}, fmt.Errorf("%w: %w", provision.ErrNotDispatched, err)
		}
		handle = id
	}
	k = &simKey{state: provision.OutcomeRunning, applied: 1, handle: handle}
	s.keys[run.IdempotencyKey] = k
	fail := s.failNext[run.Kind]
	delete(s.failNext, run.Kind)
	delay := s.delay
	hold := s.holdNext[run.Kind]
	delete(s.holdNext, run.Kind)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if hold != nil {
			select {
			case <-hold:
			case <-s.ctx.Done():
				return
			}
		}
		if delay > 0 {
			select {
			case <-time.After(delay):
			case <-s.ctx.Done():
				return
			}
		}
		res := s.apply(s.ctx, m, t, run, fail)
		if signer != nil && siteStep(run.Kind) && res.Error == "" {
			if err := signer.report(s.ctx, handle, res.Output); err != nil {
				res = provision.Result{Error: "sign the report: " + err.Error()}
			}
		}
		s.mu.Lock()
		k.result, k.state = res, provision.OutcomeSucceeded
		if res.Error != "" {
			k.state = provision.OutcomeFailed
		}
		s.mu.Unlock()
		if err := s.rt.Complete(s.ctx, run.IdempotencyKey, res); err != nil {
			return // the test is over, or the sweep asks Lookup later
		}
		if boot, _ := run.Params["boot"].(string); run.Kind == metal.KindPowerCycle && boot != "" && res.Error == "" {
			// The machine PXE-boots; its ramdisk (or its deployed OS) joins.
			if boot, _ := run.Params["boot"].(string); boot == metal.BootDisk {
				_ = s.rt.Joined(s.ctx, s.siteID, t.MachineID)
			} else if pub := m.bootRamdisk(); pub != nil {
				_ = s.rt.JoinedRamdisk(s.ctx, s.siteID, t.MachineID, pub)
			}
		}
	}()
	return provision.Dispatched{Handle: handle}, nil
}

// Lookup answers what became of a key; a key never seen is fenced.
func (s *SimSite) Lookup(_ context.Context, _ metal.Target, run provision.StepRun) (provision.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[run.IdempotencyKey]
	if k == nil {
		s.keys[run.IdempotencyKey] = &simKey{state: provision.OutcomeNotDispatched}
		return provision.Outcome{Status: provision.OutcomeNotDispatched}, nil
	}
	return provision.Outcome{Status: k.state, Handle: k.handle, Result: k.result}, nil
}

// PowerStatus reads a machine's power from its BMC with the real driver;
// a target that is not a machine of this site is refused.
func (s *SimSite) PowerStatus(ctx context.Context, t metal.Target) (bmc.PowerState, error) {
	s.mu.Lock()
	_, ok := s.machines[t.BMCAddress]
	s.mu.Unlock()
	if !ok || t.SiteID != s.siteID {
		return "", fmt.Errorf("%s is not a machine of site %s", t.MachineID, s.siteID)
	}
	d, err := bmc.New(t.BMCDriver, t.BMCAddress, t.Credentials, bmc.Options{})
	if err != nil {
		return "", err
	}
	defer func() { _ = d.Close(context.WithoutCancel(ctx)) }()
	return d.PowerStatus(ctx)
}

// apply carries out one step on the simulated machine.
func (s *SimSite) apply(ctx context.Context, m *SimMachine, t metal.Target, run provision.StepRun, fail string) provision.Result {
	if fail != "" {
		return provision.Result{Error: fail, Logs: fmt.Sprintf("%s: %s\nstep %s gave up", run.Kind, fail, run.Name)}
	}
	if run.Kind == metal.KindDriverInvoke {
		// The driver operations the simulated BMC has are its power
		// actions; the site agent refuses any other before it gets here.
		op, _ := run.Params["operation"].(string)
		kind, ok := map[string]string{"power.on": metal.KindPowerOn, "power.off": metal.KindPowerOff, "power.cycle": metal.KindPowerCycle}[op]
		if !ok {
			err := fmt.Sprintf("driver.invoke: the simulated BMC has no operation %q", op)
			return provision.Result{Error: err, Logs: err}
		}
		run.Kind = kind
	}
	switch run.Kind {
	case metal.KindPowerCycle, metal.KindPowerOff, metal.KindPowerOn:
		if m.inMemoryBMC {
			if err := memoryPower(ctx, m.Power, run.Kind); err != nil {
				return provision.Result{Error: err.Error(), Logs: err.Error()}
			}
		} else if err := power(ctx, t, run.Kind); err != nil {
			return provision.Result{Error: err.Error(), Logs: err.Error()}
		}
		if boot, _ := run.Params["boot"].(string); run.Kind == metal.KindPowerCycle && boot != "" {
			m.mu.Lock()
			m.booted = append(m.booted, boot)
			m.mu.Unlock()
		}
		return provision.Result{Output: map[string]any{"power": strings.TrimPrefix(run.Kind, "power.")}}
	case metal.KindInventory:
		m.mu.Lock()
		key := m.key
		m.mu.Unlock()
		return signStep(key, t, run, map[string]any{
			"cpus": 64, "memory_bytes": int64(512) << 30,
			"disks":    []any{map[string]any{"device": "/dev/nvme0n1", "size_bytes": int64(3840) << 30, "model": "SIM NVMe"}},
			"nics":     []any{map[string]any{"name": "eno1", "mac": m.MAC}},
			"gpus":     []any{map[string]any{"model": "H100", "count": 8}},
			"firmware": m.firmwareReport(),
		})
	case metal.KindBMCRotate:
		if !m.inMemoryBMC {
			return provision.Result{Error: "the simulated site rotates only an IPMI machine's password (AddIPMIMachine)"}
		}
		pending, _ := run.Input["pending_ref"].(string)
		m.mu.Lock()
		m.rotated++
		m.mu.Unlock()
		return provision.Result{Output: map[string]any{"login_verified": true, "pending_ref": pending}}
	case metal.KindDiskWipe:
		m.mu.Lock()
		m.image, m.wipes = "", m.wipes+1
		key := m.key
		m.mu.Unlock()
		s.mu.Lock()
		forge := s.forge
		s.mu.Unlock()
		if forge || key == nil {
			key, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		}
		signed, err := erase.Sign(key, erase.Record{MachineID: t.MachineID, WorkflowID: run.WorkflowID, Time: time.Now(),
			Drives: []erase.Drive{{Device: "/dev/nvme0n1", Method: erase.MethodNVMeFormat, Bytes: int64(3840) << 30, DurationMS: 1,
				Verification: erase.Verification{Samples: 66, BlockBytes: 4096, Zero: true}}}})
		if err != nil {
			return provision.Result{Error: err.Error()}
		}
		return provision.Result{Output: signed.Output()}
	case metal.KindBurnIn:
		m.mu.Lock()
		key := m.key
		m.mu.Unlock()
		if on, _ := run.Input["burn_in"].(bool); !on {
			return signStep(key, t, run, map[string]any{"skipped": true})
		}
		return signStep(key, t, run, map[string]any{"passed": true, "gpus": 8})
	case metal.KindImageWrite:
		img, _ := run.Input["image"].(map[string]any)
		sha, _ := img["sha256"].(string)
		if sha == "" {
			return provision.Result{Error: "no image in the workflow input"}
		}
		m.mu.Lock()
		m.image = sha
		m.mu.Unlock()
		return provision.Result{Output: map[string]any{"sha256": sha}}
	case metal.KindConfigure:
		return provision.Result{Output: map[string]any{"hostname": t.Name}}
	}
	return provision.Result{Error: "the simulated site does not know step kind " + run.Kind}
}

// bootRamdisk gives the machine's new ramdisk a key and returns its public
// half (PKIX DER).
func (m *SimMachine) bootRamdisk() []byte {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil
	}
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		return nil
	}
	m.mu.Lock()
	m.key = k
	m.mu.Unlock()
	return der
}

// memoryPower plays a power step on a machine whose BMC is simulated in
// memory.
func memoryPower(ctx context.Context, p *redfish.MemoryPower, kind string) error {
	switch kind {
	case metal.KindPowerCycle:
		return p.Restart(ctx, "", true)
	case metal.KindPowerOff:
		return p.Off(ctx, true)
	case metal.KindPowerOn:
		return p.On(ctx, "")
	}
	return errors.New("not a power step: " + kind)
}

// Rotations counts the BMC password rotations the site applied to the
// machine.
func (m *SimMachine) Rotations() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rotated
}

// power drives the machine's BMC with the real driver.
func power(ctx context.Context, t metal.Target, kind string) error {
	d, err := bmc.New(t.BMCDriver, t.BMCAddress, t.Credentials, bmc.Options{})
	if err != nil {
		return err
	}
	defer func() { _ = d.Close(context.WithoutCancel(ctx)) }()
	switch kind {
	case metal.KindPowerCycle:
		return d.PowerCycle(ctx)
	case metal.KindPowerOff:
		return d.PowerOff(ctx)
	case metal.KindPowerOn:
		return d.PowerOn(ctx)
	}
	return errors.New("not a power step: " + kind)
}
