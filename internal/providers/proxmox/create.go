package proxmox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
	"github.com/luthermonson/go-proxmox"

	"github.com/better-compute/better-compute/internal/providers"
)

// cloneAttempts bounds the retries of a clone whose VM id another client
// took between /cluster/nextid and the clone.
const cloneAttempts = 5

// Create clones the template to a new VM of the instance, gives it its
// size, bridge and cloud-init ISO, and starts it. A VM of the instance that
// exists is returned as it is, after finishing what a create cut short left
// undone (the ISO and the first start).
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (providers.Server, error) {
	if req.InstanceID == "" {
		return providers.Server{}, providers.Errorf(Type, providers.KindInvalid, "create without an instance id")
	}
	sz, err := p.sizeOf(req.ServerType)
	if err != nil {
		return providers.Server{}, err
	}
	node := orDefault(req.Location, p.node)
	if !slices.Contains(p.nodes, node) {
		return providers.Server{}, providers.Errorf(Type, providers.KindInvalid, "location %q is not a node of this account (setting %s)", node, fieldNodes)
	}
	v, err := p.find(ctx, req.InstanceID)
	if err != nil {
		return providers.Server{}, err
	}
	if v == nil {
		if v, err = p.cloneFor(ctx, req, node, 0); err != nil {
			return providers.Server{}, err
		}
	}
	if v.isoVolume() == "" {
		if err := p.finish(ctx, v, req, sz); err != nil {
			return providers.Server{}, err
		}
		if v, err = p.find(ctx, req.InstanceID); err != nil {
			return providers.Server{}, err
		}
		if v == nil {
			return providers.Server{}, providers.Errorf(Type, providers.KindConflict, "the VM of instance %s went away while it was made", req.InstanceID)
		}
	}
	return v.server(), nil
}

// cloneFor full-clones the template into a new VM carrying the instance's
// labels, on node; prefer is a VM id to try first (a rebuild's own).
func (p *Provider) cloneFor(ctx context.Context, req providers.CreateRequest, node string, prefer int) (*vm, error) {
	tmplID, tmplNode, err := p.template(ctx, orDefault(req.Image, p.tmpl))
	if err != nil {
		return nil, err
	}
	labels := map[string]string{}
	for k, v := range req.Labels {
		labels[k] = v
	}
	labels[providers.InstanceLabel] = req.InstanceID
	labels[providers.ManagedLabel] = p.cpID
	opts := &proxmox.VirtualMachineCloneOptions{
		Name:        vmName(req),
		Description: description(meta{Labels: labels, ServerType: req.ServerType}),
		Full:        true,
		Storage:     p.storage,
	}
	if node != tmplNode {
		opts.Target = node
	}
	tmpl := p.c.NodeRef(tmplNode).VirtualMachineRef(tmplID)
	for attempt := 0; attempt < cloneAttempts; attempt++ {
		id := prefer
		if attempt > 0 || id == 0 {
			var next string
			if err := p.c.Get(ctx, "/cluster/nextid", &next); err != nil {
				return nil, p.wrap("next VM id", err)
			}
			if id, err = strconv.Atoi(next); err != nil {
				return nil, providers.Errorf(Type, providers.KindInternal, "next VM id %q is no number", next)
			}
		}
		opts.NewID = id
		_, task, err := tmpl.Clone(ctx, opts)
		if err == nil {
			p.log.Info("cloned template", "instance", req.InstanceID, "template", tmplID, "vmid", id, "node", node)
			if err := p.wait(ctx, fmt.Sprintf("clone template %d to VM %d", tmplID, id), task, 30*time.Minute); err != nil {
				return nil, err
			}
			return p.mustFind(ctx, req.InstanceID)
		}
		werr := p.wrap(fmt.Sprintf("clone template %d to VM %d", tmplID, id), err)
		var apiErr *proxmox.APIError
		if errors.As(err, &apiErr) && providers.KindOf(werr) != providers.KindConflict {
			return nil, werr
		}
		// The answer is lost (a clone may have taken effect), or the id
		// is taken (perhaps by this instance's own earlier clone): look
		// again before another try.
		v, ferr := p.find(ctx, req.InstanceID)
		if ferr != nil {
			return nil, werr
		}
		if v != nil {
			p.log.Info("found the clone of a lost answer", "instance", req.InstanceID, "vmid", v.vmid)
			return v, nil
		}
		if providers.KindOf(werr) != providers.KindConflict {
			return nil, werr
		}
		p.log.Info("VM id taken; trying the next", "instance", req.InstanceID, "vmid", id)
	}
	return nil, providers.Errorf(Type, providers.KindConflict, "no free VM id after %d tries", cloneAttempts)
}

func (p *Provider) mustFind(ctx context.Context, instanceID string) (*vm, error) {
	v, err := p.find(ctx, instanceID)
	if err == nil && v == nil {
		err = providers.Errorf(Type, providers.KindInternal, "the clone of instance %s is not on the cluster", instanceID)
	}
	return v, err
}

