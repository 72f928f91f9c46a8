// Package proxmox is the provider of type "proxmox": VMs cloned from a
// cloud-init template on a Proxmox VE cluster, through the VE API with an
// API token (go-proxmox).
//
// A VM carries its labels (the instance, the control plane) as one JSON
// line in its description, which the clone itself writes, so a clone whose
// answer was lost is found again. Its user data (the bcd join token) goes
// on a NoCloud ISO uploaded to an iso storage and attached as a CD-ROM; it
// never appears in the VM's config, its description or its tags, and the
// package must never log it or the token secret, or put them in an error.
package proxmox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/luthermonson/go-proxmox"

	"github.com/better-compute/better-compute/internal/providers"
)

// Type is the registry name.
const Type = "proxmox"

// The account's fields.
const (
	fieldTokenSecret = "token_secret"
	fieldTokenID     = "token_id"
	fieldAPIURL      = "api_url"
	fieldNode        = "node"
	fieldNodes       = "nodes"
	fieldTemplate    = "template"
	fieldStorage     = "storage"
	fieldBridge      = "bridge"
	fieldISOStorage  = "iso_storage"
	fieldCIDevice    = "cloudinit_device"
	fieldSizes       = "sizes"
	fieldCurrency    = "currency"
	fieldInsecureTLS = "insecure_tls"
)

// Manifest is what a proxmox account needs.
var Manifest = providers.Manifest{
	Type:        Type,
	Description: "Proxmox VE: VMs full-cloned from a cloud-init template, user data on a NoCloud ISO",
	Fields: []providers.Field{
		{Name: fieldTokenSecret, Description: "the API token's secret (UUID)", Required: true, Secret: true},
		{Name: fieldTokenID, Description: "the API token's id, user@realm!tokenid", Required: true},
		{Name: fieldAPIURL, Description: "the API's URL, https://host:8006 (/api2/json is added)", Required: true},
		{Name: fieldNode, Description: "the node VMs go on when a create names no location", Required: true},
		{Name: fieldNodes, Description: "comma-separated nodes VMs may go on (the offers' locations); default: node. A node other than the template's needs the template on shared storage"},
		{Name: fieldTemplate, Description: "the template VM (id or name) a create without an image clones"},
		{Name: fieldStorage, Description: "the storage of the clones' disks; default: the template's"},
		{Name: fieldBridge, Description: "the bridge of the clones' net0; default: the template's"},
		{Name: fieldISOStorage, Description: "the storage (iso content) that holds each VM's cloud-init ISO; default: local"},
		{Name: fieldCIDevice, Description: "the drive the cloud-init ISO is attached as, replacing the template's cloud-init drive; default: ide2"},
		{Name: fieldSizes, Description: "the VM sizes offered, comma-separated name:cores:memory_gib:price_hourly (\"small:2:4:0.02\")"},
		{Name: fieldCurrency, Description: "the currency of the sizes' prices; default: EUR"},
		{Name: fieldInsecureTLS, Description: "\"true\" to accept the API's self-signed certificate"},
	},
}

func init() {
	providers.Register(providers.Factory{Manifest: Manifest, New: New})
}

// size is one VM size of the catalog.
type size struct {
	name        string
	cores       int
	memoryGiB   int
	priceHourly string
}

// Provider is one Proxmox VE account.
type Provider struct {
	c       *proxmox.Client
	log     *slog.Logger
	cpID    string
	secret  string
	node    string
	nodes   []string
	tmpl    string
	storage string
	bridge  string
	isoSt   string
	ciDev   string
	sizes   []size
	curr    string
	// poll is how often a task's status is read.
	poll time.Duration
}

