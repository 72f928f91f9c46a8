// Package proxmoxemu is an in-process Proxmox VE API (/api2/json) served
// over HTTPS: nodes, storages with their content, QEMU VMs cloned from a
// template, their config (cloud-init keys included), power, and the tasks
// (UPIDs) every change answers with. It speaks the real wire format closely
// enough that go-proxmox and Debian's python3-proxmoxer work against it:
// {"data": ...} envelopes, API-token auth, errors with the message in the
// HTTP status line and {"data":null,"message":...,"errors":{...}} bodies.
//
// It also implements the providers conformance Emulator: rate limits (429
// with Retry-After, which Proxmox itself never sends but a proxy in front of
// it may), a clone whose answer is lost, injected failures.
//
// It is a test fake: it must never hold a real credential or reach a real
// Proxmox host.
package proxmoxemu

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The account the emulator accepts.
const (
	// User is the token's owner; TokenName its id.
	User      = "bc@pve"
	TokenName = "conformance"
	// TemplateID and TemplateName are the cloud-init template on NodeA.
	TemplateID   = 9000
	TemplateName = "debian-12-cloudinit"
	// NodeA holds the template; NodeB is a second node of the cluster.
	NodeA = "pve1"
	NodeB = "pve2"
	// Bridge exists on every node.
	Bridge = "vmbr0"
	// ISOStorage is a directory storage (iso, vztmpl, snippets, backup);
	// DiskStorage holds VM disks.
	ISOStorage  = "local"
	DiskStorage = "local-lvm"
	// Sizes is the catalog setting the emulator's offers count assumes: a
	// provider account on the emulator lists these sizes on both nodes.
	Sizes = "small:2:4:0.0200,medium:4:8:0.0400,large:8:32:0.1200"
)

// pageSize is what the emulator reports as its page size: Proxmox lists are
// unpaged, so any number proves List returns everything; 5 keeps the
// conformance case short.
const pageSize = 5

type vm struct {
	vmid     int
	node     string
	running  bool
	started  time.Time
	config   map[string]string
	template bool
}

type task struct {
	upid, node, typ, id string
	start               time.Time
	exit                string
}

type failure struct {
	status  int
	message string
}

// Server is one emulated Proxmox VE cluster.
type Server struct {
	srv    *httptest.Server
	secret string

	mu         sync.Mutex
	vms        map[int]*vm
	volumes    map[string][]byte // volid → content, on ISOStorage
	tasks      map[string]*task
	nodes      map[string]bool // name → online
	rateLimit  int
	loseCreate bool
	raceNextID bool
	fail       *failure
	pid        int
}

// New starts an emulated cluster of two nodes with a cloud-init template
// on NodeA; it stops when t ends.
func New(t testing.TB) *Server {
	t.Helper()
	s := &Server{
		secret:  fmt.Sprintf("9b1c2f4e-%04x-4d6a-8e1f-%012x", time.Now().UnixNano()&0xffff, time.Now().UnixNano()&0xffffffffffff),
		vms:     map[int]*vm{},
		volumes: map[string][]byte{},
		tasks:   map[string]*task{},
		nodes:   map[string]bool{NodeA: true, NodeB: true},
		pid:     0x1f00,
	}
	s.vms[TemplateID] = &vm{vmid: TemplateID, node: NodeA, template: true, config: map[string]string{
		"name":     TemplateName,
		"template": "1",
		"cores":    "2",
		"memory":   "2048",
		"ostype":   "l26",
		"scsihw":   "virtio-scsi-pci",
		"scsi0":    DiskStorage + ":base-9000-disk-0,size=8G",
		"ide2":     DiskStorage + ":cloudinit,media=cdrom",
		"net0":     "virtio=BC:24:11:00:90:00,bridge=" + Bridge,
		"boot":     "order=scsi0",
		"serial0":  "socket",
		"vga":      "serial0",
		"agent":    "1",
		"meta":     "creation-qemu=8.1.5,ctime=1700000000",
		"vmgenid":  "4f2c6a1e-3b0d-4c8e-9a7f-2d5e8b1c0f93",
		"smbios1":  "uuid=0e6b1f2a-7c3d-4e5f-8a9b-1c2d3e4f5a6b",
	}}
	s.srv = httptest.NewTLSServer(s.handler())
	t.Cleanup(s.srv.Close)
	return s
}

