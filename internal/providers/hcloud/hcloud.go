// Package hcloud is the "hetzner-cloud" provider: it creates, finds,
// powers, rebuilds and deletes Hetzner Cloud servers for a provider pool's
// instances through the official Go client (hcloud-go).
//
// A server carries its instance's id as the label providers.InstanceLabel
// and the control plane's id as providers.ManagedLabel; Create looks the
// instance up by those labels before it orders anything, so a retry after
// a lost answer finds the server the first call made. The bcd join token
// travels only inside the server's user data (cloud-init).
//
// It must never log, or put in an error, the API token or a server's user
// data, and never let the client retry a request on its own: a retried
// create could order a second server, and a rate limit belongs to the
// caller, who backs off.
package hcloud

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	hc "github.com/hetznercloud/hcloud-go/v2/hcloud"

	"github.com/better-compute/better-compute/internal/providers"
)

// Type is the provider type's registry name.
const Type = "hetzner-cloud"

// Manifest is what a hetzner-cloud account needs.
var Manifest = providers.Manifest{
	Type:        Type,
	Description: "Hetzner Cloud servers, ordered and deleted per instance through the Hetzner Cloud API",
	Fields: []providers.Field{
		{Name: "token", Description: "API token of the Hetzner Cloud project (read & write)", Required: true, Secret: true},
		{Name: "location", Description: "location used when a create names none (fsn1, nbg1, hel1, ash, hil, sin)"},
		{Name: "network", Description: "private network (id or name) every server is attached to"},
	},
}

func init() {
	providers.Register(providers.Factory{Manifest: Manifest, New: New})
}

// Action polling: Hetzner allows 3600 requests an hour, so the wait backs
// off from half a second to five.
var pollBackoff = hc.ExponentialBackoffWithOpts(hc.ExponentialBackoffOpts{
	Base:       500 * time.Millisecond,
	Multiplier: 2,
	Cap:        5 * time.Second,
})

// Provider is one Hetzner Cloud project.
type Provider struct {
	client   *hc.Client
	token    string
	cpID     string
	location string
	network  string
	log      *slog.Logger
}

var _ providers.Provider = (*Provider)(nil)

