// Package site is bcd's site mode: the agent on a site's provisioning
// network. It applies the control plane's bmc.power and bmc.rotate (BMC
// password rotation) commands with the BMC drivers and serves PXE (DHCP, TFTP, HTTP from internal/site/pxe) with a
// per-machine iPXE decision taken from the machine list the control plane
// sends (site.machines).
//
// It must never touch a BMC or boot a machine the control plane did not
// send as an enrolled machine of its site, never apply a command of an
// epoch older than one it has seen (a former boot-lease holder's), never
// apply an idempotency key twice — not across a restart either — and never
// log or store a BMC password.
package site

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/metal/bmc"
	"github.com/better-compute/better-compute/internal/site/pxe"
)

// Command kinds the site agent applies (metal.CommandBMCPower and
// metal.CommandSiteMachines).
const (
	KindBMCPower     = "bmc.power"
	KindBMCRotate    = "bmc.rotate"
	KindSiteMachines = "site.machines"
)

// Failure codes of the site agent's commands.
const (
	FailStaleEpoch    = "STALE_EPOCH"
	FailNotEnrolled   = "NOT_ENROLLED"
	FailNoCredential  = "NO_CREDENTIAL"
	FailBMC           = "BMC_FAILED"
	FailKeyInterrupts = "INTERRUPTED"
	// FailNoDriver: the machine names a BMC driver this agent does not
	// have (not a built-in, not in its drivers directory).
	FailNoDriver = "NO_DRIVER"
)

// Boots a machine's iPXE script gives (metal.BootRamdisk, BootRescue,
// BootDisk), and metal.BootFenced: a leased machine being torn down is
// cut off the provisioning network (no DHCP boot answer) until its
// teardown boots the ramdisk.
const (
	BootRamdisk = "ramdisk"
	BootRescue  = "rescue"
	BootDisk    = "disk"
	BootFenced  = "fenced"
)

// stateFile holds the epoch, the machine list and the idempotency record in
// bcd's state directory (0600).
const stateFile = "site.json"

// maxKeys bounds the idempotency record; a key is never redelivered after
// its step's workflow moved on, so the oldest go first.
const maxKeys = 4096

// Config configures the site agent.
type Config struct {
	// StateDir is bcd's state directory (required).
	StateDir string
	// Ramdisk is what a machine whose boot is ramdisk gets; a rescue boot
	// gets the same with RescueArg added to its command line.
	Ramdisk   pxe.Ramdisk
	RescueArg string // default "bc.rescue=1"
	// BMC tunes the BMC drivers.
	BMC bmc.Options
	// Drivers builds every BMC driver the agent runs: the built-ins and
	// the external drivers of its drivers directory (LoadDrivers). Nil:
	// the built-ins only.
	Drivers *bmc.Registry
	Logger  *slog.Logger
	// ImagesURL is the site's own image cache as a ramdisk reaches it
	// ("http://SITE/files/sha256"): it goes on the ramdisk's command line
	// (bc.images=) as image.write's source.
	ImagesURL string
	// Fetch streams a deploying machine's image blob from the control
	// plane over bcd's gateway connection, with the capability the
	// machine list carries (agent.Agent.FetchSiteImage); SetFetch sets it
	// once the agent exists.
	Fetch func(ctx context.Context, sha256, token string) (io.ReadCloser, error)
	// Prefetch, when set, warms the site's cache with a digest as soon as
	// a deploying machine names it (pxe.Server.Prefetch).
	Prefetch func(ctx context.Context, digest string) error
}

// MachineImage is the image a deploying machine is about to write: its
// digest and the capability to fetch it from the control plane, which
// opens only with this agent's certificate, once.
type MachineImage struct {
	SHA256 string `json:"sha256"`
	Token  string `json:"fetch_token"`
}

// Machine is an enrolled machine of the site, as the control plane sent it.
type Machine struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	MAC        string `json:"mac"`
	BMCDriver  string `json:"bmc_driver"`
	BMCAddress string `json:"bmc_address"`
	State      string `json:"state"`
	Boot       string `json:"boot"`
	// Image is set while the machine deploys. It holds a capability:
	// the state file is 0600.
	Image *MachineImage `json:"image,omitempty"`
}

