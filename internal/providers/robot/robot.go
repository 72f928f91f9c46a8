// Package robot is the hetzner-robot provider: it runs Hetzner's dedicated
// servers (the Robot webservice) as a provider pool. Robot cannot order a
// server on demand, so Create claims one the account already rents and
// has not named, writes the claim into the server's name (names.go), boots
// its rescue system and installs the image with installimage over SSH
// (install.go); Delete releases it again.
//
// It must never put a credential (the webservice password, a rescue
// password) or the instance's user data, which carries the bcd join
// token, in a log line, an error, a command line, a URL or a form field:
// the user data reaches the server only as the stdin of an SSH command.
package robot

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/internal/providers"
)

// Type is the registry name.
const Type = "hetzner-robot"

// DefaultEndpoint is Robot's webservice.
const DefaultEndpoint = "https://robot-ws.your-server.de"

func init() {
	providers.Register(providers.Factory{Manifest: Manifest, New: New})
}

// Manifest is what a hetzner-robot account needs.
var Manifest = providers.Manifest{
	Type:        Type,
	Description: "Hetzner dedicated servers (Robot webservice): claims unnamed servers of the account and installs them from the rescue system",
	Fields: []providers.Field{
		{Name: "password", Description: "the webservice user's password", Required: true, Secret: true},
		{Name: "user", Description: "the webservice user (Robot: Settings → Web service and app settings)", Required: true},
		{Name: "image", Description: "installimage image for creates that name none (e.g. Ubuntu-2404-noble-amd64-base); a name under the rescue system's image directory, or a path or URL"},
		{Name: "rescue_ssh_address", Description: `where to reach a rescue system's SSH: "{ip}:22" by default ({ip} is the server's address); set it for a bastion's forward or an emulator`},
	},
}

// Provider is one Robot account.
type Provider struct {
	endpoint   string
	user       string
	password   string
	image      string
	sshAddress string
	names      names
	controlID  string
	http       *http.Client
	log        *slog.Logger
	// claimMu serializes claims made through this provider, so two
	// creates of one control plane never pick the same free server;
	// another control plane's claims are caught by reading the name back.
	claimMu sync.Mutex
}