// New builds the provider of one account.
func New(cfg providers.Config) (providers.Provider, error) {
	token := cfg.Credentials["token"]
	if token == "" {
		return nil, providers.Errorf(Type, providers.KindInvalid, "credential token is required")
	}
	if cfg.ControlPlaneID == "" {
		return nil, providers.Errorf(Type, providers.KindInvalid, "a control plane id is required (the %s label)", providers.ManagedLabel)
	}
	if !validLabelValue(cfg.ControlPlaneID) {
		return nil, providers.Errorf(Type, providers.KindInvalid, "control plane id %q is no valid Hetzner label value", cfg.ControlPlaneID)
	}
	opts := []hc.ClientOption{
		hc.WithToken(token),
		hc.WithApplication("better-compute", ""),
		// No retries inside the client: a create it sent twice could make
		// two servers, and a 429 must reach the caller as a rate limit.
		hc.WithRetryOpts(hc.RetryOpts{BackoffFunc: hc.ConstantBackoff(0), MaxRetries: 0}),
		hc.WithPollOpts(hc.PollOpts{BackoffFunc: pollBackoff}),
	}
	if cfg.Endpoint != "" {
		opts = append(opts, hc.WithEndpoint(cfg.Endpoint))
	}
	if cfg.HTTPClient != nil {
		opts = append(opts, hc.WithHTTPClient(cfg.HTTPClient))
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Provider{
		client:   hc.NewClient(opts...),
		token:    token,
		cpID:     cfg.ControlPlaneID,
		location: cfg.Settings["location"],
		network:  cfg.Settings["network"],
		log:      log.With("provider", Type),
	}, nil
}

// Type implements providers.Provider.
func (p *Provider) Type() string { return Type }

// selector finds an instance's server among this control plane's.
func (p *Provider) selector(instanceID string) string {
	return providers.InstanceLabel + "=" + instanceID + "," + providers.ManagedLabel + "=" + p.cpID
}

// find returns the instance's server, or nil when there is none.
func (p *Provider) find(ctx context.Context, instanceID string) (*hc.Server, error) {
	servers, err := p.client.Server.AllWithOpts(ctx, hc.ServerListOpts{ListOpts: hc.ListOpts{LabelSelector: p.selector(instanceID), PerPage: 50}})
	if err != nil {
		return nil, err
	}
	if len(servers) == 0 {
		return nil, nil
	}
	// Two servers of one instance should not exist; the oldest is the one
	// the first create made.
	slices.SortFunc(servers, func(a, b *hc.Server) int { return cmp.Compare(a.ID, b.ID) })
	if len(servers) > 1 {
		p.log.Warn("several servers carry one instance's label; using the oldest", "instance", instanceID, "servers", len(servers), "server", servers[0].ID)
	}
	return servers[0], nil
}

// Offers implements providers.Provider: every server type at every
// location it has a price for.
func (p *Provider) Offers(ctx context.Context) ([]providers.Offer, error) {
	types, err := p.client.ServerType.All(ctx)
	if err != nil {
		return nil, p.wrap("list server types", err)
	}
	pricing, _, err := p.client.Pricing.Get(ctx)
	if err != nil {
		return nil, p.wrap("get pricing", err)
	}
	var offers []providers.Offer
	for _, st := range types {
		for _, pr := range st.Pricings {
			if pr.Location == nil {
				continue
			}
			offers = append(offers, providers.Offer{
				ServerType:   st.Name,
				Location:     pr.Location.Name,
				VCPU:         st.Cores,
				MemoryGiB:    float64(st.Memory),
				DiskGiB:      st.Disk,
				PriceHourly:  pr.Hourly.Net,
				PriceMonthly: pr.Monthly.Net,
				Currency:     pricing.Currency,
				Available:    available(st, pr.Location.Name),
			})
		}
	}
	return offers, nil
}

// available: the type is orderable at the location (listed there and not
// past a deprecation's end).
func available(st *hc.ServerType, location string) bool {
	for _, l := range st.Locations {
		if l.Location != nil && l.Location.Name == location {
			return !l.IsDeprecated() || time.Now().Before(l.UnavailableAfter())
		}
	}
	return false
}

// Create implements providers.Provider.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (providers.Server, error) {
	if err := p.validate(req); err != nil {
		return providers.Server{}, err
	}
	redact := []string{req.UserData}
	existing, err := p.find(ctx, req.InstanceID)
	if err != nil {
		return providers.Server{}, p.wrap("look up instance "+req.InstanceID, err, redact...)
	}
	if existing != nil {
		return p.server(existing), nil
	}

	opts, err := p.createOpts(ctx, req)
	if err != nil {
		return providers.Server{}, err
	}
	p.log.Debug("creating server", "instance", req.InstanceID, "name", req.Name, "server_type", req.ServerType, "location", cmp.Or(req.Location, p.location), "image", req.Image)
	res, _, err := p.client.Server.Create(ctx, opts)
	if err != nil {
		werr := p.wrap("create server for instance "+req.InstanceID, err, redact...)
		// A create whose answer was lost (or failed upstream), or that
		// raced another for the name, may have made the server: look once
		// more by label.
		if ctx.Err() == nil && (providers.KindOf(werr) == providers.KindUnavailable || hc.IsError(err, hc.ErrorCodeUniquenessError)) {
			if s, ferr := p.find(ctx, req.InstanceID); ferr == nil && s != nil {
				p.log.Info("create failed, but the instance's server exists", "instance", req.InstanceID, "server", s.ID)
				return p.server(s), nil
			}
		}
		return providers.Server{}, werr
	}
	p.log.Info("created server", "instance", req.InstanceID, "server", res.Server.ID)
	return p.server(res.Server), nil
}

