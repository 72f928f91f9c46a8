// Package hcloudemu is an in-process Hetzner Cloud API for tests: the v1
// JSON API over HTTP (servers with their actions, server types with prices
// per location, locations, datacenters, images, SSH keys, networks and
// /pricing), with Hetzner's error bodies, its pagination (meta.pagination)
// and its label selectors. The official Go client (hcloud-go) and
// Debian's hcloud CLI drive it unchanged.
//
// Time in the emulator is event-driven, not clock-driven: an action
// answers "running" when it is made and "success" the first time anyone
// reads it (or its server), so a client that waits on actions sees them
// finish without the emulator ever sleeping.
//
// It plays the failures a provider must survive (rate limits, a create
// whose answer is lost, injected errors) and implements the provider
// conformance suite's Emulator. Nothing outside tests and bctest may
// import it, and it never logs the token or a server's user data.
package hcloudemu

import (
	"crypto/rand"
	"encoding/hex"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"
)

// DefaultPageSize is the most items one page of a listing holds, whatever
// per_page asks: small, so that clients must follow meta.pagination.
const DefaultPageSize = 5

// Server is one emulated Hetzner Cloud project behind an HTTP endpoint.
type Server struct {
	ts    *httptest.Server
	token string

	mu          sync.Mutex
	pageSize    int
	nextID      int64
	servers     map[int64]*server
	actions     map[int64]*action
	sshKeys     map[int64]*sshKey
	networks    map[int64]*network
	rateLimited int
	failures    []failure
	loseCreate  bool
	requests    int
}

type failure struct {
	status int
	body   string
}

// server is one server of the project.
type server struct {
	id         int64
	name       string
	status     string
	created    time.Time
	serverType string
	location   string
	image      int64
	labels     map[string]string
	userData   string
	sshKeys    []int64
	networks   []int64
	ipv4       string
	ipv6       string
}

// action is one asynchronous operation; finish is the server status it
// leaves behind ("" leaves it as it is).
type action struct {
	id       int64
	command  string
	status   string
	started  time.Time
	finished time.Time
	serverID int64
	finish   string
}

type sshKey struct {
	id          int64
	name        string
	publicKey   string
	fingerprint string
	labels      map[string]string
	created     time.Time
}

type network struct {
	id      int64
	name    string
	ipRange string
	created time.Time
}

// ServerState is a copy of one server as the emulator holds it, for tests
// to check what a client sent (labels, user data).
type ServerState struct {
	ID         int64
	Name       string
	Status     string
	ServerType string
	Location   string
	Image      string
	Labels     map[string]string
	UserData   string
	SSHKeys    []int64
	Networks   []int64
}

// New starts an emulator that lives as long as the test.
func New(t testing.TB) *Server {
	t.Helper()
	s := &Server{
		token:    randomToken(),
		pageSize: DefaultPageSize,
		nextID:   100000,
		servers:  map[int64]*server{},
		actions:  map[int64]*action{},
		sshKeys:  map[int64]*sshKey{},
		networks: map[int64]*network{},
	}
	s.ts = httptest.NewServer(s.handler())
	t.Cleanup(s.ts.Close)
	return s
}

// randomToken is shaped like a Hetzner API token: 64 letters and digits.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// URL is the emulator's base URL; the API lives under URL()+"/v1".
func (s *Server) URL() string { return s.ts.URL }

// Endpoint is the API's URL, what hcloud clients take as their endpoint
// (hcloud-go's WithEndpoint, the CLI's HCLOUD_ENDPOINT).
func (s *Server) Endpoint() string { return s.ts.URL + "/v1" }

// Token is the project's API token (sent as "Authorization: Bearer").
func (s *Server) Token() string { return s.token }

// Secrets are the credentials the project was made with.
func (s *Server) Secrets() []string { return []string{s.token} }

// Servers counts the project's servers.
func (s *Server) Servers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.servers)
}