// New builds the provider of an account; it calls nothing.
func New(cfg providers.Config) (providers.Provider, error) {
	s := cfg.Settings
	secret := cfg.Credentials[fieldTokenSecret]
	for _, f := range []string{fieldTokenID, fieldAPIURL, fieldNode} {
		if s[f] == "" {
			return nil, providers.Errorf(Type, providers.KindInvalid, "setting %s is required", f)
		}
	}
	if secret == "" {
		return nil, providers.Errorf(Type, providers.KindInvalid, "credential %s is required", fieldTokenSecret)
	}
	if !strings.Contains(s[fieldTokenID], "!") || !strings.Contains(s[fieldTokenID], "@") {
		return nil, providers.Errorf(Type, providers.KindInvalid, "setting %s must be user@realm!tokenid", fieldTokenID)
	}
	sizes, err := parseSizes(s[fieldSizes])
	if err != nil {
		return nil, err
	}
	p := &Provider{
		log:     cmpLogger(cfg.Logger).With("provider", Type),
		cpID:    cfg.ControlPlaneID,
		secret:  secret,
		node:    s[fieldNode],
		nodes:   splitList(s[fieldNodes]),
		tmpl:    s[fieldTemplate],
		storage: s[fieldStorage],
		bridge:  s[fieldBridge],
		isoSt:   orDefault(s[fieldISOStorage], "local"),
		ciDev:   orDefault(s[fieldCIDevice], "ide2"),
		sizes:   sizes,
		curr:    orDefault(s[fieldCurrency], "EUR"),
		poll:    time.Second,
	}
	if len(p.nodes) == 0 {
		p.nodes = []string{p.node}
	}
	base := strings.TrimSuffix(orDefault(cfg.Endpoint, s[fieldAPIURL]), "/")
	if !strings.HasSuffix(base, "/api2/json") {
		base += "/api2/json"
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if hc.Timeout == 0 {
		// The ISO upload takes no context; the timeout bounds it.
		hc = &http.Client{Transport: hc.Transport, CheckRedirect: hc.CheckRedirect, Jar: hc.Jar, Timeout: 2 * time.Minute}
	}
	opts := []proxmox.Option{
		proxmox.WithHTTPClient(hc),
		proxmox.WithAPIToken(s[fieldTokenID], secret),
		proxmox.WithUserAgent("better-compute"),
		// go-proxmox logs request bodies at debug level: the upload and the
		// token must not reach a log, so only its warnings pass, redacted.
		proxmox.WithLogger(libLogger{p: p}),
	}
	if s[fieldInsecureTLS] == "true" {
		opts = append(opts, proxmox.WithInsecureSkipVerify())
	}
	p.c = proxmox.NewClient(base, opts...)
	return p, nil
}

func cmpLogger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// Type is "proxmox".
func (p *Provider) Type() string { return Type }

func parseSizes(v string) ([]size, error) {
	var out []size
	for _, item := range splitList(v) {
		f := strings.Split(item, ":")
		if len(f) != 4 {
			return nil, providers.Errorf(Type, providers.KindInvalid, "size %q: want name:cores:memory_gib:price_hourly", item)
		}
		cores, err1 := strconv.Atoi(f[1])
		mem, err2 := strconv.Atoi(f[2])
		_, err3 := strconv.ParseFloat(f[3], 64)
		if err1 != nil || err2 != nil || err3 != nil || cores < 1 || mem < 1 || f[0] == "" {
			return nil, providers.Errorf(Type, providers.KindInvalid, "size %q: cores and memory are positive integers, the price a decimal", item)
		}
		out = append(out, size{name: f[0], cores: cores, memoryGiB: mem, priceHourly: f[3]})
	}
	return out, nil
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// Offers is every size on every node VMs may go on; a node is available
// when it is online and has the size's cores and memory at all.
func (p *Provider) Offers(ctx context.Context) ([]providers.Offer, error) {
	nodes, err := p.c.Nodes(ctx)
	if err != nil {
		return nil, p.wrap("list nodes", err)
	}
	byName := map[string]*proxmox.NodeStatus{}
	for _, n := range nodes {
		byName[n.Node] = n
	}
	var out []providers.Offer
	for _, name := range p.nodes {
		n, known := byName[name]
		for _, sz := range p.sizes {
			price, _ := strconv.ParseFloat(sz.priceHourly, 64)
			out = append(out, providers.Offer{
				ServerType:   sz.name,
				Location:     name,
				VCPU:         sz.cores,
				MemoryGiB:    float64(sz.memoryGiB),
				PriceHourly:  sz.priceHourly,
				PriceMonthly: strconv.FormatFloat(price*730, 'f', 4, 64),
				Currency:     p.curr,
				Available: known && n.Status == "online" && n.MaxCPU >= sz.cores &&
					n.MaxMem >= uint64(sz.memoryGiB)<<30,
			})
		}
	}
	return out, nil
}

func (p *Provider) sizeOf(name string) (*size, error) {
	if name == "" {
		return nil, nil
	}
	for i := range p.sizes {
		if p.sizes[i].name == name {
			return &p.sizes[i], nil
		}
	}
	return nil, providers.Errorf(Type, providers.KindInvalid, "server type %q is not a size of this account (setting %s)", name, fieldSizes)
}

// Get finds the VM of an instance.
func (p *Provider) Get(ctx context.Context, instanceID string) (providers.Server, error) {
	v, err := p.find(ctx, instanceID)
	if err != nil {
		return providers.Server{}, err
	}
	if v == nil {
		return providers.Server{}, p.notFound(instanceID)
	}
	return v.server(), nil
}

func (p *Provider) notFound(instanceID string) error {
	return providers.Errorf(Type, providers.KindNotFound, "no VM of instance %s", instanceID)
}

// List is every VM this control plane manages, on every node.
func (p *Provider) List(ctx context.Context) ([]providers.Server, error) {
	vms, err := p.managed(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]providers.Server, 0, len(vms))
	for _, v := range vms {
		out = append(out, v.server())
	}
	return out, nil
}

// Power turns the instance's VM on or off (at once, as a power cut), or
// reboots it (ACPI); rebooting a stopped VM starts it.
func (p *Provider) Power(ctx context.Context, instanceID string, action providers.PowerAction) error {
	v, err := p.find(ctx, instanceID)
	if err != nil {
		return err
	}
	if v == nil {
		return p.notFound(instanceID)
	}
	ref := p.c.NodeRef(v.node).VirtualMachineRef(v.vmid)
	var task *proxmox.Task
	switch action {
	case providers.PowerOn:
		if v.running {
			return nil
		}
		task, err = ref.Start(ctx)
	case providers.PowerOff:
		if !v.running {
			return nil
		}
		task, err = ref.Stop(ctx)
	case providers.PowerReboot:
		if !v.running {
			task, err = ref.Start(ctx)
		} else {
			task, err = ref.Reboot(ctx)
		}
	default:
		return providers.Errorf(Type, providers.KindInvalid, "power action %q", action)
	}
	if err != nil {
		return p.wrap(string(action)+" VM "+strconv.Itoa(v.vmid), err)
	}
	return p.wait(ctx, string(action)+" VM "+strconv.Itoa(v.vmid), task, 5*time.Minute)
}

// Delete stops the instance's VM, deletes its cloud-init ISO, then the VM
// and its disks; a missing VM is not an error. The ISO goes first: a
// delete cut short leaves a VM the next delete finds, never a join token
// on a storage that nothing points to.
func (p *Provider) Delete(ctx context.Context, instanceID string) error {
	v, err := p.find(ctx, instanceID)
	if err != nil || v == nil {
		return err
	}
	ref := p.c.NodeRef(v.node).VirtualMachineRef(v.vmid)
	what := "VM " + strconv.Itoa(v.vmid)
	if v.running {
		task, err := ref.Stop(ctx)
		if err != nil {
			return p.ignoreNotFound(p.wrap("stop "+what, err))
		}
		if err := p.wait(ctx, "stop "+what, task, 5*time.Minute); err != nil {
			return err
		}
	}
	if err := p.deleteISO(ctx, v.node, v.isoVolume()); err != nil {
		return err
	}
	task, err := ref.Delete(ctx, &proxmox.VirtualMachineDeleteOptions{Purge: true, DestroyUnreferencedDisks: true})
	if err != nil {
		return p.ignoreNotFound(p.wrap("delete "+what, err))
	}
	p.log.Info("deleted VM", "instance", instanceID, "vmid", v.vmid, "node", v.node)
	return p.wait(ctx, "delete "+what, task, 10*time.Minute)
}

func (p *Provider) ignoreNotFound(err error) error {
	if errors.Is(err, providers.ErrNotFound) {
		return nil
	}
	return err
}

// wrap turns what go-proxmox returned into a providers.Error, its message
// scrubbed of the token secret and of the user data's lines.
func (p *Provider) wrap(op string, err error, userData ...string) error {
	if err == nil {
		return nil
	}
	var perr *providers.Error
	if errors.As(err, &perr) {
		return err
	}
	e := &providers.Error{Provider: Type, Kind: providers.KindUnavailable, RetryAfter: time.Second}
	var apiErr *proxmox.APIError
	var taskErr *proxmox.TaskFailedError
	switch {
	case errors.As(err, &apiErr):
		e.Code = strconv.Itoa(apiErr.StatusCode)
		e.Kind, e.RetryAfter = kindOf(apiErr)
	case errors.As(err, &taskErr):
		e.Kind, e.RetryAfter = providers.KindInternal, 0
	case errors.Is(err, proxmox.ErrTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
	}
	e.Message = p.redact(op+": "+err.Error(), userData...)
	return e
}

// kindOf maps the API's answer to a kind: Proxmox says "does not exist"
// with a 500 or a 400 (go-proxmox's IsNotFound knows its phrasings), and
// a VM id taken with a 500.
func kindOf(e *proxmox.APIError) (providers.ErrorKind, time.Duration) {
	switch {
	case e.StatusCode == http.StatusUnauthorized:
		return providers.KindAuth, 0
	case e.StatusCode == http.StatusForbidden:
		return providers.KindForbidden, 0
	case e.StatusCode == http.StatusTooManyRequests:
		return providers.KindRateLimited, max(e.RetryAfter, time.Second)
	case proxmox.IsNotFound(e):
		return providers.KindNotFound, 0
	case strings.Contains(e.Message, "already exists"):
		return providers.KindConflict, 0
	case e.StatusCode >= 500:
		return providers.KindUnavailable, max(e.RetryAfter, time.Second)
	case e.StatusCode >= 400:
		return providers.KindInvalid, 0
	}
	return providers.KindInternal, 0
}

// redact scrubs the token secret, the user data and each of its longer
// lines (a join token alone on a line) from s.
func (p *Provider) redact(s string, userData ...string) string {
	secrets := []string{p.secret}
	for _, u := range userData {
		secrets = append(secrets, u)
		for _, line := range strings.Split(u, "\n") {
			if line = strings.TrimSpace(line); len(line) >= 8 {
				secrets = append(secrets, line)
			}
		}
	}
	return providers.Redact(s, secrets...)
}

// wait waits for a task; a task that finished badly is an error.
func (p *Provider) wait(ctx context.Context, op string, task *proxmox.Task, limit time.Duration) error {
	if task == nil {
		return nil
	}
	return p.wrap(op, task.Wait(ctx, p.poll, limit))
}

// libLogger passes go-proxmox's warnings and errors on, redacted; its
// debug and info lines (request and response bodies) are dropped.
type libLogger struct{ p *Provider }

func (libLogger) Debugf(string, ...any) {}
func (libLogger) Infof(string, ...any)  {}
func (l libLogger) Warnf(format string, v ...any) {
	l.p.log.Warn(l.p.redact(fmt.Sprintf(format, v...)))
}
func (l libLogger) Errorf(format string, v ...any) {
	l.p.log.Error(l.p.redact(fmt.Sprintf(format, v...)))
}
