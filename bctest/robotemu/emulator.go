// Package robotemu is an in-process Hetzner Robot webservice for provider
// tests: the server list and names, rescue activation, resets (power on,
// off and reboot among them), the SSH key store and the server product
// catalog, over HTTP with basic auth, form-encoded bodies and Robot's JSON
// answers and errors; and one SSH endpoint that stands in for every
// server's rescue system, accepting a rescue's one-time password and
// recording each command it runs and that command's stdin.
//
// It holds a fleet of servers that exist already, unnamed: a Robot provider
// claims one by naming it, as it cannot order machines on demand. It must
// never be imported outside tests (the reporules say so for bctest).
package robotemu

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

// Options shape an emulator; the zero value is a 40-server account.
type Options struct {
	// User and Password are the webservice login (defaults: a generated
	// pair).
	User, Password string
	// Servers is how many servers the account holds (default 40): the
	// first three quarters are GEX44 in FSN1-DC14, the rest EX44 in
	// HEL1-DC2.
	Servers int
	// Named gives servers a name before the test starts (server number →
	// name): machines an operator uses for something else, which a
	// provider must never claim.
	Named map[int]string
	// PageSize is what PageSize reports (default 10): Robot does not page,
	// and the suite creates PageSize+2 servers to see that List returns
	// them all.
	PageSize int
	// Disks are the block devices every rescue system lists (default two
	// NVMe drives).
	Disks []string
	// Images are the installimage images the rescue systems hold (default
	// Ubuntu 24.04 and Debian 12 base images).
	Images []string
}

// FirstServerNumber is the first server's number; the rest follow.
const FirstServerNumber = 100001

// Exec is one command a rescue system ran.
type Exec struct {
	Command string
	Stdin   string
	Exit    int
}

// Request is one webservice request as it arrived.
type Request struct {
	Method string
	Path   string
	// Query and Body are the raw query string and form body.
	Query string
	Body  string
}

// State is a server's state as a test reads it.
type State struct {
	Number       int
	Name         string
	Product      string
	DC           string
	On           bool
	RescueActive bool
	// InRescue: the running system is the rescue system.
	InRescue bool
	// Image and Hostname are what installimage last wrote.
	Image    string
	Hostname string
	// PostInstall is the post-install script installimage last ran.
	PostInstall string
	Resets      []string
}

type rescue struct {
	password string
	keys     []string // fingerprints
}

type server struct {
	number      int
	ip, ipv6    string
	name        string
	initialName string
	product, dc string
	on          bool
	rescue      *rescue
	// bootedRescue is the password of the rescue system running now, ""
	// while the installed system (or nothing) runs.
	bootedRescue string
	files        map[string]string
	executable   map[string]bool
	image        string
	hostname     string
	postInstall  string
	execs        []Exec
	resets       []string
}

type key struct {
	name, fingerprint, typ, data string
	size                         int
}

// Emulator is one Robot account.
type Emulator struct {
	opts    Options
	http    *httptest.Server
	sshLn   net.Listener
	sshCfg  *ssh.ServerConfig
	hostKey ssh.PublicKey
	wg      sync.WaitGroup

	mu         sync.Mutex
	servers    []*server
	keys       []key
	requests   []Request
	rateLimit  int
	loseCreate bool
	stealClaim bool
	fail       []failure
}

type failure struct {
	status int
	body   string
}

// New starts an emulator; it stops when the test ends.
func New(t testing.TB, opts Options) *Emulator {
	t.Helper()
	e, err := Start(opts)
	if err != nil {
		t.Fatalf("robotemu: %v", err)
	}
	t.Cleanup(e.Close)
	return e
}

// Start starts an emulator; Close stops it.
func Start(opts Options) (*Emulator, error) {
	if opts.User == "" {
		opts.User = "#ws+" + randomString(8)
	}
	if opts.Password == "" {
		opts.Password = randomString(24)
	}
	if opts.Servers == 0 {
		opts.Servers = 40
	}
	if opts.PageSize == 0 {
		opts.PageSize = 10
	}
	if len(opts.Disks) == 0 {
		opts.Disks = []string{"/dev/nvme0n1", "/dev/nvme1n1"}
	}
	if len(opts.Images) == 0 {
		opts.Images = []string{"Ubuntu-2404-noble-amd64-base", "Debian-1208-bookworm-amd64-base"}
	}
	e := &Emulator{opts: opts}
	for i := range opts.Servers {
		s := &server{
			number:  FirstServerNumber + i,
			ip:      fmt.Sprintf("198.51.%d.%d", 100+i/250, 1+i%250),
			ipv6:    fmt.Sprintf("2a01:4f8:10a:%x::", 0x1000+i),
			product: "GEX44",
			dc:      "FSN1-DC14",
			on:      true,
		}
		if i >= opts.Servers*3/4 {
			s.product, s.dc = "EX44", "HEL1-DC2"
		}
		s.name = opts.Named[s.number]
		s.initialName = s.name
		e.servers = append(e.servers, s)
	}
	if err := e.startSSH(); err != nil {
		return nil, err
	}
	e.http = httptest.NewServer(e.routes())
	return e, nil
}