type keyRecord struct {
	Key string `json:"key"`
	// Done is false while the key's BMC call is out: found so after a
	// restart, the key is not applied again.
	Done   bool           `json:"done"`
	Result map[string]any `json:"result,omitempty"`
	Error  string         `json:"error,omitempty"`
}

type state struct {
	Epoch    int64       `json:"epoch"`
	Machines []Machine   `json:"machines"`
	Keys     []keyRecord `json:"keys"`
}

// Agent is the site mode's command handler (agent.CommandHandler) and PXE
// decider (pxe.Decider).
type Agent struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	st    state
	byMAC map[string]Machine
	// tokens are the discovery tokens of the machines' pending ramdisk
	// boots, by machine id: kept in memory only (a secret; after a
	// restart the boot's join fails and the step is retried).
	tokens map[string]pxe.Secret
}

var (
	_ agent.CommandHandler = (*Agent)(nil)
	_ pxe.Decider          = (*Agent)(nil)
)

// New loads the site agent's state from cfg.StateDir.
func New(cfg Config) (*Agent, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("site: StateDir is required")
	}
	if cfg.RescueArg == "" {
		cfg.RescueArg = "bc.rescue=1"
	}
	a := &Agent{cfg: cfg, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.Default()
	}
	if a.cfg.Drivers == nil {
		a.cfg.Drivers = bmc.NewRegistry(a.log)
	}
	b, err := os.ReadFile(filepath.Join(cfg.StateDir, stateFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("site: read state: %w", err)
	default:
		if err := json.Unmarshal(b, &a.st); err != nil {
			return nil, fmt.Errorf("site: state %s is corrupt: %w", stateFile, err)
		}
	}
	a.indexLocked()
	return a, nil
}

func (a *Agent) indexLocked() {
	a.byMAC = map[string]Machine{}
	for _, m := range a.st.Machines {
		if hw, err := net.ParseMAC(m.MAC); err == nil {
			a.byMAC[hw.String()] = m
		}
	}
}

// saveLocked writes the state atomically (temp file, fsync, rename).
func (a *Agent) saveLocked() error {
	b, err := json.Marshal(a.st)
	if err != nil {
		return err
	}
	path := filepath.Join(a.cfg.StateDir, stateFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Epoch is the newest boot-lease epoch the agent has seen.
func (a *Agent) Epoch() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.st.Epoch
}

// Machines are the site's enrolled machines as last sent.
func (a *Agent) Machines() []Machine {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Machine(nil), a.st.Machines...)
}

// Apply applies a site command.
func (a *Agent) Apply(ctx context.Context, c *agentv1.Command) (*structpb.Struct, error) {
	switch c.GetKind() {
	case KindSiteMachines:
		return a.machines(c)
	case KindBMCPower:
		return a.power(ctx, c)
	case KindBMCRotate:
		return a.rotate(ctx, c)
	}
	return nil, agent.CommandError(agent.FailUnknownKind, fmt.Errorf("unknown command kind %q", c.GetKind()))
}

// checkEpochLocked refuses a command of an epoch older than one seen, and
// moves the agent to a newer one.
func (a *Agent) checkEpochLocked(epoch int64) error {
	if epoch < a.st.Epoch {
		return agent.CommandError(FailStaleEpoch, fmt.Errorf("sent under boot-lease epoch %d; this agent is at epoch %d", epoch, a.st.Epoch))
	}
	a.st.Epoch = epoch
	return nil
}

