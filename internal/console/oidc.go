package console

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/store"
)

// Paths of the OIDC sign-in: the start sends the browser to the issuer,
// which sends it back to the callback with a code.
const (
	PathOIDCStart    = "/console/sign-in/oidc"
	PathOIDCCallback = "/console/sign-in/oidc/callback"
)

// oidcCookie holds the state, nonce and PKCE verifier of a sign-in in
// flight. SameSite=Lax: the issuer's redirect back is a cross-site
// top-level GET, which a Strict cookie would not ride.
const oidcCookie = "bc_console_oidc"

// oidcFlowTTL bounds how long a person may take at the issuer.
const oidcFlowTTL = 10 * time.Minute

// OIDC configures the console's sign-in with the API's OpenID provider:
// the same issuer and client id the API verifies ID tokens with. The
// console is a public client (authorization code with PKCE, no secret);
// the issuer must allow its redirect URI, https://HOST/console/sign-in/oidc/callback.
type OIDC struct {
	Issuer   string
	ClientID string
}

// oidcClient is the provider, discovered on first use (the issuer may be
// down when serve starts, as for the API's verifier).
type oidcClient struct {
	mu       sync.Mutex
	provider *oidc.Provider
}

func (c *Console) oidcProvider(ctx context.Context) (*oidc.Provider, error) {
	c.oidc.mu.Lock()
	defer c.oidc.mu.Unlock()
	if c.oidc.provider != nil {
		return c.oidc.provider, nil
	}
	p, err := oidc.NewProvider(ctx, c.cfg.OIDC.Issuer)
	if err != nil {
		return nil, err
	}
	c.oidc.provider = p
	return p, nil
}

// oauthConfig is the authorization code flow's configuration; the
// redirect URI is this request's host, as the browser reached it.
func (c *Console) oauthConfig(r *http.Request, p *oidc.Provider) *oauth2.Config {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	// A public client names itself in the form, with no secret.
	ep := p.Endpoint()
	ep.AuthStyle = oauth2.AuthStyleInParams
	return &oauth2.Config{ClientID: c.cfg.OIDC.ClientID, Endpoint: ep,
		RedirectURL: scheme + "://" + r.Host + PathOIDCCallback, Scopes: []string{oidc.ScopeOpenID, "profile", "email"}}
}

func (c *Console) oidcFail(w http.ResponseWriter, r *http.Request, status int, e apiError) {
	c.setOIDCCookie(w, r, "", time.Time{})
	p := page{Title: "Sign in", Err: &e}
	c.renderSignIn(w, r, status, p)
}

func (c *Console) setOIDCCookie(w http.ResponseWriter, r *http.Request, value string, expires time.Time) {
	ck := &http.Cookie{Name: oidcCookie, Value: value, Path: PathOIDCCallback, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode}
	if value == "" {
		ck.MaxAge = -1
	} else {
		ck.Expires = expires
	}
	http.SetCookie(w, ck)
}