// Close stops the webservice and the rescue SSH endpoint.
func (e *Emulator) Close() {
	e.http.Close()
	_ = e.sshLn.Close()
	e.wg.Wait()
}

// URL is the webservice's base URL (a provider's Config.Endpoint).
func (e *Emulator) URL() string { return e.http.URL }

// SSHAddr is the one address every rescue system answers SSH on; the
// rescue is told apart by its one-time password, as the real ones are by
// their servers' addresses.
func (e *Emulator) SSHAddr() string { return e.sshLn.Addr().String() }

// User and Password are the webservice login.
func (e *Emulator) User() string     { return e.opts.User }
func (e *Emulator) Password() string { return e.opts.Password }

// Servers counts the servers claimed since the start: those whose name is
// no longer the one they started with.
func (e *Emulator) Servers() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, s := range e.servers {
		if s.name != s.initialName {
			n++
		}
	}
	return n
}

// Offers counts the catalog's offers: one per product and location.
func (e *Emulator) Offers() int {
	n := 0
	for _, p := range catalog {
		n += len(p.prices)
	}
	return n
}

// PageSize is Options.PageSize (Robot itself does not page).
func (e *Emulator) PageSize() int { return e.opts.PageSize }

// RateLimitNext makes the next n requests answer Robot's rate limit: 403
// RATE_LIMIT_EXCEEDED with max_request and interval.
func (e *Emulator) RateLimitNext(n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rateLimit += n
}

// LoseNextCreate makes the next claim (a POST /server/{number} that names
// a server) take effect and its answer lost: the connection closes before
// a byte of it.
func (e *Emulator) LoseNextCreate() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.loseCreate = true
}

// StealNextClaim makes another claimer win the next claim: right after it
// takes effect, the server is renamed "claimed-elsewhere", as if a second
// control plane's write had landed after it.
func (e *Emulator) StealNextClaim() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stealClaim = true
}

// FailNext makes the next request answer status with Robot's error body,
// whose message includes body.
func (e *Emulator) FailNext(status int, body string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fail = append(e.fail, failure{status, body})
}

// Secrets are the webservice password and user.
func (e *Emulator) Secrets() []string { return []string{e.opts.Password, e.opts.User} }

// Requests lists every webservice request so far.
func (e *Emulator) Requests() []Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.requests)
}

// Execs lists the commands server number's rescue systems ran.
func (e *Emulator) Execs(number int) []Exec {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s := e.serverLocked(number); s != nil {
		return slices.Clone(s.execs)
	}
	return nil
}

// StdinOf is everything server number's rescue systems read on the stdin
// of their commands, in order.
func (e *Emulator) StdinOf(number int) string {
	var b strings.Builder
	for _, x := range e.Execs(number) {
		b.WriteString(x.Stdin)
	}
	return b.String()
}

// RescuePasswords lists the rescue passwords handed out so far (secrets a
// test looks for in logs and errors).
func (e *Emulator) RescuePasswords() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, s := range e.servers {
		if s.rescue != nil {
			out = append(out, s.rescue.password)
		}
		if s.bootedRescue != "" {
			out = append(out, s.bootedRescue)
		}
	}
	return out
}

// Server is server number's state.
func (e *Emulator) Server(number int) (State, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.serverLocked(number)
	if s == nil {
		return State{}, false
	}
	return State{
		Number: s.number, Name: s.name, Product: s.product, DC: s.dc, On: s.on,
		RescueActive: s.rescue != nil, InRescue: s.on && s.bootedRescue != "",
		Image: s.image, Hostname: s.hostname, PostInstall: s.postInstall,
		Resets: slices.Clone(s.resets),
	}, true
}

// ServerNamed finds the server named name.
func (e *Emulator) ServerNamed(name string) (State, bool) {
	e.mu.Lock()
	var number int
	for _, s := range e.servers {
		if s.name == name {
			number = s.number
		}
	}
	e.mu.Unlock()
	return e.Server(number)
}

func (e *Emulator) serverLocked(number int) *server {
	i := number - FirstServerNumber
	if i < 0 || i >= len(e.servers) {
		return nil
	}
	return e.servers[i]
}

// bootLocked starts s: into an active rescue system (which Robot then
// deactivates: an activation is good for one boot), else into what is
// installed.
func (s *server) bootLocked() {
	s.on = true
	s.files, s.executable = map[string]string{}, map[string]bool{}
	s.bootedRescue = ""
	if s.rescue != nil {
		s.bootedRescue = s.rescue.password
		s.rescue = nil
	}
}

func (s *server) powerOffLocked() {
	s.on = false
	s.bootedRescue = ""
	s.files, s.executable = nil, nil
}

func randomString(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)[:n]
}

func newHostKey() (ssh.Signer, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return ssh.NewSignerFromKey(priv)
}