// finish gives a cloned VM its size, bridge and cloud-init ISO, then
// starts it.
func (p *Provider) finish(ctx context.Context, v *vm, req providers.CreateRequest, sz *size) error {
	what := "VM " + strconv.Itoa(v.vmid)
	iso, err := cidataISO(req)
	if err != nil {
		return providers.Errorf(Type, providers.KindInternal, "cloud-init ISO of %s: %s", what, p.redact(err.Error(), req.UserData))
	}
	vol := p.isoSt + ":iso/" + isoName(v.vmid)
	// Proxmox refuses to overwrite a file: an earlier try's ISO goes first.
	if err := p.deleteISO(ctx, v.node, vol); err != nil {
		return err
	}
	var upid string
	path := fmt.Sprintf("/nodes/%s/storage/%s/upload", url.PathEscape(v.node), url.PathEscape(p.isoSt))
	if err := p.c.UploadReader(path, map[string]string{"content": "iso"}, isoName(v.vmid), bytes.NewReader(iso), int64(len(iso)), &upid); err != nil {
		return p.wrap("upload the cloud-init ISO of "+what, err, req.UserData)
	}
	if err := p.wait(ctx, "upload the cloud-init ISO of "+what, proxmox.NewTask(proxmox.UPID(upid), p.c), 5*time.Minute); err != nil {
		return err
	}
	opts := []proxmox.VirtualMachineOption{{Name: p.ciDev, Value: vol + ",media=cdrom"}}
	if sz != nil {
		opts = append(opts,
			proxmox.VirtualMachineOption{Name: "cores", Value: sz.cores},
			proxmox.VirtualMachineOption{Name: "memory", Value: sz.memoryGiB * 1024})
	}
	if p.bridge != "" {
		if err := p.checkBridge(ctx, v.node); err != nil {
			return err
		}
		opts = append(opts, proxmox.VirtualMachineOption{Name: "net0", Value: withBridge(v.cfg.Nets["net0"], p.bridge)})
	}
	ref := p.c.NodeRef(v.node).VirtualMachineRef(v.vmid)
	if err := ref.ConfigSync(ctx, opts...); err != nil {
		return p.wrap("configure "+what, err)
	}
	task, err := ref.Start(ctx)
	if err != nil {
		if strings.Contains(err.Error(), "already running") {
			return nil
		}
		return p.wrap("start "+what, err)
	}
	p.log.Info("started VM", "instance", req.InstanceID, "vmid", v.vmid, "node", v.node)
	return p.wait(ctx, "start "+what, task, 5*time.Minute)
}

// vmName is the request's name, or one made of the instance id: Proxmox
// wants a DNS name, and an instance id has underscores.
func vmName(req providers.CreateRequest) string {
	if req.Name != "" {
		return req.Name
	}
	return "bc-" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, req.InstanceID)
}

// withBridge sets the bridge of a net device ("virtio=MAC,bridge=vmbr0"),
// keeping its model and MAC address.
func withBridge(net, bridge string) string {
	if net == "" {
		return "virtio,bridge=" + bridge
	}
	parts := strings.Split(net, ",")
	set := false
	for i, part := range parts {
		if strings.HasPrefix(part, "bridge=") {
			parts[i], set = "bridge="+bridge, true
		}
	}
	if !set {
		parts = append(parts, "bridge="+bridge)
	}
	return strings.Join(parts, ",")
}

// checkBridge fails a create on a node without the bridge now, instead of
// at the VM's start with a message about a tap device.
func (p *Provider) checkBridge(ctx context.Context, node string) error {
	var ifaces []struct {
		Iface string `json:"iface"`
		Type  string `json:"type"`
	}
	if err := p.c.Get(ctx, fmt.Sprintf("/nodes/%s/network?type=any_bridge", url.PathEscape(node)), &ifaces); err != nil {
		return p.wrap("list the bridges of node "+node, err)
	}
	for _, i := range ifaces {
		if i.Iface == p.bridge {
			return nil
		}
	}
	return providers.Errorf(Type, providers.KindInvalid, "node %s has no bridge %s (setting %s)", node, p.bridge, fieldBridge)
}

// deleteISO deletes a cloud-init ISO; one already gone is fine.
func (p *Provider) deleteISO(ctx context.Context, node, vol string) error {
	if vol == "" {
		return nil
	}
	storage, _, _ := strings.Cut(vol, ":")
	var upid string
	path := fmt.Sprintf("/nodes/%s/storage/%s/content/%s", url.PathEscape(node), url.PathEscape(storage), url.PathEscape(vol))
	if err := p.c.Delete(ctx, path, &upid); err != nil {
		return p.ignoreNotFound(p.wrap("delete "+vol, err))
	}
	return p.wait(ctx, "delete "+vol, proxmox.NewTask(proxmox.UPID(upid), p.c), 5*time.Minute)
}