// oidcStart sends the browser to the issuer with a fresh state, nonce and
// PKCE (S256) challenge, keeping all three in a cookie for the callback.
func (c *Console) oidcStart(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Sealer == nil {
		c.oidcFail(w, r, http.StatusConflict, apiError{Code: "FAILED_PRECONDITION", Message: "the console needs BETTER_COMPUTE_SECRET to keep tokens sealed"})
		return
	}
	p, err := c.oidcProvider(r.Context())
	if err != nil {
		c.cfg.Logger.Warn("console: OIDC discovery", "issuer", c.cfg.OIDC.Issuer, "err", err)
		c.oidcFail(w, r, http.StatusBadGateway, apiError{Code: "UNAVAILABLE", Message: "the sign-in provider " + c.cfg.OIDC.Issuer + " could not be reached: try again, or paste an API key"})
		return
	}
	state, nonce, verifier := randomToken(), randomToken(), oauth2.GenerateVerifier()
	c.setOIDCCookie(w, r, state+"."+nonce+"."+verifier, c.cfg.Clock.Now().Add(oidcFlowTTL))
	to := c.oauthConfig(r, p).AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier))
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// oidcCallback checks the state, trades the code (with the PKCE verifier)
// for tokens, verifies the ID token and its nonce, checks it with the API
// (WhoAmI), then keeps it sealed in a new session as a pasted key would
// be: every page acts with it as its bearer until it or the session ends.
func (c *Console) oidcCallback(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	ck, err := r.Cookie(oidcCookie)
	parts := []string{}
	if err == nil {
		parts = strings.Split(ck.Value, ".")
	}
	q := r.URL.Query()
	if len(parts) != 3 || !tokensEqual(q.Get("state"), parts[0]) {
		c.oidcFail(w, r, http.StatusForbidden, apiError{Code: "CSRF_REFUSED", Message: "the sign-in's state is missing or not this browser's: sign in again"})
		return
	}
	nonce, verifier := parts[1], parts[2]
	if e := q.Get("error"); e != "" {
		c.oidcFail(w, r, http.StatusUnauthorized, apiError{Code: "UNAUTHENTICATED", Message: "the sign-in provider refused: " + e + " " + q.Get("error_description")})
		return
	}
	if c.cfg.Sealer == nil {
		c.oidcFail(w, r, http.StatusConflict, apiError{Code: "FAILED_PRECONDITION", Message: "the console needs BETTER_COMPUTE_SECRET to keep tokens sealed"})
		return
	}
	p, err := c.oidcProvider(ctx)
	if err != nil {
		c.oidcFail(w, r, http.StatusBadGateway, apiError{Code: "UNAVAILABLE", Message: "the sign-in provider could not be reached: " + err.Error()})
		return
	}
	tok, err := c.oauthConfig(r, p).Exchange(ctx, q.Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		c.oidcFail(w, r, http.StatusUnauthorized, apiError{Code: "UNAUTHENTICATED", Message: "the sign-in provider did not accept the code: " + err.Error()})
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		c.oidcFail(w, r, http.StatusUnauthorized, apiError{Code: "UNAUTHENTICATED", Message: "the sign-in provider sent no ID token"})
		return
	}
	idt, err := p.VerifierContext(ctx, &oidc.Config{ClientID: c.cfg.OIDC.ClientID, Now: c.cfg.Clock.Now}).Verify(ctx, raw)
	if err == nil && !tokensEqual(idt.Nonce, nonce) {
		err = errors.New("its nonce is not this sign-in's")
	}
	if err != nil {
		c.oidcFail(w, r, http.StatusUnauthorized, apiError{Code: "UNAUTHENTICATED", Message: "the ID token was refused: " + err.Error()})
		return
	}
	who, err := c.apiClient(r, raw).Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	if err != nil {
		c.oidcFail(w, r, httpStatus(err), apiErrorOf(err))
		return
	}
	expire := c.cfg.Clock.Now().Add(c.cfg.SessionTTL)
	if idt.Expiry.Before(expire) {
		// The API stops accepting the token then; the session ends with it.
		expire = idt.Expiry
	}
	c.setOIDCCookie(w, r, "", time.Time{})
	c.startSession(w, r, raw, who.Msg.GetPrincipalId(), expire)
}

// startSession stores a session acting with bearer (sealed), sets its
// cookie (replacing the browser's earlier session and sweeping expired
// ones, as the key sign-in does) and answers a page linking to the console.
func (c *Console) startSession(w http.ResponseWriter, r *http.Request, bearer, principalID string, expire time.Time) {
	token := randomToken()
	idHash := hashToken(token)
	sealed, err := c.cfg.Sealer.Seal(sealRef(idHash), []byte(bearer))
	if err != nil {
		c.fail(w, r, nil, http.StatusInternalServerError, apiError{Code: "INTERNAL", Message: "the token could not be sealed"})
		c.cfg.Logger.Error("console: seal a session token", "err", err)
		return
	}
	now := c.cfg.Clock.Now()
	row := sessionRow{IDHash: idHash, APIKey: sealed, PrincipalID: principalID, CSRFToken: randomToken(), CreateTime: now, ExpireTime: expire}
	var previous string
	if ck, err := r.Cookie(SessionCookie); err == nil && ck.Value != "" {
		previous = hashToken(ck.Value)
	}
	err = c.cfg.DB.Write(r.Context(), func(ctx context.Context, tx store.Tx) error {
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
	c.render(w, r, http.StatusOK, oidcSignedInPage(page{Title: "Signed in"}))
}