// New builds a provider for one account.
func New(cfg providers.Config) (providers.Provider, error) {
	p := &Provider{
		endpoint:   strings.TrimRight(cmp.Or(cfg.Endpoint, DefaultEndpoint), "/"),
		user:       cfg.Settings["user"],
		password:   cfg.Credentials["password"],
		image:      cfg.Settings["image"],
		sshAddress: cmp.Or(cfg.Settings["rescue_ssh_address"], "{ip}:22"),
		names:      names{tag: controlPlaneTag(cfg.ControlPlaneID)},
		controlID:  cfg.ControlPlaneID,
		http:       cfg.HTTPClient,
		log:        cfg.Logger,
	}
	switch {
	case p.user == "":
		return nil, providers.Errorf(Type, providers.KindInvalid, "the setting user is required")
	case p.password == "":
		return nil, providers.Errorf(Type, providers.KindInvalid, "the credential password is required")
	case cfg.ControlPlaneID == "":
		return nil, providers.Errorf(Type, providers.KindInvalid, "a control plane id is required (it marks the servers this control plane claims)")
	case p.image != "" && !imageRE.MatchString(p.image):
		return nil, providers.Errorf(Type, providers.KindInvalid, "the setting image is no installimage image name, path or URL")
	}
	if p.http == nil {
		p.http = &http.Client{Timeout: time.Minute}
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.log = p.log.With("provider", Type)
	return p, nil
}

// Type is the registry name.
func (p *Provider) Type() string { return Type }

// robotServer is Robot's server object.
type robotServer struct {
	IP        string `json:"server_ip"`
	IPv6Net   string `json:"server_ipv6_net"`
	Number    int    `json:"server_number"`
	Name      string `json:"server_name"`
	Product   string `json:"product"`
	DC        string `json:"dc"`
	Status    string `json:"status"`
	Cancelled bool   `json:"cancelled"`
}

type serverEnvelope struct {
	Server robotServer `json:"server"`
}

// resetInfo is Robot's reset object: the reset types a server takes and,
// where it has a power button (the power types), whether it runs.
type resetInfo struct {
	Number          int      `json:"server_number"`
	Types           []string `json:"type"`
	OperatingStatus string   `json:"operating_status"`
}

type resetEnvelope struct {
	Reset resetInfo `json:"reset"`
}

// listServers lists every server of the account. Robot answers an account
// without servers with 404 SERVER_NOT_FOUND: that is an empty list.
func (p *Provider) listServers(ctx context.Context) ([]robotServer, error) {
	var env []serverEnvelope
	if err := p.call(ctx, http.MethodGet, "/server", nil, &env); err != nil {
		if isKind(err, providers.KindNotFound) {
			return nil, nil
		}
		return nil, err
	}
	out := make([]robotServer, 0, len(env))
	for _, e := range env {
		out = append(out, e.Server)
	}
	return out, nil
}

func (p *Provider) getServer(ctx context.Context, number int) (robotServer, error) {
	var env serverEnvelope
	err := p.call(ctx, http.MethodGet, "/server/"+strconv.Itoa(number), nil, &env)
	return env.Server, err
}

func (p *Provider) resetInfo(ctx context.Context, number int) (resetInfo, error) {
	var env resetEnvelope
	err := p.call(ctx, http.MethodGet, "/reset/"+strconv.Itoa(number), nil, &env)
	return env.Reset, err
}

// find is the server claimed for instanceID (installed or not).
func (p *Provider) find(ctx context.Context, instanceID string) (robotServer, bool, error) {
	all, err := p.listServers(ctx)
	if err != nil {
		return robotServer{}, false, err
	}
	for _, s := range all {
		if id, _, ok := p.names.parse(s.Name); ok && id == instanceID {
			return s, true, nil
		}
	}
	return robotServer{}, false, nil
}

func (p *Provider) notFound(instanceID string) error {
	return providers.Errorf(Type, providers.KindNotFound, "no server is claimed for instance %s", instanceID)
}

// toServer is s as the control plane sees it; power is its reset object
// (zero where unknown).
func (p *Provider) toServer(s robotServer, power resetInfo) providers.Server {
	id, installed, _ := p.names.parse(s.Name)
	status := providers.StatusRunning
	switch {
	case !installed, s.Status != "ready":
		status = providers.StatusStarting
	case power.OperatingStatus == "shut off":
		status = providers.StatusStopped
	}
	loc, _, _ := strings.Cut(s.DC, "-")
	return providers.Server{
		ID:         strconv.Itoa(s.Number),
		InstanceID: id,
		Name:       s.Name,
		Status:     status,
		IPv4:       s.IP,
		IPv6:       s.IPv6Net,
		ServerType: s.Product,
		Location:   loc,
		Labels:     map[string]string{providers.InstanceLabel: id, providers.ManagedLabel: p.controlID},
	}
}

// Get finds the server claimed for instanceID.
func (p *Provider) Get(ctx context.Context, instanceID string) (providers.Server, error) {
	s, ok, err := p.find(ctx, instanceID)
	if err != nil {
		return providers.Server{}, err
	}
	if !ok {
		return providers.Server{}, p.notFound(instanceID)
	}
	power, err := p.resetInfo(ctx, s.Number)
	if err != nil && !isKind(err, providers.KindNotFound) {
		// A server without reset options has no power state to report.
		return providers.Server{}, err
	}
	return p.toServer(s, power), nil
}

// List lists every server this control plane claimed. Robot does not
// page: one answer holds them all.
func (p *Provider) List(ctx context.Context) ([]providers.Server, error) {
	all, err := p.listServers(ctx)
	if err != nil {
		return nil, err
	}
	var mine []robotServer
	for _, s := range all {
		if _, _, ok := p.names.parse(s.Name); ok {
			mine = append(mine, s)
		}
	}
	if len(mine) == 0 {
		return nil, nil
	}
	var resets []resetEnvelope
	if err := p.call(ctx, http.MethodGet, "/reset", nil, &resets); err != nil && !isKind(err, providers.KindNotFound) {
		return nil, err
	}
	power := map[int]resetInfo{}
	for _, r := range resets {
		power[r.Reset.Number] = r.Reset
	}
	out := make([]providers.Server, 0, len(mine))
	for _, s := range mine {
		out = append(out, p.toServer(s, power[s.Number]))
	}
	return out, nil
}

// Create claims a server for the instance and installs it; a server
// already claimed for it is returned as it is once installed, and an
// install an earlier call left unfinished is run again from the start.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (providers.Server, error) {
	if !p.names.validInstanceID(req.InstanceID) {
		return providers.Server{}, providers.Errorf(Type, providers.KindInvalid,
			"instance id %q does not fit a Robot server name (letters, digits, _ . -, at most %d in all)", req.InstanceID, maxNameLen)
	}
	image := cmp.Or(req.Image, p.image)
	if image == "" || !imageRE.MatchString(image) {
		return providers.Server{}, providers.Errorf(Type, providers.KindInvalid, "image %q is no installimage image name, path or URL", image)
	}
	keys, err := p.parseKeys(req.SSHKeys)
	if err != nil {
		return providers.Server{}, err
	}
	s, found, err := p.find(ctx, req.InstanceID)
	if err != nil {
		return providers.Server{}, err
	}
	if found {
		if _, installed, _ := p.names.parse(s.Name); installed {
			return p.Get(ctx, req.InstanceID)
		}
		p.log.InfoContext(ctx, "resuming an unfinished install", "server", s.Number, "instance", req.InstanceID)
	} else if s, err = p.claim(ctx, req); err != nil {
		return providers.Server{}, err
	}
	inst := install{
		server:     s,
		instanceID: req.InstanceID,
		image:      image,
		hostname:   hostname(req.Name, req.InstanceID),
		keys:       keys,
		userData:   req.UserData,
		owner:      p.names.provisional(req.InstanceID),
	}
	if err := p.install(ctx, inst); err != nil {
		return providers.Server{}, err
	}
	// The final name is the mark of a finished install: written last, so
	// a create that dies before it is resumed by the next.
	if err := p.setName(ctx, s.Number, p.names.final(req.InstanceID)); err != nil {
		return providers.Server{}, err
	}
	p.log.InfoContext(ctx, "server installed", "server", s.Number, "instance", req.InstanceID, "image", image)
	return p.Get(ctx, req.InstanceID)
}

