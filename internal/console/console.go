package console

import (
	"bytes"
	"cmp"
	"embed"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"github.com/a-h/templ"

	"github.com/better-compute/better-compute/client"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/store"
)

// Paths the console serves on the API listener: Path and everything under
// PathHome.
const (
	Path             = "/console"
	PathHome         = "/console/"
	PathSignIn       = "/console/sign-in"
	PathSignOut      = "/console/sign-out"
	PathOverview     = "/console/overview"
	PathReservations = "/console/reservations"
	pathAssets       = "/console/assets/"
)

// ContentSecurityPolicy is sent with every console response: scripts,
// styles and images only from the console's own assets, no inline script
// or style, no framing, forms post only back to the console.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// htmxConfig turns off what a strict CSP would refuse (htmx's injected
// indicator style, eval), keeps no page (with its CSRF token) in
// localStorage, and swaps error pages in like any other so the API's
// message and code are shown.
const htmxConfig = `{"includeIndicatorStyles":false,"allowEval":false,"allowScriptTags":false,` +
	`"historyCacheSize":0,"refreshOnHistoryMiss":true,` +
	`"responseHandling":[{"code":"204","swap":false},{"code":"...","swap":true}]}`

// MaxFormBytes caps a console form post; the largest is a pasted key.
const MaxFormBytes = 64 << 10

//go:embed assets
var assetsFS embed.FS

// Sealer seals the pasted API keys at rest (pki.Sealer).
type Sealer interface {
	Seal(ref string, plaintext []byte) ([]byte, error)
	Open(ref string, sealed []byte) ([]byte, error)
}

// Config wires a Console.
type Config struct {
	// API is the API listener's own handler, interceptors and all: every
	// console call goes through it with the viewer's key.
	API http.Handler
	DB  *store.DB
	// Sealer seals the keys sessions hold; nil (no BETTER_COMPUTE_SECRET)
	// refuses sign-in with a message saying so.
	Sealer Sealer
	Clock  clock.Clock
	Logger *slog.Logger
	// SessionTTL is how long a sign-in lasts; 8 hours when zero.
	SessionTTL time.Duration
	// OIDC offers sign-in with the API's OpenID provider; an empty Issuer
	// offers only the key form.
	OIDC OIDC
}

// Console serves the web console.
type Console struct {
	cfg    Config
	mux    *http.ServeMux
	assets http.Handler
	oidc   oidcClient
}

// New returns the console for cfg.
func New(cfg Config) (*Console, error) {
	if cfg.API == nil || cfg.DB == nil {
		return nil, errors.New("console: Config.API and DB are required")
	}
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.SessionTTL = cmp.Or(cfg.SessionTTL, 8*time.Hour)
	if cfg.SessionTTL < time.Minute {
		return nil, errors.New("console: SessionTTL must be at least a minute")
	}
	sub, err := fs.Sub(assetsFS, "assets")
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, mux: http.NewServeMux(), assets: http.StripPrefix(pathAssets, http.FileServerFS(sub))}
	c.mux.HandleFunc("GET /console", c.home)
	c.mux.HandleFunc("GET /console/{$}", c.home)
	c.mux.HandleFunc("GET "+PathSignIn, c.signInForm)
	c.mux.HandleFunc("POST "+PathSignIn, c.signIn)
	c.mux.HandleFunc("POST "+PathSignOut, c.action(c.signOut))
	c.mux.HandleFunc("GET "+PathOverview, c.page(c.overview))
	c.mux.HandleFunc("GET "+PathReservations, c.page(c.reservations))
	c.mux.HandleFunc("GET "+PathReservations+"/{id}", c.page(c.reservation))
	c.mux.HandleFunc("POST "+PathReservations+"/{id}/release", c.action(c.release))
	// The operator's pages (p-ops): nodes, pools and offers, sites, images,
	// the audit log, quotas.
	c.mux.HandleFunc("GET "+PathNodes, c.page(c.nodes))
	c.mux.HandleFunc("GET "+PathNodes+"/{id}", c.page(c.node))
	c.mux.HandleFunc("GET "+PathPools, c.page(c.pools))
	c.mux.HandleFunc("GET "+PathPools+"/{id}", c.page(c.pool))
	c.mux.HandleFunc("GET "+PathSites, c.page(c.sites))
	c.mux.HandleFunc("GET "+PathImages, c.page(c.images))
	c.mux.HandleFunc("GET "+PathAudit, c.page(c.audit))
	c.mux.HandleFunc("GET "+PathQuotas, c.page(c.quotas))
	// Tenant pages (p-tenant): the reservation form, its live preview and
	// create; usage; API keys; webhooks; instances and sandboxes.
	c.mux.HandleFunc("GET "+PathReservationNew, c.page(c.reserveNew))
	c.mux.HandleFunc("POST "+PathReservationPreview, c.action(c.reservePreview))
	c.mux.HandleFunc("POST "+PathReservations, c.action(c.reserve))
	c.mux.HandleFunc("GET "+PathUsage, c.page(c.usage))
	c.mux.HandleFunc("GET "+PathAPIKeys, c.page(c.apiKeys))
	c.mux.HandleFunc("POST "+PathAPIKeys, c.action(c.createAPIKey))
	c.mux.HandleFunc("POST "+PathAPIKeys+"/{id}/revoke", c.action(c.revokeAPIKey))
	c.mux.HandleFunc("GET "+PathWebhooks, c.page(c.webhooks))
	c.mux.HandleFunc("POST "+PathWebhooks, c.action(c.createWebhook))
	c.mux.HandleFunc("POST "+PathWebhooks+"/{id}/test", c.action(c.testWebhook))
	c.mux.HandleFunc("POST "+PathWebhooks+"/{id}/rotate", c.action(c.rotateWebhook))
	c.mux.HandleFunc("POST "+PathWebhooks+"/{id}/delete", c.action(c.deleteWebhook))
	c.mux.HandleFunc("GET "+PathInstances, c.page(c.instances))
	c.mux.HandleFunc("POST "+PathInstances, c.action(c.createInstance))
	c.mux.HandleFunc("GET "+PathInstances+"/{id}", c.page(c.instance))
	c.mux.HandleFunc("POST "+PathInstances+"/{id}/stop", c.action(c.instanceAction("stop")))
	c.mux.HandleFunc("POST "+PathInstances+"/{id}/start", c.action(c.instanceAction("start")))
	c.mux.HandleFunc("POST "+PathInstances+"/{id}/delete", c.action(c.instanceAction("delete")))
	c.mux.HandleFunc("GET "+PathSandboxes, c.page(c.sandboxes))
	c.mux.HandleFunc("POST "+PathSandboxes, c.action(c.createSandbox))
	c.mux.HandleFunc("GET "+PathSandboxes+"/{id}", c.page(c.sandbox))
	c.mux.HandleFunc("POST "+PathSandboxes+"/{id}/delete", c.action(c.deleteSandbox))
	// Live updates, machines, confirmations and OIDC sign-in (p-live).
	c.mux.HandleFunc("GET "+PathLive, c.page(c.live))
	c.mux.HandleFunc("GET "+PathMachines, c.page(c.machines))
	c.mux.HandleFunc("GET "+PathMachines+"/{id}", c.page(c.machine))
	c.mux.HandleFunc("POST "+PathMachines+"/{id}/{action}", c.action(c.machineAction))
	c.mux.HandleFunc("GET "+PathConfirmations, c.page(c.confirmations))
	c.mux.HandleFunc("POST "+PathConfirmations+"/{id}/approve", c.action(c.approveConfirmation))
	if cfg.OIDC.Issuer != "" {
		c.mux.HandleFunc("GET "+PathOIDCStart, c.oidcStart)
		c.mux.HandleFunc("GET "+PathOIDCCallback, c.oidcCallback)
	}
	// The events page (p-events): the outbox's stored events.
	c.mux.HandleFunc("GET "+PathEvents, c.page(c.events))
	c.mux.HandleFunc("GET "+pathAssets+"{file}", c.asset)
	c.mux.HandleFunc("/console/", c.notFound)
	return c, nil
}