func (p *Provider) validate(req providers.CreateRequest) error {
	switch {
	case req.InstanceID == "" || !validLabelValue(req.InstanceID):
		return providers.Errorf(Type, providers.KindInvalid, "instance id %q is no valid Hetzner label value", req.InstanceID)
	case req.Name == "":
		return providers.Errorf(Type, providers.KindInvalid, "a server name is required")
	case req.ServerType == "":
		return providers.Errorf(Type, providers.KindInvalid, "a server type is required")
	case req.Image == "":
		return providers.Errorf(Type, providers.KindInvalid, "an image is required")
	}
	for k, v := range req.Labels {
		if k == providers.InstanceLabel || k == providers.ManagedLabel {
			return providers.Errorf(Type, providers.KindInvalid, "label %s is the provider's own", k)
		}
		if !validLabelValue(v) {
			return providers.Errorf(Type, providers.KindInvalid, "label %s: value %q is no valid Hetzner label value", k, v)
		}
	}
	return nil
}

// createOpts resolves the request's names (SSH keys, network) to what
// the API takes.
func (p *Provider) createOpts(ctx context.Context, req providers.CreateRequest) (hc.ServerCreateOpts, error) {
	labels := make(map[string]string, len(req.Labels)+2)
	for k, v := range req.Labels {
		labels[k] = v
	}
	labels[providers.InstanceLabel] = req.InstanceID
	labels[providers.ManagedLabel] = p.cpID
	start := true
	opts := hc.ServerCreateOpts{
		Name:             req.Name,
		ServerType:       &hc.ServerType{Name: req.ServerType},
		Image:            &hc.Image{Name: req.Image},
		UserData:         req.UserData,
		StartAfterCreate: &start,
		Labels:           labels,
	}
	if id, err := strconv.ParseInt(req.Image, 10, 64); err == nil {
		opts.Image = &hc.Image{ID: id}
	}
	if loc := cmp.Or(req.Location, p.location); loc != "" {
		opts.Location = &hc.Location{Name: loc}
	}
	for _, name := range req.SSHKeys {
		key, _, err := p.client.SSHKey.Get(ctx, name)
		if err != nil {
			return opts, p.wrap("look up SSH key "+name, err, req.UserData)
		}
		if key == nil {
			return opts, providers.Errorf(Type, providers.KindInvalid, "SSH key %q does not exist in the project", name)
		}
		opts.SSHKeys = append(opts.SSHKeys, key)
	}
	if p.network != "" {
		n, _, err := p.client.Network.Get(ctx, p.network)
		if err != nil {
			return opts, p.wrap("look up network "+p.network, err, req.UserData)
		}
		if n == nil {
			return opts, providers.Errorf(Type, providers.KindInvalid, "network %q does not exist in the project", p.network)
		}
		opts.Networks = []*hc.Network{n}
	}
	return opts, nil
}

// Get implements providers.Provider.
func (p *Provider) Get(ctx context.Context, instanceID string) (providers.Server, error) {
	s, err := p.mustFind(ctx, instanceID)
	if err != nil {
		return providers.Server{}, err
	}
	return p.server(s), nil
}

// mustFind is find with a missing server as KindNotFound.
func (p *Provider) mustFind(ctx context.Context, instanceID string) (*hc.Server, error) {
	s, err := p.find(ctx, instanceID)
	if err != nil {
		return nil, p.wrap("look up instance "+instanceID, err)
	}
	if s == nil {
		return nil, providers.Errorf(Type, providers.KindNotFound, "instance %s has no server", instanceID)
	}
	return s, nil
}

// List implements providers.Provider.
func (p *Provider) List(ctx context.Context) ([]providers.Server, error) {
	servers, err := p.client.Server.AllWithOpts(ctx, hc.ServerListOpts{ListOpts: hc.ListOpts{LabelSelector: providers.ManagedLabel + "=" + p.cpID, PerPage: 50}})
	if err != nil {
		return nil, p.wrap("list servers", err)
	}
	out := make([]providers.Server, 0, len(servers))
	for _, s := range servers {
		out = append(out, p.server(s))
	}
	return out, nil
}