func (p *Provider) setName(ctx context.Context, number int, name string) error {
	return p.call(ctx, http.MethodPost, "/server/"+strconv.Itoa(number), url.Values{"server_name": {name}}, nil)
}

// claim names a free server (unnamed, ready, not cancelled, of the
// request's product and location) for the instance. Robot has no
// compare-and-set: the name is read back, and a server another claimer
// named in between is left to it for the next free one.
func (p *Provider) claim(ctx context.Context, req providers.CreateRequest) (robotServer, error) {
	p.claimMu.Lock()
	defer p.claimMu.Unlock()
	all, err := p.listServers(ctx)
	if err != nil {
		return robotServer{}, err
	}
	// A create that raced this one through another provider of this
	// control plane may have claimed for the instance meanwhile.
	for _, s := range all {
		if id, _, ok := p.names.parse(s.Name); ok && id == req.InstanceID {
			return s, nil
		}
	}
	free := slices.DeleteFunc(all, func(s robotServer) bool {
		return s.Name != "" || s.Status != "ready" || s.Cancelled ||
			(req.ServerType != "" && !strings.EqualFold(s.Product, req.ServerType)) ||
			(req.Location != "" && !strings.EqualFold(strings.SplitN(s.DC, "-", 2)[0], req.Location))
	})
	slices.SortFunc(free, func(a, b robotServer) int { return a.Number - b.Number })
	name := p.names.provisional(req.InstanceID)
	for _, s := range free {
		if err := p.setName(ctx, s.Number, name); err != nil {
			return robotServer{}, err
		}
		got, err := p.getServer(ctx, s.Number)
		if err != nil {
			return robotServer{}, err
		}
		if got.Name == name {
			p.log.InfoContext(ctx, "claimed a server", "server", s.Number, "instance", req.InstanceID, "product", s.Product, "dc", s.DC)
			return got, nil
		}
		p.log.WarnContext(ctx, "another claimer named the server first; trying the next", "server", s.Number)
	}
	return robotServer{}, providers.Errorf(Type, providers.KindQuota,
		"no free server (unnamed, ready, not cancelled) of product %q in location %q: rent more or release some", req.ServerType, req.Location)
}