// cidataISO is the NoCloud seed of a VM: user-data as given, meta-data
// with the instance id, host name and SSH keys. It is built in a private
// directory (0700), since the user data is a secret, and removed after.
func cidataISO(req providers.CreateRequest) (_ []byte, err error) {
	dir, err := os.MkdirTemp("", "bc-cidata-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "cidata.iso")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	b, err := file.OpenFromPath(path, false)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := b.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	fs, err := iso9660.Create(b, 0, 0, 2048, work)
	if err != nil {
		return nil, err
	}
	var md strings.Builder
	fmt.Fprintf(&md, "instance-id: %s\nlocal-hostname: %s\n", req.InstanceID, vmName(req))
	if len(req.SSHKeys) > 0 {
		md.WriteString("public-keys:\n")
		for _, k := range req.SSHKeys {
			fmt.Fprintf(&md, "  - %q\n", strings.TrimSpace(k))
		}
	}
	for name, content := range map[string]string{"user-data": req.UserData, "meta-data": md.String()} {
		rw, err := fs.OpenFile("/"+name, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return nil, err
		}
		if _, err := rw.Write([]byte(content)); err != nil {
			return nil, err
		}
		if err := rw.Close(); err != nil {
			return nil, err
		}
	}
	// cloud-init's NoCloud finds the seed by the volume label cidata.
	if err := fs.Finalize(iso9660.FinalizeOptions{RockRidge: true, Joliet: true, VolumeIdentifier: "cidata"}); err != nil {
		return nil, err
	}
	return os.ReadFile(path)
}

// Rebuild re-clones the instance's VM from image (a template, "" for the
// account's): the disk is lost; the VM id, name, labels, size and
// cloud-init ISO stay, so the guest boots the same user data again.
func (p *Provider) Rebuild(ctx context.Context, instanceID, image string) error {
	v, err := p.find(ctx, instanceID)
	if err != nil {
		return err
	}
	if v == nil {
		return p.notFound(instanceID)
	}
	vol := v.isoVolume()
	if vol == "" {
		return providers.Errorf(Type, providers.KindInvalid, "VM %d has no cloud-init ISO yet: create the instance again instead", v.vmid)
	}
	// The template must be there before the VM goes.
	if _, _, err := p.template(ctx, orDefault(image, p.tmpl)); err != nil {
		return err
	}
	ref := p.c.NodeRef(v.node).VirtualMachineRef(v.vmid)
	what := "VM " + strconv.Itoa(v.vmid)
	if v.running {
		task, err := ref.Stop(ctx)
		if err != nil {
			return p.wrap("stop "+what, err)
		}
		if err := p.wait(ctx, "stop "+what, task, 5*time.Minute); err != nil {
			return err
		}
	}
	task, err := ref.Delete(ctx, &proxmox.VirtualMachineDeleteOptions{Purge: true, DestroyUnreferencedDisks: true})
	if err != nil {
		return p.wrap("delete "+what+" to rebuild it", err)
	}
	if err := p.wait(ctx, "delete "+what+" to rebuild it", task, 10*time.Minute); err != nil {
		return err
	}
	req := providers.CreateRequest{InstanceID: instanceID, Name: v.cfg.Name, Image: image, ServerType: v.meta.ServerType, Labels: v.meta.Labels}
	nv, err := p.cloneFor(ctx, req, v.node, v.vmid)
	if err != nil {
		return err
	}
	// The ISO is named by the VM id; a clone that had to take another id
	// keeps pointing at the first (Delete removes it by the drive's value).
	opts := []proxmox.VirtualMachineOption{{Name: p.ciDev, Value: vol + ",media=cdrom"}}
	if sz, _ := p.sizeOf(v.meta.ServerType); sz != nil {
		opts = append(opts,
			proxmox.VirtualMachineOption{Name: "cores", Value: sz.cores},
			proxmox.VirtualMachineOption{Name: "memory", Value: sz.memoryGiB * 1024})
	}
	if p.bridge != "" {
		opts = append(opts, proxmox.VirtualMachineOption{Name: "net0", Value: withBridge(nv.cfg.Nets["net0"], p.bridge)})
	}
	nref := p.c.NodeRef(nv.node).VirtualMachineRef(nv.vmid)
	if err := nref.ConfigSync(ctx, opts...); err != nil {
		return p.wrap("configure rebuilt VM "+strconv.Itoa(nv.vmid), err)
	}
	start, err := nref.Start(ctx)
	if err != nil {
		return p.wrap("start rebuilt VM "+strconv.Itoa(nv.vmid), err)
	}
	p.log.Info("rebuilt VM", "instance", instanceID, "vmid", nv.vmid, "node", nv.node)
	return p.wait(ctx, "start rebuilt VM "+strconv.Itoa(nv.vmid), start, 5*time.Minute)
}