func (a *Agent) machines(c *agentv1.Command) (*structpb.Struct, error) {
	var p struct {
		Epoch    int64     `json:"epoch"`
		Machines []Machine `json:"machines"`
	}
	if err := decode(c.GetParams(), &p); err != nil {
		return nil, err
	}
	for i, m := range p.Machines {
		if m.ID == "" {
			return nil, agent.CommandError(agent.FailInvalidParams, fmt.Errorf("machines[%d]: id is required", i))
		}
		if _, err := net.ParseMAC(m.MAC); err != nil {
			return nil, agent.CommandError(agent.FailInvalidParams, fmt.Errorf("machines[%d].mac: %w", i, err))
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkEpochLocked(p.Epoch); err != nil {
		return nil, err
	}
	a.st.Machines = p.Machines
	a.indexLocked()
	if err := a.saveLocked(); err != nil {
		return nil, agent.CommandError(agent.FailPersist, err)
	}
	if prefetch := a.cfg.Prefetch; prefetch != nil {
		for _, m := range p.Machines {
			if m.Image != nil && validDigest(m.Image.SHA256) {
				// The cache fetches while the machine's ramdisk boots;
				// image.write's request waits on the same fetch.
				go func(name, sha string) {
					if err := prefetch(context.Background(), "sha256:"+sha); err != nil {
						a.log.Warn("image prefetch failed; the ramdisk's request fetches again", "machine", name, "digest", "sha256:"+sha, "err", err)
						return
					}
					a.log.Info("image cached", "machine", name, "digest", "sha256:"+sha)
				}(m.Name, m.Image.SHA256)
			}
		}
	}
	return structpb.NewStruct(map[string]any{"machines": len(p.Machines), "epoch": p.Epoch})
}

type powerParams struct {
	Epoch     int64  `json:"epoch"`
	MachineID string `json:"machine_id"`
	MAC       string `json:"mac"`
	Action    string `json:"action"`
	Boot      string `json:"boot"`
	// DiscoveryToken, on a cycle into the ramdisk, goes on the ramdisk's
	// kernel command line (bc.token=) for the machine's next PXE boot.
	DiscoveryToken string `json:"discovery_token"`
	BMC            struct {
		Driver   string `json:"driver"`
		Address  string `json:"address"`
		Username string `json:"username"`
		Password string `json:"password"`
	} `json:"bmc"`
}

// power drives an enrolled machine's BMC, once per idempotency key.
func (a *Agent) power(ctx context.Context, c *agentv1.Command) (*structpb.Struct, error) {
	var p powerParams
	if err := decode(c.GetParams(), &p); err != nil {
		return nil, err
	}
	if p.Action != "cycle" && p.Action != "off" && p.Action != "on" && p.Action != "shutdown" && p.Action != "status" {
		return nil, agent.CommandError(agent.FailInvalidParams, fmt.Errorf("action must be cycle, off, on, shutdown or status, got %q", p.Action))
	}
	key := c.GetIdempotencyKey()
	if key == "" {
		key = c.GetId()
	}
	a.mu.Lock()
	if err := a.checkEpochLocked(p.Epoch); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	m, ok := a.enrolledLocked(p)
	if !ok {
		a.mu.Unlock()
		a.log.Warn("bmc.power refused: not an enrolled machine of this site", "machine", p.MachineID, "bmc", p.BMC.Address)
		return nil, agent.CommandError(FailNotEnrolled, fmt.Errorf("machine %s (BMC %s) is not an enrolled machine of this site", p.MachineID, p.BMC.Address))
	}
	if err := a.checkDriver(p.BMC.Driver); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	if p.Action == "status" {
		// A read: nothing to apply at most once, so no key is recorded.
		a.mu.Unlock()
		if p.BMC.Password == "" {
			return nil, agent.CommandError(FailNoCredential, errors.New("the command carries no BMC credential (it was fenced at delivery)"))
		}
		res, err := a.callBMC(ctx, p)
		if err != nil {
			return nil, agent.CommandError(FailBMC, err)
		}
		return structpb.NewStruct(res)
	}
	if rec := a.keyLocked(key); rec != nil {
		a.mu.Unlock()
		switch {
		case !rec.Done:
			return nil, agent.CommandError(FailKeyInterrupts, fmt.Errorf("key %s was out to the BMC when bcd stopped; its outcome is unknown and it is not applied again", key))
		case rec.Error != "":
			return nil, agent.CommandError(FailBMC, errors.New(rec.Error))
		}
		return structpb.NewStruct(rec.Result)
	}
	if p.BMC.Password == "" {
		a.mu.Unlock()
		return nil, agent.CommandError(FailNoCredential, errors.New("the command carries no BMC credential (it was fenced at delivery)"))
	}
	// Recorded before the BMC call: a restart in the middle finds the key
	// taken and does not call the BMC again.
	a.st.Keys = append(a.st.Keys, keyRecord{Key: key})
	if len(a.st.Keys) > maxKeys {
		a.st.Keys = append([]keyRecord(nil), a.st.Keys[len(a.st.Keys)-maxKeys:]...)
	}
	if p.Action == "cycle" && p.Boot != "" {
		a.setBootLocked(m.ID, p.Boot)
		if a.tokens == nil {
			a.tokens = map[string]pxe.Secret{}
		}
		if p.DiscoveryToken != "" {
			a.tokens[m.ID] = pxe.Secret(p.DiscoveryToken)
		} else {
			delete(a.tokens, m.ID)
		}
	}
	if err := a.saveLocked(); err != nil {
		a.st.Keys = a.st.Keys[:len(a.st.Keys)-1]
		a.mu.Unlock()
		return nil, agent.CommandError(agent.FailPersist, err)
	}
	a.mu.Unlock()

	res, err := a.callBMC(ctx, p)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The call may have reached the BMC: the key stays not done.
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	rec := a.keyLocked(key)
	if rec != nil {
		rec.Done, rec.Result = true, res
		if err != nil {
			rec.Error = err.Error()
		}
		if serr := a.saveLocked(); serr != nil {
			a.log.Error("persist the site's idempotency record", "err", serr)
		}
	}
	if err != nil {
		return nil, agent.CommandError(FailBMC, err)
	}
	return structpb.NewStruct(res)
}

// enrolledLocked finds the machine a bmc.power names: it must be in the
// list the control plane sent, with the same MAC and BMC.
func (a *Agent) enrolledLocked(p powerParams) (Machine, bool) {
	for _, m := range a.st.Machines {
		if m.ID == p.MachineID {
			same := m.BMCDriver == p.BMC.Driver && m.BMCAddress == p.BMC.Address && strings.EqualFold(m.MAC, p.MAC)
			return m, same
		}
	}
	return Machine{}, false
}

func (a *Agent) keyLocked(key string) *keyRecord {
	for i := len(a.st.Keys) - 1; i >= 0; i-- {
		if a.st.Keys[i].Key == key {
			return &a.st.Keys[i]
		}
	}
	return nil
}

func (a *Agent) setBootLocked(id, boot string) {
	for i := range a.st.Machines {
		if a.st.Machines[i].ID == id {
			a.st.Machines[i].Boot = boot
		}
	}
	a.indexLocked()
}

func (a *Agent) callBMC(ctx context.Context, p powerParams) (map[string]any, error) {
	d, err := a.newDriver(p.BMC.Driver, p.BMC.Address, bmc.NewCredentials(p.BMC.Username, p.BMC.Password))
	if err != nil {
		return nil, err
	}
	defer func() { _ = d.Close(context.WithoutCancel(ctx)) }()
	switch p.Action {
	case "cycle":
		err = d.PowerCycle(ctx)
	case "off":
		err = d.PowerOff(ctx)
	case "on":
		err = d.PowerOn(ctx)
	case "shutdown":
		err = d.Shutdown(ctx)
	case "status":
		st, err := d.PowerStatus(ctx)
		if err != nil {
			return nil, err
		}
		return map[string]any{"power": string(st)}, nil
	}
	if err != nil {
		return nil, err
	}
	a.log.Info("bmc power applied", "machine", p.MachineID, "action", p.Action, "boot", p.Boot)
	return map[string]any{"power": p.Action, "boot": p.Boot}, nil
}

// Decide is the per-machine iPXE decision: a machine not in the list, or
// fenced, is unknown; otherwise its boot says ramdisk, rescue (the ramdisk with the
// rescue argument) or its local disk.
func (a *Agent) Decide(_ context.Context, req pxe.Request) (pxe.Boot, error) {
	a.mu.Lock()
	m, ok := a.byMAC[req.MAC.String()]
	token := a.tokens[m.ID]
	a.mu.Unlock()
	if !ok {
		return pxe.Unknown{}, nil
	}
	switch m.Boot {
	case BootFenced:
		return pxe.Unknown{}, nil
	case BootRamdisk, BootRescue:
		r := a.cfg.Ramdisk
		if r.Kernel == "" || r.Initrd == "" {
			return nil, fmt.Errorf("machine %s should boot the %s, but no ramdisk kernel and initrd are configured", m.Name, m.Boot)
		}
		r.Cmdline = strings.TrimSpace(r.Cmdline + " bc.machine=" + m.ID)
		if a.cfg.ImagesURL != "" {
			r.Cmdline += " bc.images=" + a.cfg.ImagesURL
		}
		r.Token = token
		if m.Boot == BootRescue {
			r.Cmdline += " " + a.cfg.RescueArg
		}
		return r, nil
	}
	return pxe.LocalDisk{}, nil
}

// SetPrefetch hands the agent the cache warmer of the PXE server, which is
// built after it (Config.Prefetch).
func (a *Agent) SetPrefetch(fn func(ctx context.Context, digest string) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cfg.Prefetch = fn
}

// SetFetch hands the agent the control plane fetch of bcd's gateway
// connection, which is built after it (Config.Fetch).
func (a *Agent) SetFetch(fn func(ctx context.Context, sha256, token string) (io.ReadCloser, error)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cfg.Fetch = fn
}

// FetchImage is the site cache's upstream (pxe.Config.Upstream): a blob
// is fetched from the control plane only when a machine of the site is
// deploying it, with the capability the machine list carries.
func (a *Agent) FetchImage(ctx context.Context, digest string) (io.ReadCloser, error) {
	sha := strings.TrimPrefix(digest, "sha256:")
	a.mu.Lock()
	token, fetch := "", a.cfg.Fetch
	for _, m := range a.st.Machines {
		if m.Image != nil && m.Image.SHA256 == sha {
			token = m.Image.Token
		}
	}
	a.mu.Unlock()
	switch {
	case token == "":
		return nil, fmt.Errorf("%s: no machine of this site deploys it", digest)
	case fetch == nil:
		return nil, errors.New("no gateway connection to fetch images on")
	}
	rc, err := fetch(ctx, sha, token)
	if err != nil {
		return nil, fmt.Errorf("fetch %s from the control plane: %w", digest, err)
	}
	return rc, nil
}

func validDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// decode reads a command's params into v.
func decode(ps *structpb.Struct, v any) error {
	if ps == nil {
		return agent.CommandError(agent.FailInvalidParams, errors.New("params are required"))
	}
	b, err := ps.MarshalJSON()
	if err != nil {
		return agent.CommandError(agent.FailInvalidParams, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return agent.CommandError(agent.FailInvalidParams, err)
	}
	return nil
}

// rotateParams are a bmc.rotate's params as delivered: the gateway opened
// the current password and the pending one by their references.
type rotateParams struct {
	Epoch      int64  `json:"epoch"`
	MachineID  string `json:"machine_id"`
	MAC        string `json:"mac"`
	PendingRef string `json:"pending_ref"`
	BMC        struct {
		Driver        string `json:"driver"`
		Address       string `json:"address"`
		Username      string `json:"username"`
		CredentialRef string `json:"credential_ref"`
		Password      string `json:"password"`
		NewPassword   string `json:"new_password"`
	} `json:"bmc"`
}

// rotate sets an enrolled machine's new BMC password, once per key, and
// proves it by logging in with it; the success it returns is what bcd
// signs with its node key, and the control plane makes the new password
// current only on that. When the BMC took the password but it does not
// log in, the old one is set back if it still logs in.
func (a *Agent) rotate(ctx context.Context, c *agentv1.Command) (*structpb.Struct, error) {
	var p rotateParams
	if err := decode(c.GetParams(), &p); err != nil {
		return nil, err
	}
	if p.PendingRef == "" {
		return nil, agent.CommandError(agent.FailInvalidParams, errors.New("pending_ref is required"))
	}
	key := c.GetIdempotencyKey()
	if key == "" {
		key = c.GetId()
	}
	pp := powerParams{MachineID: p.MachineID, MAC: p.MAC}
	pp.BMC.Driver, pp.BMC.Address = p.BMC.Driver, p.BMC.Address
	a.mu.Lock()
	if err := a.checkEpochLocked(p.Epoch); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	if _, ok := a.enrolledLocked(pp); !ok {
		a.mu.Unlock()
		a.log.Warn("bmc.rotate refused: not an enrolled machine of this site", "machine", p.MachineID, "bmc", p.BMC.Address)
		return nil, agent.CommandError(FailNotEnrolled, fmt.Errorf("machine %s (BMC %s) is not an enrolled machine of this site", p.MachineID, p.BMC.Address))
	}
	if err := a.checkDriver(p.BMC.Driver); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	if rec := a.keyLocked(key); rec != nil {
		a.mu.Unlock()
		switch {
		case !rec.Done:
			return nil, agent.CommandError(FailKeyInterrupts, fmt.Errorf("key %s was out to the BMC when bcd stopped; which password the BMC holds is unknown", key))
		case rec.Error != "":
			return nil, agent.CommandError(FailBMC, errors.New(rec.Error))
		}
		return structpb.NewStruct(rec.Result)
	}
	if p.BMC.Password == "" || p.BMC.NewPassword == "" {
		a.mu.Unlock()
		return nil, agent.CommandError(FailNoCredential, errors.New("the command carries no current and new BMC credential (it was fenced at delivery)"))
	}
	a.st.Keys = append(a.st.Keys, keyRecord{Key: key})
	if len(a.st.Keys) > maxKeys {
		a.st.Keys = append([]keyRecord(nil), a.st.Keys[len(a.st.Keys)-maxKeys:]...)
	}
	if err := a.saveLocked(); err != nil {
		a.st.Keys = a.st.Keys[:len(a.st.Keys)-1]
		a.mu.Unlock()
		return nil, agent.CommandError(agent.FailPersist, err)
	}
	a.mu.Unlock()

	res, err := a.rotateBMC(ctx, p)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if rec := a.keyLocked(key); rec != nil {
		rec.Done, rec.Result = true, res
		if err != nil {
			rec.Error = err.Error()
		}
		if serr := a.saveLocked(); serr != nil {
			a.log.Error("persist the site's idempotency record", "err", serr)
		}
	}
	if err != nil {
		return nil, agent.CommandError(FailBMC, err)
	}
	return structpb.NewStruct(res)
}

// rotateBMC is the BMC side of a rotation: set the new password with the
// old one, then log in with the new one.
func (a *Agent) rotateBMC(ctx context.Context, p rotateParams) (map[string]any, error) {
	login := func(pw string) error {
		d, err := a.newDriver(p.BMC.Driver, p.BMC.Address, bmc.NewCredentials(p.BMC.Username, pw))
		if err != nil {
			return err
		}
		defer func() { _ = d.Close(context.WithoutCancel(ctx)) }()
		_, err = d.PowerStatus(ctx)
		return err
	}
	set := func(with, to string) error {
		d, err := a.newDriver(p.BMC.Driver, p.BMC.Address, bmc.NewCredentials(p.BMC.Username, with))
		if err != nil {
			return err
		}
		defer func() { _ = d.Close(context.WithoutCancel(ctx)) }()
		s, ok := d.(bmc.PasswordSetter)
		if !ok {
			return fmt.Errorf("the %s driver does not set passwords", p.BMC.Driver)
		}
		return s.SetPassword(ctx, to)
	}
	if err := set(p.BMC.Password, p.BMC.NewPassword); err != nil {
		return nil, fmt.Errorf("setting the new password failed; the old one stays: %w", err)
	}
	if lerr := login(p.BMC.NewPassword); lerr != nil {
		// The BMC said it took the password, yet it does not log in.
		if oerr := login(p.BMC.Password); oerr != nil {
			a.log.Error("bmc.rotate: the BMC took the new password but neither it nor the old one logs in", "machine", p.MachineID, "bmc", p.BMC.Address)
			return nil, fmt.Errorf("the BMC accepted the new password but it does not log in (%v), and the old one no longer does either (%v): "+
				"the BMC may hold the new password or a mangled one; reset the BMC user's password at the BMC", lerr, oerr)
		}
		if rerr := set(p.BMC.Password, p.BMC.Password); rerr != nil {
			return nil, fmt.Errorf("the BMC accepted the new password but it does not log in (%v); the old one still logs in, "+
				"but setting it back failed (%v)", lerr, rerr)
		}
		return nil, fmt.Errorf("the BMC accepted the new password but it does not log in (%w); the old one still logs in and was set back", lerr)
	}
	a.log.Info("bmc password rotated", "machine", p.MachineID, "credential_ref", p.PendingRef)
	return map[string]any{"login_verified": true, "pending_ref": p.PendingRef, "machine_id": p.MachineID}, nil
}