// URL is the API base (https://127.0.0.1:port/api2/json), as go-proxmox
// takes it.
func (s *Server) URL() string { return s.srv.URL + "/api2/json" }

// HostPort is the server's host:port, as proxmoxer takes it.
func (s *Server) HostPort() string { return strings.TrimPrefix(s.srv.URL, "https://") }

// TokenID is the API token's id (user@realm!tokenname).
func (s *Server) TokenID() string { return User + "!" + TokenName }

// Secret is the API token's secret.
func (s *Server) Secret() string { return s.secret }

// Client is an HTTP client that trusts the emulator's certificate; a
// client without it must skip verification (insecure_tls).
func (s *Server) Client() *http.Client { return s.srv.Client() }

// Servers counts the VMs that are not templates.
func (s *Server) Servers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, v := range s.vms {
		if !v.template {
			n++
		}
	}
	return n
}

// Offers counts the catalog: every size of Sizes on every online node.
func (s *Server) Offers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	online := 0
	for _, up := range s.nodes {
		if up {
			online++
		}
	}
	return len(strings.Split(Sizes, ",")) * online
}

// PageSize is nominal: Proxmox does not page its lists.
func (s *Server) PageSize() int { return pageSize }

// RateLimitNext answers the next n requests 429 with Retry-After: 1.
func (s *Server) RateLimitNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rateLimit = n
}

// LoseNextCreate makes the next clone take effect and its connection
// close before a byte of the answer.
func (s *Server) LoseNextCreate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseCreate = true
}

// RaceNextID makes another client take the id the next /cluster/nextid
// answers, as if its clone ran between that answer and the caller's.
func (s *Server) RaceNextID() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.raceNextID = true
}

// FailNext answers the next request with status and message as Proxmox
// does: the message's first line in the status line and the whole of it in
// the body.
func (s *Server) FailNext(status int, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = &failure{status: status, message: message}
}

// Secrets are the credentials a client holds.
func (s *Server) Secrets() []string { return []string{s.secret} }

// SetNodeOnline takes a node off line (or back on).
func (s *Server) SetNodeOnline(node string, online bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes[node] = online
}

// VMConfig is a copy of a VM's config (nil when there is no such VM).
func (s *Server) VMConfig(vmid int) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vms[vmid]
	if !ok {
		return nil
	}
	out := make(map[string]string, len(v.config))
	for k, val := range v.config {
		out[k] = val
	}
	return out
}

// Volume is a copy of a volume's content (nil when there is none).
func (s *Server) Volume(volid string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.volumes[volid]...)
}

// AddVolume puts a file on ISOStorage, as an operator's scp would (a
// snippet, which the API cannot write).
func (s *Server) AddVolume(volid string, content []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.volumes[volid] = append([]byte(nil), content...)
}

// Volumes lists the volids on ISOStorage, sorted.
func (s *Server) Volumes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.volumes))
	for v := range s.volumes {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// apiError is an answer other than 200: the status, PVE's message and,
// for parameter errors, one message per parameter.
type apiError struct {
	status int
	msg    string
	params map[string]string
}

func (e *apiError) Error() string { return e.msg }

func errf(status int, format string, args ...any) *apiError {
	return &apiError{status: status, msg: fmt.Sprintf(format, args...)}
}

// paramErr is raise_param_exc: 400 "Parameter verification failed." with
// the detail per parameter.
func paramErr(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: "Parameter verification failed.", params: map[string]string{param: fmt.Sprintf(format, args...)}}
}

func notExist(node string, vmid int) *apiError {
	return errf(http.StatusInternalServerError, "Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", node, vmid)
}

