package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// Cookies. Both are HttpOnly, SameSite=Strict, scoped to /console, and
// Secure when the request came over TLS.
const (
	// SessionCookie holds the session token; the database keeps only its
	// SHA-256.
	SessionCookie = "bc_console"
	// signInCookie holds the token the sign-in form must echo: there is no
	// session yet to hold a CSRF token.
	signInCookie = "bc_console_signin"
	// csrfField is the form field every POST carries.
	csrfField = "csrf"
)

// viewer is who a session acts as, as WhoAmI tells it on each request.
type viewer struct {
	PrincipalID string
	Kind        string
	Name        string
	Role        string
	TenantID    string
	TenantName  string
}

// mayAct reports whether the viewer's role may change anything the console
// offers; a viewer sees no action buttons. It only hides buttons: the API
// decides every action.
func (v *viewer) mayAct() bool { return v != nil && v.Role != string(iam.RoleViewer) }

// session is a signed-in request's session: its row, the opened key, the
// viewer and the API client acting as them.
type session struct {
	row    sessionRow
	viewer viewer
	api    *client.Client
}

func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// sealRef binds a sealed key to its row.
func sealRef(idHash string) string { return "console_sessions/" + idHash }

func tokensEqual(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, name, value string, expires time.Time) {
	ck := &http.Cookie{Name: name, Value: value, Path: "/console", HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode}
	if value == "" {
		ck.MaxAge = -1
	} else {
		ck.Expires = expires
	}
	http.SetCookie(w, ck)
}

// errNoSession: no cookie, or one naming no live session.
var errNoSession = errors.New("console: not signed in")

// errSessionEnded: the cookie named a session that expired or whose key
// the API no longer accepts; it was deleted.
var errSessionEnded = errors.New("console: session ended")

// loadSession returns the request's session, checking its key with the API
// (a revoked key ends the session at once).
func (c *Console) loadSession(r *http.Request) (*session, error) {
	ck, err := r.Cookie(SessionCookie)
	if err != nil || ck.Value == "" {
		return nil, errNoSession
	}
	ctx := r.Context()
	idHash := hashToken(ck.Value)
	var row sessionRow
	err = c.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		row, err = sessionGet(ctx, tx, idHash)
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return nil, errSessionEnded
	}
	if err != nil {
		return nil, err
	}
	end := func() (*session, error) {
		if err := c.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error { return sessionDelete(ctx, tx, idHash) }); err != nil {
			return nil, err
		}
		return nil, errSessionEnded
	}
	if !c.cfg.Clock.Now().Before(row.ExpireTime) || c.cfg.Sealer == nil {
		return end()
	}
	key, err := c.cfg.Sealer.Open(sealRef(idHash), row.APIKey)
	if err != nil {
		// Sealed under a secret this server no longer has: sign in again.
		c.cfg.Logger.Info("console: a session's key does not open; ending it", "err", err)
		return end()
	}
	api := c.apiClient(r, string(key))
	who, err := api.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	if connect.CodeOf(err) == connect.CodeUnauthenticated {
		return end()
	}
	if err != nil {
		return nil, err
	}
	return &session{row: row, viewer: viewerOf(who.Msg), api: api}, nil
}

func viewerOf(w *apiv1.WhoAmIResponse) viewer {
	return viewer{PrincipalID: w.GetPrincipalId(), Kind: w.GetKind(), Name: w.GetName(), Role: w.GetRole(),
		TenantID: w.GetTenantId(), TenantName: w.GetTenantName()}
}

// page wraps a GET handler that needs a session: without one it sends the
// browser to sign in.
func (c *Console) page(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, err := c.loadSession(r)
		switch {
		case errors.Is(err, errNoSession):
			http.Redirect(w, r, PathSignIn, http.StatusSeeOther)
		case errors.Is(err, errSessionEnded):
			c.setCookie(w, r, SessionCookie, "", time.Time{})
			http.Redirect(w, r, PathSignIn+"?ended=1", http.StatusSeeOther)
		case err != nil:
			c.fail(w, r, nil, httpStatus(err), apiErrorOf(err))
		default:
			h(w, r, s)
		}
	}
}

// action wraps a POST handler: it needs a session and the session's CSRF
// token in the form, else 403 before anything is called.
func (c *Console) action(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, nil, http.StatusBadRequest, apiError{Code: "INVALID_ARGUMENT", Message: "the form could not be read: " + err.Error()})
			return
		}
		s, err := c.loadSession(r)
		switch {
		case errors.Is(err, errNoSession), errors.Is(err, errSessionEnded):
			c.setCookie(w, r, SessionCookie, "", time.Time{})
			c.fail(w, r, nil, http.StatusForbidden, apiError{Code: "CSRF_REFUSED", Message: "no console session: sign in and send the form again"})
			return
		case err != nil:
			c.fail(w, r, nil, httpStatus(err), apiErrorOf(err))
			return
		}
		if !tokensEqual(r.PostForm.Get(csrfField), s.row.CSRFToken) {
			c.fail(w, r, s, http.StatusForbidden, apiError{Code: "CSRF_REFUSED", Message: "the form's CSRF token is missing or not this session's: reload the page and try again"})
			return
		}
		h(w, r, s)
	}
}