// Delete implements providers.Provider.
func (p *Provider) Delete(ctx context.Context, instanceID string) error {
	s, err := p.find(ctx, instanceID)
	if err != nil {
		return p.wrap("look up instance "+instanceID, err)
	}
	if s == nil {
		return nil
	}
	res, _, err := p.client.Server.DeleteWithResult(ctx, s)
	if hc.IsError(err, hc.ErrorCodeNotFound) {
		return nil // gone between the look-up and the delete
	}
	if err != nil {
		return p.wrap(fmt.Sprintf("delete server %d of instance %s", s.ID, instanceID), err)
	}
	p.log.Info("deleting server", "instance", instanceID, "server", s.ID)
	return p.wait(ctx, "delete server of instance "+instanceID, res.Action)
}

// Power implements providers.Provider. Off is a hard power-off, so the
// server is stopped when Power returns; reboot is the ACPI one.
func (p *Provider) Power(ctx context.Context, instanceID string, action providers.PowerAction) error {
	s, err := p.mustFind(ctx, instanceID)
	if err != nil {
		return err
	}
	var a *hc.Action
	switch action {
	case providers.PowerOn:
		a, _, err = p.client.Server.Poweron(ctx, s)
	case providers.PowerOff:
		a, _, err = p.client.Server.Poweroff(ctx, s)
	case providers.PowerReboot:
		a, _, err = p.client.Server.Reboot(ctx, s)
	default:
		return providers.Errorf(Type, providers.KindInvalid, "unknown power action %q", action)
	}
	op := fmt.Sprintf("power %s server %d of instance %s", action, s.ID, instanceID)
	if err != nil {
		return p.wrap(op, err)
	}
	return p.wait(ctx, op, a)
}

// Rebuild implements providers.Provider.
func (p *Provider) Rebuild(ctx context.Context, instanceID, image string) error {
	s, err := p.mustFind(ctx, instanceID)
	if err != nil {
		return err
	}
	img := &hc.Image{Name: image}
	if id, err := strconv.ParseInt(image, 10, 64); err == nil {
		img = &hc.Image{ID: id}
	}
	op := fmt.Sprintf("rebuild server %d of instance %s", s.ID, instanceID)
	res, _, err := p.client.Server.RebuildWithResult(ctx, s, hc.ServerRebuildOpts{Image: img})
	if err != nil {
		return p.wrap(op, err)
	}
	return p.wait(ctx, op, res.Action)
}

// wait waits for an action to finish.
func (p *Provider) wait(ctx context.Context, op string, a *hc.Action) error {
	if a == nil {
		return nil
	}
	if err := p.client.Action.WaitFor(ctx, a); err != nil {
		return p.wrap(op, err)
	}
	return nil
}

// server is the control plane's view of a Hetzner server.
func (p *Provider) server(s *hc.Server) providers.Server {
	out := providers.Server{
		ID:         strconv.FormatInt(s.ID, 10),
		InstanceID: s.Labels[providers.InstanceLabel],
		Name:       s.Name,
		Status:     status(s.Status),
		Labels:     s.Labels,
		Created:    s.Created,
	}
	if ip := s.PublicNet.IPv4.IP; ip != nil && !ip.IsUnspecified() {
		out.IPv4 = ip.String()
	}
	if n := s.PublicNet.IPv6.Network; n != nil {
		// Hetzner routes a /64 to the server; the server itself is ::1.
		ip := slices.Clone(n.IP.To16())
		ip[len(ip)-1] |= 1
		out.IPv6 = ip.String()
	}
	if s.ServerType != nil {
		out.ServerType = s.ServerType.Name
	}
	if s.Location != nil {
		out.Location = s.Location.Name
	}
	return out
}

func status(s hc.ServerStatus) providers.ServerStatus {
	switch s {
	case hc.ServerStatusInitializing, hc.ServerStatusStarting:
		return providers.StatusStarting
	case hc.ServerStatusRunning:
		return providers.StatusRunning
	case hc.ServerStatusOff, hc.ServerStatusStopping:
		return providers.StatusStopped
	case hc.ServerStatusDeleting:
		return providers.StatusDeleting
	}
	return providers.StatusUnknown
}