// handler is the whole API: the per-request knobs, auth, then the routes.
func (s *Server) handler() http.Handler {
	mux := s.routes()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		switch {
		case s.rateLimit > 0:
			s.rateLimit--
			s.mu.Unlock()
			w.Header().Set("Retry-After", "1")
			writeRaw(w, &apiError{status: http.StatusTooManyRequests, msg: "Too Many Requests"})
			return
		case s.fail != nil:
			f := s.fail
			s.fail = nil
			s.mu.Unlock()
			writeRaw(w, &apiError{status: f.status, msg: f.message})
			return
		}
		s.mu.Unlock()
		if !strings.HasPrefix(r.URL.Path, "/api2/json/") {
			writeRaw(w, errf(http.StatusNotImplemented, "Method '%s %s' not implemented", r.Method, r.URL.Path))
			return
		}
		// pveproxy answers a missing or wrong token 401 before it looks
		// at the path.
		if r.Header.Get("Authorization") != "PVEAPIToken="+s.TokenID()+"="+s.secret {
			writeRaw(w, errf(http.StatusUnauthorized, "authentication failure"))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// writeData writes the {"data": v} envelope.
func writeData(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json;charset=UTF-8")
	_ = json.NewEncoder(w).Encode(map[string]any{"data": v})
}

// writeRaw answers an error as pveproxy does: the first line of the
// message is the HTTP reason phrase, which net/http cannot set, so the
// response is written on the hijacked connection.
func writeRaw(w http.ResponseWriter, e *apiError) {
	body := map[string]any{"data": nil, "message": e.msg + "\n"}
	if e.params != nil {
		body["errors"] = e.params
	}
	b, _ := json.Marshal(body)
	reason, _, _ := strings.Cut(e.msg, "\n")
	if reason == "" {
		reason = http.StatusText(e.status)
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		w.Header().Set("Content-Type", "application/json;charset=UTF-8")
		w.WriteHeader(e.status)
		_, _ = w.Write(b)
		return
	}
	retry := w.Header().Get("Retry-After")
	conn, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer func() { _ = conn.Close() }()
	writeStatus(buf, e.status, reason, retry, b)
}

func writeStatus(buf *bufio.ReadWriter, status int, reason, retry string, body []byte) {
	// A reason phrase is one line of text: keep CR and LF out of it.
	reason = strings.NewReplacer("\r", " ", "\n", " ").Replace(reason)
	_, _ = fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\n", status, reason)
	_, _ = fmt.Fprintf(buf, "Content-Type: application/json;charset=UTF-8\r\nContent-Length: %d\r\nConnection: close\r\n", len(body))
	if retry != "" {
		_, _ = fmt.Fprintf(buf, "Retry-After: %s\r\n", retry)
	}
	_, _ = fmt.Fprintf(buf, "Date: %s\r\n\r\n", time.Now().UTC().Format(http.TimeFormat))
	_, _ = buf.Write(body)
	_ = buf.Flush()
}

// loseAnswer closes the connection without a byte of the answer.
func loseAnswer(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// newTaskLocked records a finished task and returns its UPID:
// UPID:node:pid:pstart:starttime:type:id:user: (hex fields, as pvedaemon
// writes them).
func (s *Server) newTaskLocked(node, typ, id string) string {
	s.pid++
	now := time.Now()
	upid := fmt.Sprintf("UPID:%s:%08X:%08X:%08X:%s:%s:%s:", node, s.pid, s.pid*7, now.Unix(), typ, id, s.TokenID())
	s.tasks[upid] = &task{upid: upid, node: node, typ: typ, id: id, start: now, exit: "OK"}
	return upid
}

// params reads a request's parameters as pveproxy does: the query string,
// then a form or JSON body; JSON numbers and booleans become their text.
func params(r *http.Request) (map[string]string, error) {
	out := map[string]string{}
	for k, v := range r.URL.Query() {
		out[k] = v[0]
	}
	if r.Body == nil || r.Method == http.MethodGet || r.Method == http.MethodDelete {
		return out, nil
	}
	ct := r.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "application/json"):
		var m map[string]any
		dec := json.NewDecoder(r.Body)
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil && err.Error() != "EOF" {
			return nil, err
		}
		for k, v := range m {
			switch x := v.(type) {
			case nil:
			case string:
				out[k] = x
			case json.Number:
				out[k] = x.String()
			case bool:
				out[k] = map[bool]string{true: "1", false: "0"}[x]
			default:
				b, _ := json.Marshal(x)
				out[k] = string(b)
			}
		}
	case strings.HasPrefix(ct, "multipart/form-data"):
		if err := r.ParseMultipartForm(32 << 20); err != nil {
			return nil, err
		}
		for k, v := range r.MultipartForm.Value {
			out[k] = v[0]
		}
	default:
		if err := r.ParseForm(); err != nil {
			return nil, err
		}
		for k, v := range r.PostForm {
			out[k] = v[0]
		}
	}
	return out, nil
}

// boolParam reads a PVE boolean (1/0, true/false, yes/no, on/off).
func boolParam(p map[string]string, k string) bool {
	switch strings.ToLower(p[k]) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}