func (c *Console) signInForm(w http.ResponseWriter, r *http.Request) {
	if _, err := c.loadSession(r); err == nil {
		http.Redirect(w, r, PathOverview, http.StatusSeeOther)
		return
	}
	p := page{Title: "Sign in"}
	if r.URL.Query().Get("ended") != "" {
		p.Notice = "Your session ended (it expired, you signed out, or the key was revoked): sign in again."
	}
	c.renderSignIn(w, r, http.StatusOK, p)
}

// renderSignIn draws the sign-in form with a fresh sign-in token.
func (c *Console) renderSignIn(w http.ResponseWriter, r *http.Request, status int, p page) {
	token := randomToken()
	c.setCookie(w, r, SessionCookie, "", time.Time{})
	c.setCookie(w, r, signInCookie, token, c.cfg.Clock.Now().Add(time.Hour))
	c.render(w, r, status, signInPage(p, token, c.cfg.Sealer != nil, c.cfg.OIDC.Issuer))
}

func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, nil, http.StatusBadRequest, apiError{Code: "INVALID_ARGUMENT", Message: "the form could not be read: " + err.Error()})
		return
	}
	ck, err := r.Cookie(signInCookie)
	if err != nil || !tokensEqual(r.PostForm.Get(csrfField), ck.Value) {
		c.fail(w, r, nil, http.StatusForbidden, apiError{Code: "CSRF_REFUSED", Message: "the sign-in form's token is missing or stale: reload the sign-in page"})
		return
	}
	p := page{Title: "Sign in"}
	if c.cfg.Sealer == nil {
		p.Err = &apiError{Code: "FAILED_PRECONDITION", Message: "the console needs BETTER_COMPUTE_SECRET to keep keys sealed"}
		c.renderSignIn(w, r, http.StatusConflict, p)
		return
	}
	key := strings.TrimSpace(r.PostForm.Get("api_key"))
	if key == "" {
		p.Err = &apiError{Code: "INVALID_ARGUMENT", Message: "api_key: paste an API key (bc_…)"}
		c.renderSignIn(w, r, http.StatusBadRequest, p)
		return
	}
	ctx := r.Context()
	who, err := c.apiClient(r, key).Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	if err != nil {
		e := apiErrorOf(err)
		p.Err = &e
		c.renderSignIn(w, r, httpStatus(err), p)
		return
	}
	switch {
	case who.Msg.GetAuthenticatedBy() != "api-key":
		p.Err = &apiError{Code: "INVALID_ARGUMENT", Message: "api_key: the console signs in with an API key (bc_…), not a " + who.Msg.GetAuthenticatedBy() + " token"}
		c.renderSignIn(w, r, http.StatusBadRequest, p)
		return
	case who.Msg.GetKind() == string(iam.KindAgent):
		p.Err = &apiError{Code: "PERMISSION_DENIED", Message: "api_key: " + who.Msg.GetPrincipalId() + " is an agent's key; the console is for people (a user or service key)"}
		c.renderSignIn(w, r, http.StatusForbidden, p)
		return
	}
	token := randomToken()
	idHash := hashToken(token)
	sealed, err := c.cfg.Sealer.Seal(sealRef(idHash), []byte(key))
	if err != nil {
		c.fail(w, r, nil, http.StatusInternalServerError, apiError{Code: "INTERNAL", Message: "the key could not be sealed"})
		c.cfg.Logger.Error("console: seal a session key", "err", err)
		return
	}
	now := c.cfg.Clock.Now()
	row := sessionRow{IDHash: idHash, APIKey: sealed, PrincipalID: who.Msg.GetPrincipalId(), CSRFToken: randomToken(),
		CreateTime: now, ExpireTime: now.Add(c.cfg.SessionTTL)}
	// A sign-in replaces the browser's earlier session, if any (no two
	// live sessions for one cookie jar), and sweeps the expired ones.
	var previous string
	if ck, err := r.Cookie(SessionCookie); err == nil && ck.Value != "" {
		previous = hashToken(ck.Value)
	}
	err = c.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := sessionDeleteExpired(ctx, tx, now); err != nil {
			return err
		}
		if previous != "" {
			if err := sessionDelete(ctx, tx, previous); err != nil {
				return err
			}
		}
		return sessionInsert(ctx, tx, &row)
	})
	if err != nil {
		c.fail(w, r, nil, http.StatusInternalServerError, apiError{Code: "INTERNAL", Message: "the session could not be stored"})
		c.cfg.Logger.Error("console: store a session", "err", err)
		return
	}
	c.setCookie(w, r, signInCookie, "", time.Time{})
	c.setCookie(w, r, SessionCookie, token, row.ExpireTime)
	http.Redirect(w, r, PathOverview, http.StatusSeeOther)
}

func (c *Console) signOut(w http.ResponseWriter, r *http.Request, s *session) {
	err := c.cfg.DB.Write(r.Context(), func(ctx context.Context, tx store.Tx) error { return sessionDelete(ctx, tx, s.row.IDHash) })
	if err != nil {
		c.fail(w, r, s, http.StatusInternalServerError, apiError{Code: "INTERNAL", Message: "the session could not be ended"})
		c.cfg.Logger.Error("console: end a session", "err", err)
		return
	}
	c.setCookie(w, r, SessionCookie, "", time.Time{})
	http.Redirect(w, r, PathSignIn+"?ended=1", http.StatusSeeOther)
}