// ServeHTTP sets the security headers on every response, then routes.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if r.Method == http.MethodPost {
		// A post from another site is refused before its token is read
		// (SameSite=Strict already keeps the cookie off it).
		if !sameOrigin(r) {
			c.fail(w, r, nil, http.StatusForbidden, apiError{Code: "CSRF_REFUSED", Message: "the form was posted from another site"})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxFormBytes)
	}
	c.mux.ServeHTTP(w, r)
}

// sameOrigin reports whether a post came from the console's own pages, by
// Sec-Fetch-Site and Origin where the browser sends them.
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	if o == "null" {
		// Under Referrer-Policy: no-referrer a browser's plain form post
		// says Origin: null; Sec-Fetch-Site then tells where it came from.
		return r.Header.Get("Sec-Fetch-Site") == "same-origin"
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

func (c *Console) asset(w http.ResponseWriter, r *http.Request) {
	// The files change only with the binary.
	w.Header().Set("Cache-Control", "public, max-age=3600")
	c.assets.ServeHTTP(w, r)
}

func (c *Console) home(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, PathOverview, http.StatusSeeOther)
}

func (c *Console) notFound(w http.ResponseWriter, r *http.Request) {
	c.fail(w, r, nil, http.StatusNotFound, apiError{Code: "NOT_FOUND", Message: "the console has no page at " + r.URL.Path})
}

// apiError is what a page shows of a refusal: the API's message and its
// stable machine code.
type apiError struct {
	Code    string
	Message string
}

func apiErrorOf(err error) apiError {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return apiError{Code: client.Code(err), Message: ce.Message()}
	}
	return apiError{Code: "INTERNAL", Message: err.Error()}
}

// httpStatus is the status a page answers for an API refusal.
func httpStatus(err error) int {
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeFailedPrecondition, connect.CodeAborted, connect.CodeAlreadyExists:
		return http.StatusConflict
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	default:
		return http.StatusInternalServerError
	}
}

// page is what layout needs of every page.
type page struct {
	Title  string
	Nav    string
	Viewer *viewer
	CSRF   string
	Notice string
	Err    *apiError
}

const (
	navOverview     = "overview"
	navReservations = "reservations"
)

// fail answers an error page; s is the session when there is one.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, status int, e apiError) {
	p := page{Title: http.StatusText(status), Err: &e}
	if s != nil {
		p.Viewer, p.CSRF = &s.viewer, s.row.CSRFToken
	}
	c.render(w, r, status, errorPage(p))
}

// render writes a component whole, so a template error is a clean 500
// rather than half a page.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, comp templ.Component) {
	var buf bytes.Buffer
	if err := comp.Render(r.Context(), &buf); err != nil {
		c.cfg.Logger.Error("console: render", "path", r.URL.Path, "err", err)
		http.Error(w, "the page could not be drawn", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	// Pages hold the viewer's data and a CSRF token: never cached.
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// htmxFile is the vendored htmx build (assets/VENDORED.md pins it).
const htmxFile = "htmx-2.0.11.min.js"

func assetURL(name string) string { return pathAssets + name }

func itoa(n int32) string { return strconv.Itoa(int(n)) }