// Delete releases the instance's server: its rescue deactivated, its power
// off (so the old system stops serving as a node), and its name cleared
// last, so that a release that fails midway is finished by the next. It
// does not wipe the disks: the next create's installimage writes over
// them.
func (p *Provider) Delete(ctx context.Context, instanceID string) error {
	s, ok, err := p.find(ctx, instanceID)
	if err != nil || !ok {
		return err
	}
	n := strconv.Itoa(s.Number)
	if err := p.call(ctx, http.MethodDelete, "/boot/"+n+"/rescue", nil, nil); err != nil && !isKind(err, providers.KindNotFound) {
		return err
	}
	if err := p.Power(ctx, instanceID, providers.PowerOff); err != nil && !isKind(err, providers.KindNotSupported) {
		return err
	}
	if err := p.setName(ctx, s.Number, ""); err != nil {
		return err
	}
	p.log.InfoContext(ctx, "released a server", "server", s.Number, "instance", instanceID)
	return nil
}

func (p *Provider) resetServer(ctx context.Context, number int, typ string) error {
	return p.call(ctx, http.MethodPost, "/reset/"+strconv.Itoa(number), url.Values{"type": {typ}}, nil)
}

// Power works the server's buttons. Robot's reset types: sw (CTRL+ALT+DEL),
// hw (the reset button: power cycled), man (a technician), power (a short
// press: a running system gets the ACPI signal to shut down, a server that
// is off starts) and power_long (a long press: off at once). Off is
// power_long, so the server is off when Power returns; on is power, only
// while the server is off (on a running one it would shut it down); reboot
// is hw (power to a server that is off).
func (p *Provider) Power(ctx context.Context, instanceID string, action providers.PowerAction) error {
	s, ok, err := p.find(ctx, instanceID)
	if err != nil {
		return err
	}
	if !ok {
		return p.notFound(instanceID)
	}
	info, err := p.resetInfo(ctx, s.Number)
	if err != nil {
		return err
	}
	off := info.OperatingStatus == "shut off"
	typ := ""
	switch action {
	case providers.PowerOff:
		if !off {
			typ = "power_long"
		}
	case providers.PowerOn:
		// A server without the power types cannot be turned off through
		// Robot either: it runs.
		if off {
			typ = "power"
		}
	case providers.PowerReboot:
		typ = "hw"
		if off {
			typ = "power"
		}
	default:
		return providers.Errorf(Type, providers.KindInvalid, "unknown power action %q", action)
	}
	if typ == "" {
		return nil
	}
	if !slices.Contains(info.Types, typ) {
		return providers.Errorf(Type, providers.KindNotSupported, "server %d takes no %s reset (it takes %s)", s.Number, typ, strings.Join(info.Types, ", "))
	}
	p.log.InfoContext(ctx, "power", "server", s.Number, "instance", instanceID, "action", action, "reset", typ)
	return p.resetServer(ctx, s.Number, typ)
}

// Rebuild installs image on the instance's server again, from its rescue
// system. The contract's Rebuild carries no user data, so the rebuilt
// system boots without a join seed.
func (p *Provider) Rebuild(ctx context.Context, instanceID, image string) error {
	image = cmp.Or(image, p.image)
	if image == "" || !imageRE.MatchString(image) {
		return providers.Errorf(Type, providers.KindInvalid, "image %q is no installimage image name, path or URL", image)
	}
	s, ok, err := p.find(ctx, instanceID)
	if err != nil {
		return err
	}
	if !ok {
		return p.notFound(instanceID)
	}
	err = p.install(ctx, install{
		server:     s,
		instanceID: instanceID,
		image:      image,
		hostname:   hostname("", instanceID),
		owner:      s.Name,
	})
	if err != nil {
		return err
	}
	p.log.InfoContext(ctx, "server rebuilt", "server", s.Number, "instance", instanceID, "image", image)
	return nil
}

// errorf is an internal failure with a redacted message.
func (p *Provider) errorf(kind providers.ErrorKind, secrets []string, format string, args ...any) *providers.Error {
	return &providers.Error{Provider: Type, Kind: kind, Message: p.redact(fmt.Sprintf(format, args...), secrets...)}
}
