package proxmox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/luthermonson/go-proxmox"

	"github.com/better-compute/better-compute/internal/providers"
)

// descPrefix starts the description line that carries a VM's labels.
// Proxmox's tags allow neither "/" nor ":" (bettercompute.io/instance), so
// the labels live in the description, one JSON object on one line, which
// the clone writes in the same call that makes the VM.
const descPrefix = "bettercompute: "

// descHeader is the human line above it, shown in the VM's notes.
const descHeader = "Managed by Better Compute. Keep the line below: it names the instance of this VM."

// meta is what the description line holds.
type meta struct {
	Labels     map[string]string `json:"labels"`
	ServerType string            `json:"server_type,omitempty"`
}

func description(m meta) string {
	b, _ := json.Marshal(m)
	return descHeader + "\n" + descPrefix + string(b) + "\n"
}

// parseDescription finds the labels line; ok is false for a VM without
// one (not ours).
func parseDescription(d string) (meta, bool) {
	for _, line := range strings.Split(d, "\n") {
		rest, found := strings.CutPrefix(strings.TrimSpace(line), descPrefix)
		if !found {
			continue
		}
		var m meta
		if json.Unmarshal([]byte(rest), &m) == nil && m.Labels != nil {
			return m, true
		}
	}
	return meta{}, false
}

// vm is one managed VM as read from the cluster.
type vm struct {
	p       *Provider
	vmid    int
	node    string
	running bool
	status  string
	cfg     *proxmox.VirtualMachineConfig
	meta    meta
}

// isoName is the file of a VM's cloud-init ISO.
func isoName(vmid int) string { return fmt.Sprintf("bc-%d-cidata.iso", vmid) }

// isoRE matches a volume of ours: a rebuild that had to take a new VM id
// keeps the ISO named by the old one.
var isoRE = regexp.MustCompile(`^[^:]+:iso/bc-[0-9]+-cidata\.iso$`)

// isoVolume is the VM's attached cloud-init ISO, "" when it has none of
// ours attached (a create cut short before it attached one).
func (v *vm) isoVolume() string {
	vol, _, _ := strings.Cut(device(v.cfg, v.p.ciDev), ",")
	if isoRE.MatchString(vol) {
		return vol
	}
	return ""
}

// device reads a drive (ide2, sata1, scsi3, virtio4) from a config.
func device(cfg *proxmox.VirtualMachineConfig, key string) string {
	if cfg == nil {
		return ""
	}
	for _, m := range []map[string]string{cfg.IDEs, cfg.SATAs, cfg.SCSIs, cfg.VirtIOs} {
		if v, ok := m[key]; ok {
			return v
		}
	}
	return ""
}

func (v *vm) server() providers.Server {
	s := providers.Server{
		ID:         strconv.Itoa(v.vmid),
		InstanceID: v.meta.Labels[providers.InstanceLabel],
		Name:       v.cfg.Name,
		ServerType: v.meta.ServerType,
		Location:   v.node,
		Labels:     v.meta.Labels,
		Status:     providers.StatusUnknown,
	}
	switch {
	case v.cfg.Lock == "clone" || v.cfg.Lock == "create":
		s.Status = providers.StatusStarting
	case v.cfg.Lock == "destroyed":
		s.Status = providers.StatusDeleting
	case v.status == "running":
		s.Status = providers.StatusRunning
	case v.status == "stopped":
		s.Status = providers.StatusStopped
	}
	// A static address is in ipconfig0; DHCP's is known to the guest only
	// (bcd reports it when it joins).
	for _, part := range strings.Split(v.cfg.IPConfigs["ipconfig0"], ",") {
		if ip, ok := strings.CutPrefix(part, "ip="); ok && ip != "dhcp" {
			s.IPv4, _, _ = strings.Cut(ip, "/")
		}
		if ip, ok := strings.CutPrefix(part, "ip6="); ok && ip != "dhcp" && ip != "auto" {
			s.IPv6, _, _ = strings.Cut(ip, "/")
		}
	}
	// meta: creation-qemu=8.1.5,ctime=1700000000, which Proxmox writes
	// when it makes the VM.
	for _, part := range strings.Split(v.cfg.Meta, ",") {
		if ct, ok := strings.CutPrefix(part, "ctime="); ok {
			if n, err := strconv.ParseInt(ct, 10, 64); err == nil {
				s.Created = time.Unix(n, 0).UTC()
			}
		}
	}
	return s
}

// managed reads every VM of the cluster that carries this control plane's
// label: one listing, then each VM's config (Proxmox lists no
// descriptions). The listing is not paged, so it is every VM.
func (p *Provider) managed(ctx context.Context) ([]*vm, error) {
	res, err := (&proxmox.Cluster{}).New(p.c).Resources(ctx, "vm")
	if err != nil {
		return nil, p.wrap("list VMs", err)
	}
	sort.Slice(res, func(i, j int) bool { return res[i].VMID < res[j].VMID })
	var out []*vm
	for _, r := range res {
		if r.Type != "qemu" || r.Template == 1 {
			continue
		}
		cfg := &proxmox.VirtualMachineConfig{}
		path := fmt.Sprintf("/nodes/%s/qemu/%d/config", url.PathEscape(r.Node), r.VMID)
		if err := p.c.Get(ctx, path, cfg); err != nil {
			if proxmox.IsNotFound(err) {
				// Deleted between the listing and now.
				continue
			}
			return nil, p.wrap(fmt.Sprintf("read VM %d", r.VMID), err)
		}
		m, ok := parseDescription(cfg.Description)
		if !ok || m.Labels[providers.ManagedLabel] != p.cpID {
			continue
		}
		out = append(out, &vm{p: p, vmid: int(r.VMID), node: r.Node, status: r.Status, running: r.Status == "running", cfg: cfg, meta: m})
	}
	return out, nil
}

// find is the VM of an instance, nil when there is none; of two (which
// only a hand-made copy makes) the older.
func (p *Provider) find(ctx context.Context, instanceID string) (*vm, error) {
	vms, err := p.managed(ctx)
	if err != nil {
		return nil, err
	}
	var found *vm
	for _, v := range vms {
		if v.meta.Labels[providers.InstanceLabel] != instanceID {
			continue
		}
		if found != nil {
			p.log.Warn("two VMs carry one instance; using the older", "instance", instanceID, "vmid", found.vmid, "other", v.vmid)
			continue
		}
		found = v
	}
	return found, nil
}

// template finds a template by VM id or name: its id and node.
func (p *Provider) template(ctx context.Context, ref string) (int, string, error) {
	if ref == "" {
		return 0, "", providers.Errorf(Type, providers.KindInvalid, "no template: the create names no image and setting %s is empty", fieldTemplate)
	}
	res, err := (&proxmox.Cluster{}).New(p.c).Resources(ctx, "vm")
	if err != nil {
		return 0, "", p.wrap("list VMs", err)
	}
	id, _ := strconv.Atoi(ref)
	for _, r := range res {
		if r.Type != "qemu" || r.Template != 1 {
			continue
		}
		if int(r.VMID) == id || r.Name == ref {
			return int(r.VMID), r.Node, nil
		}
	}
	return 0, "", providers.Errorf(Type, providers.KindInvalid, "no template %q on the cluster", ref)
}