// Offers counts the catalog's (server type, location) prices.
func (s *Server) Offers() int {
	n := 0
	for _, st := range catalogServerTypes {
		n += len(st.prices)
	}
	return n
}

// PageSize is the most items a page of a listing holds.
func (s *Server) PageSize() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pageSize
}

// SetPageSize changes PageSize (at least 1).
func (s *Server) SetPageSize(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pageSize = max(n, 1)
}

// Requests counts the API requests answered so far, failures included.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// RateLimitNext makes the next n requests answer 429 rate_limit_exceeded
// with the RateLimit-* headers.
func (s *Server) RateLimitNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rateLimited += n
}

// LoseNextCreate makes the next successful server create take effect and
// then close the connection before a byte of its answer.
func (s *Server) LoseNextCreate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseCreate = true
}

// FailNext makes the next request answer status with Hetzner's error body
// (the code that goes with the status), whose message includes body.
func (s *Server) FailNext(status int, body string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, failure{status: status, body: body})
}

// AddSSHKey adds an SSH key to the project and returns its id.
func (s *Server) AddSSHKey(name, publicKey string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := &sshKey{id: s.newIDLocked(), name: name, publicKey: publicKey, fingerprint: fingerprint(publicKey), labels: map[string]string{}, created: time.Now().UTC()}
	s.sshKeys[k.id] = k
	return k.id
}

// AddNetwork adds a private network (ipRange a CIDR such as 10.0.0.0/16)
// and returns its id.
func (s *Server) AddNetwork(name, ipRange string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := &network{id: s.newIDLocked(), name: name, ipRange: ipRange, created: time.Now().UTC()}
	s.networks[n.id] = n
	return n.id
}

// Find returns the server named name.
func (s *Server) Find(name string) (ServerState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, srv := range s.servers {
		if srv.name == name {
			st := ServerState{
				ID: srv.id, Name: srv.name, Status: srv.status, ServerType: srv.serverType,
				Location: srv.location, Labels: map[string]string{}, UserData: srv.userData,
				SSHKeys: append([]int64(nil), srv.sshKeys...), Networks: append([]int64(nil), srv.networks...),
			}
			if img, ok := imageByID(srv.image); ok {
				st.Image = img.name
			}
			for k, v := range srv.labels {
				st.Labels[k] = v
			}
			return st, true
		}
	}
	return ServerState{}, false
}

func (s *Server) newIDLocked() int64 {
	s.nextID++
	return s.nextID
}

// sortedServersLocked lists the servers by id, the API's default order.
func (s *Server) sortedServersLocked() []*server {
	out := make([]*server, 0, len(s.servers))
	for _, srv := range s.servers {
		out = append(out, srv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// newActionLocked records a running action on a server.
func (s *Server) newActionLocked(command string, serverID int64, finish string) *action {
	a := &action{id: s.newIDLocked(), command: command, status: "running", started: time.Now().UTC(), serverID: serverID, finish: finish}
	s.actions[a.id] = a
	return a
}

// finishLocked completes a running action: it is read, so from the
// client's view its time has passed. A server's actions run in order, so
// the earlier running ones of its server finish first.
func (s *Server) finishLocked(a *action) {
	if a.status != "running" {
		return
	}
	var earlier []*action
	for _, b := range s.actions {
		if b.serverID == a.serverID && b.id < a.id && b.status == "running" {
			earlier = append(earlier, b)
		}
	}
	sortByID(earlier, func(b *action) int64 { return b.id })
	for _, b := range append(earlier, a) {
		b.status = "success"
		b.finished = time.Now().UTC()
		if srv, ok := s.servers[b.serverID]; ok && b.finish != "" {
			srv.status = b.finish
		}
	}
}

// settleServerLocked finishes the running actions of a server being read.
func (s *Server) settleServerLocked(id int64) {
	var last *action
	for _, a := range s.actions {
		if a.serverID == id && a.status == "running" && (last == nil || a.id > last.id) {
			last = a
		}
	}
	if last != nil {
		s.finishLocked(last)
	}
}
