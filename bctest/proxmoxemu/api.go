package proxmoxemu

import (
	"crypto/sha1" //nolint:gosec // PVE's config digest is SHA-1; it names a version, it protects nothing
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The parts of qemu-server's schema the emulator checks.
var (
	dnsNameRE    = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9\-.]*[a-zA-Z0-9])?$`)
	tagRE        = regexp.MustCompile(`^(?i)[a-z0-9_][a-z0-9_\-+.]*$`)
	urlencodedRE = regexp.MustCompile(`^[%a-zA-Z0-9\-_.!~*'()]*$`)
	diskKeyRE    = regexp.MustCompile(`^(ide[0-3]|scsi([0-9]|[12][0-9]|30)|sata[0-5]|virtio([0-9]|1[0-5]))$`)
	indexedKeyRE = regexp.MustCompile(`^(net|ipconfig|serial|unused|hostpci|usb)[0-9]+$`)
	volRE        = regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9\-_.]*):(iso|snippets|vztmpl|import)/([^,]+)$`)
)

// configKeys are the plain (non-indexed) options the emulator accepts.
var configKeys = map[string]bool{
	"name": true, "description": true, "tags": true, "cores": true, "sockets": true, "memory": true,
	"balloon": true, "cpu": true, "ostype": true, "boot": true, "agent": true, "onboot": true,
	"scsihw": true, "vga": true, "bios": true, "machine": true, "efidisk0": true, "smbios1": true,
	"vmgenid": true, "meta": true, "protection": true, "numa": true, "template": true,
	"ciuser": true, "cipassword": true, "sshkeys": true, "cicustom": true, "citype": true,
	"ciupgrade": true, "nameserver": true, "searchdomain": true,
}

// intKeys are answered as JSON numbers, as PVE does.
var intKeys = map[string]bool{
	"cores": true, "sockets": true, "memory": true, "balloon": true, "onboot": true,
	"protection": true, "numa": true, "template": true, "ciupgrade": true,
}

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	h := func(pattern string, f func(r *http.Request, p map[string]string) (any, *apiError)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			p, err := params(r)
			if err != nil {
				writeRaw(w, errf(http.StatusBadRequest, "unable to parse parameters: %v", err))
				return
			}
			// A lost clone: it takes effect, then the connection closes.
			lose := false
			if strings.HasSuffix(pattern, "/clone") {
				s.mu.Lock()
				lose, s.loseCreate = s.loseCreate, false
				s.mu.Unlock()
			}
			v, apiErr := f(r, p)
			if apiErr != nil {
				writeRaw(w, apiErr)
				return
			}
			if lose {
				loseAnswer(w)
				return
			}
			writeData(w, v)
		})
	}
	const api = "/api2/json"
	h("GET "+api+"/version", s.version)
	h("GET "+api+"/nodes", s.listNodes)
	h("GET "+api+"/nodes/{node}/status", s.nodeStatus)
	h("GET "+api+"/nodes/{node}/network", s.network)
	h("GET "+api+"/cluster/nextid", s.nextID)
	h("GET "+api+"/cluster/resources", s.resources)
	h("GET "+api+"/cluster/status", s.clusterStatus)
	h("GET "+api+"/nodes/{node}/qemu", s.listVMs)
	h("POST "+api+"/nodes/{node}/qemu", s.createVM)
	h("GET "+api+"/nodes/{node}/qemu/{vmid}/config", s.getConfig)
	h("PUT "+api+"/nodes/{node}/qemu/{vmid}/config", func(r *http.Request, p map[string]string) (any, *apiError) {
		_, err := s.setConfig(r, p)
		return nil, err
	})
	h("POST "+api+"/nodes/{node}/qemu/{vmid}/config", s.setConfig)
	h("POST "+api+"/nodes/{node}/qemu/{vmid}/clone", s.clone)
	h("GET "+api+"/nodes/{node}/qemu/{vmid}/status/current", s.currentStatus)
	h("POST "+api+"/nodes/{node}/qemu/{vmid}/status/{action}", s.power)
	h("DELETE "+api+"/nodes/{node}/qemu/{vmid}", s.deleteVM)
	h("GET "+api+"/nodes/{node}/tasks/{upid}/status", s.taskStatus)
	h("GET "+api+"/nodes/{node}/storage", s.listStorage)
	h("GET "+api+"/nodes/{node}/storage/{storage}/content", s.listContent)
	h("DELETE "+api+"/nodes/{node}/storage/{storage}/content/{volume}", s.deleteContent)
	h("POST "+api+"/nodes/{node}/storage/{storage}/upload", s.upload)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeRaw(w, errf(http.StatusNotImplemented, "Method '%s %s' not implemented", r.Method, strings.TrimPrefix(r.URL.Path, api)))
	})
	return mux
}

func (s *Server) version(*http.Request, map[string]string) (any, *apiError) {
	return map[string]string{"version": "8.2.4", "release": "8.2", "repoid": "faa83925c9641325"}, nil
}

func (s *Server) nodeLocked(name string) *apiError {
	up, ok := s.nodes[name]
	switch {
	case !ok:
		return errf(http.StatusInternalServerError, "no such cluster node '%s'", name)
	case !up:
		// pveproxy cannot forward to a node that is down.
		return errf(595, "Connection refused")
	}
	return nil
}

func (s *Server) listNodes(*http.Request, map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.nodes))
	for n := range s.nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	out := []map[string]any{}
	for _, n := range names {
		row := map[string]any{"node": n, "id": "node/" + n, "type": "node", "status": "offline", "level": ""}
		if s.nodes[n] {
			row["status"] = "online"
			row["maxcpu"] = 32
			row["maxmem"] = int64(128) << 30
			row["mem"] = int64(12) << 30
			row["cpu"] = 0.04
			row["maxdisk"] = int64(900) << 30
			row["disk"] = int64(40) << 30
			row["uptime"] = 86400
			row["ssl_fingerprint"] = "5A:1F:00:9C:3B:7E:21:44:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89"
		}
		out = append(out, row)
	}
	return out, nil
}

func (s *Server) nodeStatus(r *http.Request, _ map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.nodeLocked(r.PathValue("node")); err != nil {
		return nil, err
	}
	return map[string]any{
		"uptime":     86400,
		"pveversion": "pve-manager/8.2.4/faa83925c9641325",
		"kversion":   "Linux 6.8.8-2-pve #1 SMP PREEMPT_DYNAMIC PMX 6.8.8-2 (2024-06-24T09:00Z)",
		"cpu":        0.04,
		"cpuinfo":    map[string]any{"cpus": 32, "cores": 16, "sockets": 1, "model": "AMD EPYC 7313P 16-Core Processor", "mhz": "3000.000", "hvm": "1", "user_hz": 100, "flags": "fpu vme"},
		"memory":     map[string]any{"total": int64(128) << 30, "used": int64(12) << 30, "free": int64(116) << 30},
		"rootfs":     map[string]any{"total": int64(100) << 30, "used": int64(10) << 30, "free": int64(90) << 30, "avail": int64(85) << 30},
		"loadavg":    []string{"0.10", "0.08", "0.05"},
		"idle":       0,
		"wait":       0,
	}, nil
}

func (s *Server) network(r *http.Request, _ map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.nodeLocked(r.PathValue("node")); err != nil {
		return nil, err
	}
	return []map[string]any{
		{"iface": Bridge, "type": "bridge", "active": 1, "autostart": 1, "bridge_ports": "eno1", "bridge_stp": "off", "bridge_fd": "0", "method": "static", "families": []string{"inet"}},
		{"iface": "eno1", "type": "eth", "active": 1, "method": "manual", "families": []string{"inet"}},
	}, nil
}

func (s *Server) nextID(_ *http.Request, p map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := p["vmid"]; ok {
		id := atoi(v)
		if id < 100 {
			return nil, paramErr("vmid", "value must have a minimum value of 100")
		}
		if _, used := s.vms[id]; used {
			return nil, paramErr("vmid", "VM %d already exists", id)
		}
		return strconv.Itoa(id), nil
	}
	for id := 100; ; id++ {
		if _, used := s.vms[id]; used {
			continue
		}
		if s.raceNextID {
			s.raceNextID = false
			s.vms[id] = &vm{vmid: id, node: NodeA, config: map[string]string{"name": "someone-elses", "meta": fmt.Sprintf("creation-qemu=8.1.5,ctime=%d", time.Now().Unix())}}
		}
		return strconv.Itoa(id), nil
	}
}

func (s *Server) clusterStatus(*http.Request, map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{{"type": "cluster", "id": "cluster", "name": "bc-emu", "nodes": len(s.nodes), "quorate": 1, "version": 2}}
	for i, n := range []string{NodeA, NodeB} {
		out = append(out, map[string]any{"type": "node", "id": "node/" + n, "name": n, "nodeid": i + 1, "ip": fmt.Sprintf("10.0.0.%d", i+1),
			"online": map[bool]int{true: 1, false: 0}[s.nodes[n]], "local": map[bool]int{true: 1, false: 0}[i == 0], "level": ""})
	}
	return out, nil
}

func (s *Server) vmRow(v *vm) map[string]any {
	row := map[string]any{
		"vmid":    v.vmid,
		"name":    v.config["name"],
		"status":  "stopped",
		"cpus":    atoi(orDefault(v.config["cores"], "1")),
		"maxmem":  int64(atoi(orDefault(v.config["memory"], "512"))) << 20,
		"maxdisk": int64(8) << 30,
		"uptime":  0,
		"cpu":     0,
		"mem":     0,
		"netin":   0,
		"netout":  0,
		"disk":    0,
	}
	if v.running {
		row["status"] = "running"
		row["uptime"] = int(time.Since(v.started).Seconds())
		row["pid"] = 4242 + v.vmid
	}
	if v.template {
		row["template"] = 1
	}
	if t := v.config["tags"]; t != "" {
		row["tags"] = t
	}
	return row
}

func (s *Server) resources(_ *http.Request, p map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	typ := p["type"]
	if typ != "" && typ != "vm" && typ != "node" && typ != "storage" {
		return nil, paramErr("type", "value '%s' does not have a value in the enumeration 'vm, storage, node, sdn'", typ)
	}
	out := []map[string]any{}
	if typ == "" || typ == "vm" {
		for _, id := range s.vmidsLocked() {
			v := s.vms[id]
			row := s.vmRow(v)
			row["id"] = fmt.Sprintf("qemu/%d", v.vmid)
			row["type"] = "qemu"
			row["node"] = v.node
			row["template"] = map[bool]int{true: 1, false: 0}[v.template]
			row["maxcpu"] = row["cpus"]
			delete(row, "cpus")
			out = append(out, row)
		}
	}
	if typ == "" || typ == "node" {
		for n, up := range s.nodes {
			out = append(out, map[string]any{"id": "node/" + n, "type": "node", "node": n, "status": map[bool]string{true: "online", false: "offline"}[up]})
		}
	}
	if typ == "" || typ == "storage" {
		for n := range s.nodes {
			for _, st := range storages() {
				out = append(out, map[string]any{"id": "storage/" + n + "/" + st["storage"].(string), "type": "storage", "node": n, "storage": st["storage"], "status": "available", "content": st["content"], "plugintype": st["type"]})
			}
		}
	}
	return out, nil
}

func (s *Server) vmidsLocked() []int {
	ids := make([]int, 0, len(s.vms))
	for id := range s.vms {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}

func (s *Server) listVMs(r *http.Request, _ map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	node := r.PathValue("node")
	if err := s.nodeLocked(node); err != nil {
		return nil, err
	}
	out := []map[string]any{}
	for _, id := range s.vmidsLocked() {
		if v := s.vms[id]; v.node == node {
			out = append(out, s.vmRow(v))
		}
	}
	return out, nil
}

// vmLocked finds a VM as qemu-server does: by its config file on the node.
func (s *Server) vmLocked(r *http.Request) (*vm, *apiError) {
	node := r.PathValue("node")
	if err := s.nodeLocked(node); err != nil {
		return nil, err
	}
	id := atoi(r.PathValue("vmid"))
	if id < 100 {
		return nil, paramErr("vmid", "value must have a minimum value of 100")
	}
	v, ok := s.vms[id]
	if !ok || v.node != node {
		return nil, notExist(node, id)
	}
	return v, nil
}

func digest(cfg map[string]string) string {
	keys := make([]string, 0, len(cfg))
	for k := range cfg {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha1.New() //nolint:gosec // see the import
	for _, k := range keys {
		_, _ = fmt.Fprintf(h, "%s: %s\n", k, cfg[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (s *Server) getConfig(r *http.Request, _ map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.vmLocked(r)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"digest": digest(v.config)}
	for k, val := range v.config {
		if n, err := strconv.Atoi(val); err == nil && intKeys[k] {
			out[k] = n
			continue
		}
		out[k] = val
	}
	return out, nil
}

// checkOptionLocked validates one config option as qemu-server's schema
// would.
func (s *Server) checkOptionLocked(k, val string) *apiError {
	switch {
	case configKeys[k], diskKeyRE.MatchString(k), indexedKeyRE.MatchString(k):
	default:
		return paramErr(k, "property is not defined in schema and the schema does not allow additional properties")
	}
	switch k {
	case "name":
		if !dnsNameRE.MatchString(val) {
			return paramErr(k, "value does not match the regex pattern")
		}
	case "description":
		if len(val) > 8192 {
			return paramErr(k, "value may only be 8192 characters long")
		}
	case "tags":
		for _, t := range strings.FieldsFunc(val, func(r rune) bool { return r == ';' || r == ',' || r == ' ' }) {
			if !tagRE.MatchString(t) {
				return paramErr(k, "invalid format - invalid characters in tag '%s'", t)
			}
		}
	case "sshkeys":
		if !urlencodedRE.MatchString(val) {
			return paramErr(k, "invalid format - invalid urlencoded string: %s", val)
		}
	case "cores", "sockets":
		if atoi(val) < 1 {
			return paramErr(k, "type check ('integer') failed - got '%s'", val)
		}
	case "memory":
		if atoi(strings.TrimPrefix(val, "current=")) < 16 {
			return paramErr(k, "value must have a minimum value of 16")
		}
	case "cicustom":
		for _, part := range strings.Split(val, ",") {
			_, vol, _ := strings.Cut(part, "=")
			if err := s.volumeExistsLocked(vol); err != nil {
				return err
			}
		}
	}
	if strings.HasPrefix(k, "ipconfig") && !strings.Contains(val, "ip=") && !strings.Contains(val, "ip6=") && !strings.Contains(val, "gw") {
		return paramErr(k, "invalid format - format error")
	}
	if diskKeyRE.MatchString(k) {
		vol, _, _ := strings.Cut(val, ",")
		if volRE.MatchString(vol) {
			return s.volumeExistsLocked(vol)
		}
	}
	return nil
}

func (s *Server) volumeExistsLocked(vol string) *apiError {
	m := volRE.FindStringSubmatch(vol)
	if m == nil {
		return errf(http.StatusBadRequest, "unable to parse volume ID '%s'", vol)
	}
	if m[1] != ISOStorage {
		return errf(http.StatusInternalServerError, "storage '%s' does not exist", m[1])
	}
	if _, ok := s.volumes[vol]; !ok {
		return errf(http.StatusInternalServerError, "volume '%s' does not exist", vol)
	}
	return nil
}

// setConfig is both PUT (synchronous) and POST (a qmconfig task).
func (s *Server) setConfig(r *http.Request, p map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.vmLocked(r)
	if err != nil {
		return nil, err
	}
	if d, ok := p["digest"]; ok && d != digest(v.config) {
		return nil, errf(http.StatusInternalServerError, "detected modified configuration - file changed by other user? Try again.")
	}
	var drop []string
	if d := p["delete"]; d != "" {
		drop = strings.FieldsFunc(d, func(r rune) bool { return r == ',' || r == ';' || r == ' ' })
	}
	set := map[string]string{}
	for k, val := range p {
		switch k {
		case "digest", "delete", "revert", "skiplock", "background_delay", "force":
			continue
		}
		if err := s.checkOptionLocked(k, val); err != nil {
			return nil, err
		}
		set[k] = val
	}
	if len(set) == 0 && len(drop) == 0 {
		return nil, errf(http.StatusBadRequest, "no options specified")
	}
	for _, k := range drop {
		delete(v.config, k)
	}
	for k, val := range set {
		v.config[k] = val
	}
	return s.newTaskLocked(v.node, "qmconfig", strconv.Itoa(v.vmid)), nil
}

func (s *Server) createVM(r *http.Request, p map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	node := r.PathValue("node")
	if err := s.nodeLocked(node); err != nil {
		return nil, err
	}
	id := atoi(p["vmid"])
	if id < 100 {
		return nil, paramErr("vmid", "value must have a minimum value of 100")
	}
	if old, used := s.vms[id]; used {
		return nil, errf(http.StatusInternalServerError, "unable to create VM %d - VM %d already exists on node '%s'", id, id, old.node)
	}
	cfg := map[string]string{"meta": fmt.Sprintf("creation-qemu=8.1.5,ctime=%d", time.Now().Unix())}
	for k, val := range p {
		if k == "vmid" || k == "start" {
			continue
		}
		if err := s.checkOptionLocked(k, val); err != nil {
			return nil, err
		}
		cfg[k] = val
	}
	s.vms[id] = &vm{vmid: id, node: node, config: cfg, template: cfg["template"] == "1"}
	if boolParam(p, "start") {
		s.vms[id].running, s.vms[id].started = true, time.Now()
	}
	return s.newTaskLocked(node, "qmcreate", strconv.Itoa(id)), nil
}

// clone is qemu-server's clone_vm: a new VM whose config is the source's
// with new disks, name and description.
func (s *Server) clone(r *http.Request, p map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	src, err := s.vmLocked(r)
	if err != nil {
		return nil, err
	}
	newid := atoi(p["newid"])
	if newid < 100 {
		return nil, paramErr("newid", "value must have a minimum value of 100")
	}
	if old, used := s.vms[newid]; used {
		return nil, errf(http.StatusInternalServerError, "unable to create VM %d: VM %d already exists on node '%s'", newid, newid, old.node)
	}
	if name, ok := p["name"]; ok && !dnsNameRE.MatchString(name) {
		return nil, paramErr("name", "value does not match the regex pattern")
	}
	if d := p["description"]; len(d) > 8192 {
		return nil, paramErr("description", "value may only be 8192 characters long")
	}
	full := boolParam(p, "full")
	if !src.template {
		// Only a template can be linked-cloned.
		full = true
	}
	storage := p["storage"]
	if storage != "" {
		if storage != DiskStorage {
			return nil, errf(http.StatusInternalServerError, "storage '%s' does not exist", storage)
		}
		if !full {
			return nil, paramErr("storage", "option 'storage' can only be used together with 'full'")
		}
	}
	target := src.node
	if t := p["target"]; t != "" {
		if err := s.nodeLocked(t); err != nil {
			return nil, err
		}
		target = t
	}
	cfg := make(map[string]string, len(src.config))
	for k, val := range src.config {
		cfg[k] = val
	}
	delete(cfg, "template")
	delete(cfg, "lock")
	for k, val := range cfg {
		if !diskKeyRE.MatchString(k) || strings.Contains(val, "media=cdrom") {
			continue
		}
		vol, opts, _ := strings.Cut(val, ",")
		st, _, _ := strings.Cut(vol, ":")
		if storage != "" {
			st = storage
		}
		disk := fmt.Sprintf("%s:vm-%d-disk-0", st, newid)
		if !full {
			disk = fmt.Sprintf("%s:base-%d-disk-0/vm-%d-disk-0", st, src.vmid, newid)
		}
		cfg[k] = disk + "," + opts
	}
	cfg["name"] = orDefault(p["name"], fmt.Sprintf("Copy-of-VM-%s", src.config["name"]))
	if d, ok := p["description"]; ok {
		cfg["description"] = d
	}
	cfg["meta"] = fmt.Sprintf("creation-qemu=8.1.5,ctime=%d", time.Now().Unix())
	s.vms[newid] = &vm{vmid: newid, node: target, config: cfg}
	return s.newTaskLocked(src.node, "qmclone", strconv.Itoa(src.vmid)), nil
}

func (s *Server) currentStatus(r *http.Request, _ map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.vmLocked(r)
	if err != nil {
		return nil, err
	}
	row := s.vmRow(v)
	row["qmpstatus"] = row["status"]
	row["ha"] = map[string]any{"managed": 0}
	if v.config["agent"] != "" {
		row["agent"] = 1
	}
	return row, nil
}

func (s *Server) power(r *http.Request, _ map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.vmLocked(r)
	if err != nil {
		return nil, err
	}
	action := r.PathValue("action")
	typ := "qm" + action
	switch action {
	case "start":
		switch {
		case v.template:
			return nil, errf(http.StatusInternalServerError, "you can't start a vm if it's a template")
		case v.running:
			return nil, errf(http.StatusInternalServerError, "VM %d already running", v.vmid)
		}
		v.running, v.started = true, time.Now()
	case "stop", "shutdown":
		v.running = false
	case "reboot", "reset":
		if !v.running {
			return nil, errf(http.StatusInternalServerError, "VM %d not running", v.vmid)
		}
		v.started = time.Now()
	default:
		return nil, errf(http.StatusNotImplemented, "Method 'POST /nodes/%s/qemu/%d/status/%s' not implemented", v.node, v.vmid, action)
	}
	return s.newTaskLocked(v.node, typ, strconv.Itoa(v.vmid)), nil
}

func (s *Server) deleteVM(r *http.Request, _ map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.vmLocked(r)
	if err != nil {
		return nil, err
	}
	if v.running {
		return nil, errf(http.StatusInternalServerError, "VM %d is running - destroy failed", v.vmid)
	}
	delete(s.vms, v.vmid)
	return s.newTaskLocked(v.node, "qmdestroy", strconv.Itoa(v.vmid)), nil
}

func (s *Server) taskStatus(r *http.Request, _ map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[r.PathValue("upid")]
	if !ok || t.node != r.PathValue("node") {
		return nil, paramErr("upid", "no such task")
	}
	var pid, pstart int
	_, _ = fmt.Sscanf(strings.Split(t.upid, ":")[2], "%X", &pid)
	_, _ = fmt.Sscanf(strings.Split(t.upid, ":")[3], "%X", &pstart)
	return map[string]any{
		"upid": t.upid, "node": t.node, "pid": pid, "pstart": pstart, "starttime": t.start.Unix(),
		"type": t.typ, "id": t.id, "user": s.TokenID(), "status": "stopped", "exitstatus": t.exit,
	}, nil
}

func storages() []map[string]any {
	return []map[string]any{
		{"storage": ISOStorage, "type": "dir", "content": "iso,vztmpl,backup,snippets", "enabled": 1, "active": 1, "shared": 0, "total": int64(100) << 30, "used": int64(10) << 30, "avail": int64(85) << 30, "used_fraction": 0.1},
		{"storage": DiskStorage, "type": "lvmthin", "content": "images,rootdir", "enabled": 1, "active": 1, "shared": 0, "total": int64(800) << 30, "used": int64(30) << 30, "avail": int64(770) << 30, "used_fraction": 0.04},
	}
}

func (s *Server) listStorage(r *http.Request, p map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.nodeLocked(r.PathValue("node")); err != nil {
		return nil, err
	}
	out := []map[string]any{}
	for _, st := range storages() {
		if c := p["content"]; c != "" && !strings.Contains(st["content"].(string), c) {
			continue
		}
		if name := p["storage"]; name != "" && st["storage"] != name {
			continue
		}
		out = append(out, st)
	}
	return out, nil
}

func (s *Server) storageLocked(r *http.Request) *apiError {
	if err := s.nodeLocked(r.PathValue("node")); err != nil {
		return err
	}
	switch st := r.PathValue("storage"); st {
	case ISOStorage, DiskStorage:
		return nil
	default:
		return errf(http.StatusInternalServerError, "storage '%s' does not exist", st)
	}
}

func (s *Server) listContent(r *http.Request, p map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.storageLocked(r); err != nil {
		return nil, err
	}
	out := []map[string]any{}
	if r.PathValue("storage") != ISOStorage {
		return out, nil
	}
	vols := make([]string, 0, len(s.volumes))
	for v := range s.volumes {
		vols = append(vols, v)
	}
	sort.Strings(vols)
	for _, vol := range vols {
		m := volRE.FindStringSubmatch(vol)
		if c := p["content"]; c != "" && c != m[2] {
			continue
		}
		format := map[string]string{"iso": "iso", "snippets": "snippet", "vztmpl": "tgz", "import": "raw"}[m[2]]
		out = append(out, map[string]any{"volid": vol, "content": m[2], "format": format, "size": len(s.volumes[vol]), "ctime": time.Now().Unix()})
	}
	return out, nil
}

func (s *Server) deleteContent(r *http.Request, _ map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.storageLocked(r); err != nil {
		return nil, err
	}
	vol := r.PathValue("volume")
	if !strings.Contains(vol, ":") {
		vol = r.PathValue("storage") + ":" + vol
	}
	if err := s.volumeExistsLocked(vol); err != nil {
		return nil, err
	}
	delete(s.volumes, vol)
	return s.newTaskLocked(r.PathValue("node"), "imgdel", ""), nil
}

// upload takes what pveproxy's upload takes: iso, vztmpl or import, never
// snippets (Proxmox has no API to write one; Bugzilla #2208).
func (s *Server) upload(r *http.Request, p map[string]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.storageLocked(r); err != nil {
		return nil, err
	}
	content := p["content"]
	switch content {
	case "iso", "vztmpl", "import":
	default:
		return nil, paramErr("content", "value '%s' does not have a value in the enumeration 'iso, vztmpl, import'", content)
	}
	if r.PathValue("storage") != ISOStorage {
		return nil, paramErr("storage", "storage '%s' does not support '%s' content", r.PathValue("storage"), content)
	}
	if r.MultipartForm == nil || len(r.MultipartForm.File["filename"]) != 1 {
		return nil, paramErr("filename", "property is missing and it is not optional")
	}
	fh := r.MultipartForm.File["filename"][0]
	name := fh.Filename
	if content == "iso" && !strings.HasSuffix(strings.ToLower(name), ".iso") && !strings.HasSuffix(strings.ToLower(name), ".img") {
		return nil, errf(http.StatusInternalServerError, "wrong file extension")
	}
	if strings.ContainsAny(name, "/\\") || strings.HasPrefix(name, ".") {
		return nil, errf(http.StatusInternalServerError, "filename '%s' is not valid", name)
	}
	vol := ISOStorage + ":" + content + "/" + name
	if _, exists := s.volumes[vol]; exists {
		return nil, errf(http.StatusInternalServerError, "refusing to override existing file '/var/lib/vz/template/iso/%s'", name)
	}
	f, err := fh.Open()
	if err != nil {
		return nil, errf(http.StatusInternalServerError, "unable to read upload: %v", err)
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, errf(http.StatusInternalServerError, "unable to read upload: %v", err)
	}
	s.volumes[vol] = b
	return s.newTaskLocked(r.PathValue("node"), "imgcopy", ""), nil
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}
