package console_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/authn"
	"github.com/better-compute/better-compute/internal/console"
	"github.com/better-compute/better-compute/internal/store"
)

const oidcClientID = "bc-console"

// testIssuer is an OpenID provider that speaks the authorization code flow
// with PKCE: /authorize remembers the request's challenge and nonce under
// a fresh code and sends the browser back; /token pays a code out once,
// only for the verifier whose S256 is the challenge, with an ID token
// signed by its RSA key.
type testIssuer struct {
	URL string
	key *rsa.PrivateKey
	cp  *bctest.ControlPlane

	mu    sync.Mutex
	codes map[string]authRequest
	// Who signs in next, and edits to the next token's claims.
	sub, tenant, role string
	edits             map[string]any
}

type authRequest struct {
	challenge, method, nonce, redirect string
}

func newTestIssuer(t *testing.T) *testIssuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	iss := &testIssuer{key: key, codes: map[string]authRequest{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer": iss.URL, "authorization_endpoint": iss.URL + "/authorize", "token_endpoint": iss.URL + "/token",
			"jwks_uri": iss.URL + "/jwks", "response_types_supported": []string{"code"},
			"subject_types_supported": []string{"public"}, "id_token_signing_alg_values_supported": []string{"RS256"},
			"code_challenge_methods_supported": []string{"S256"},
		})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: string(jose.RS256), Use: "sig"}}})
	})
	mux.HandleFunc("GET /authorize", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("client_id") != oidcClientID || q.Get("response_type") != "code" {
			http.Error(w, "bad client or response type", http.StatusBadRequest)
			return
		}
		code := rand.Text()
		iss.mu.Lock()
		iss.codes[code] = authRequest{challenge: q.Get("code_challenge"), method: q.Get("code_challenge_method"),
			nonce: q.Get("nonce"), redirect: q.Get("redirect_uri")}
		iss.mu.Unlock()
		back, _ := url.Parse(q.Get("redirect_uri"))
		back.RawQuery = url.Values{"code": {code}, "state": {q.Get("state")}}.Encode()
		http.Redirect(w, r, back.String(), http.StatusFound)
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		iss.mu.Lock()
		req, ok := iss.codes[r.PostForm.Get("code")]
		delete(iss.codes, r.PostForm.Get("code"))
		iss.mu.Unlock()
		sum := sha256.Sum256([]byte(r.PostForm.Get("code_verifier")))
		w.Header().Set("Content-Type", "application/json")
		if !ok || req.method != "S256" || base64.RawURLEncoding.EncodeToString(sum[:]) != req.challenge ||
			r.PostForm.Get("redirect_uri") != req.redirect || r.PostForm.Get("client_id") != oidcClientID {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "invalid_grant"})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "at", "token_type": "Bearer", "expires_in": 3600,
			"id_token": iss.idToken(t, req.nonce)})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	iss.URL = srv.URL
	return iss
}

func (iss *testIssuer) idToken(t *testing.T, nonce string) string {
	now := iss.cp.Clock.Now()
	iss.mu.Lock()
	claims := map[string]any{"iss": iss.URL, "aud": oidcClientID, "sub": iss.sub, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
		"nonce": nonce, "email": iss.sub + "@example.com", "bc_tenant": iss.tenant, "bc_role": iss.role}
	for k, v := range iss.edits {
		claims[k] = v
	}
	iss.mu.Unlock()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: iss.key, KeyID: "k1"}},
		(&jose.SignerOptions{}).WithType("JWT"))
	require.NoError(t, err)
	payload, err := json.Marshal(claims)
	require.NoError(t, err)
	jws, err := signer.Sign(payload)
	require.NoError(t, err)
	out, err := jws.CompactSerialize()
	require.NoError(t, err)
	return out
}

func (iss *testIssuer) next(sub, tenant, role string, edits map[string]any) {
	iss.mu.Lock()
	defer iss.mu.Unlock()
	iss.sub, iss.tenant, iss.role, iss.edits = sub, tenant, role, edits
}

// oidcSignIn runs the flow as a browser would: the console's start, the
// issuer's authorize, the console's callback. It returns the callback's
// answer.
func (b *browser) oidcSignIn(t *testing.T) (reply, string) {
	t.Helper()
	res, body := b.get(console.PathOIDCStart)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	to, err := url.Parse(res.Header.Get("Location"))
	require.NoError(t, err)
	q := to.Query()
	require.Equal(t, "S256", q.Get("code_challenge_method"))
	require.NotEmpty(t, q.Get("code_challenge"))
	require.NotEmpty(t, q.Get("nonce"))
	require.NotEmpty(t, q.Get("state"))
	require.Equal(t, b.base+console.PathOIDCCallback, q.Get("redirect_uri"))
	at, err := b.c.Get(to.String())
	require.NoError(t, err)
	_ = at.Body.Close()
	require.Equal(t, http.StatusFound, at.StatusCode)
	back, err := url.Parse(at.Header.Get("Location"))
	require.NoError(t, err)
	return b.get(back.RequestURI())
}

// TestConsoleOIDC: with an issuer configured the sign-in page offers it;
// the code flow (PKCE S256, state, nonce) signs a person in with their ID
// token sealed in the session, and every page acts with it; a forged state,
// a token for another nonce or client, and a server without an issuer are
// refused.
func TestConsoleOIDC(t *testing.T) {
	t.Parallel()
	iss := newTestIssuer(t)
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.OIDC = authn.OIDCConfig{Issuer: iss.URL, ClientID: oidcClientID}
	})
	iss.cp = cp
	ctx := context.Background()
	_, err := cp.Admin().Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)

	t.Run("sign in with the issuer", func(t *testing.T) {
		iss.next("alice", "acme", "admin", nil)
		b := newBrowser(t, cp.URL, nil)
		res, body := b.get(console.PathSignIn)
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Contains(t, body, "Sign in with "+iss.URL)
		require.Contains(t, body, `href="`+console.PathOIDCStart+`"`)
		res, body = b.oidcSignIn(t)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `href="/console/overview"`)
		ck := cookieNamed(res, console.SessionCookie)
		require.NotNil(t, ck)
		require.True(t, ck.HttpOnly)
		require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
		require.Equal(t, 1, countRows(t, cp, `SELECT COUNT(*) FROM console_sessions`))
		var sealed []byte
		require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT api_key FROM console_sessions`).Scan(&sealed)
		}))
		require.NotContains(t, string(sealed), "eyJ", "the ID token is sealed")
		res, body = b.get(console.PathOverview)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "Signed in as <strong>")
		require.Contains(t, body, "admin")
		require.Contains(t, body, "of acme")
		// The ID token ends the session when it expires.
		cp.Clock.Advance(time.Hour + time.Second)
		res, _ = b.get(console.PathOverview)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		require.Equal(t, console.PathSignIn+"?ended=1", res.Header.Get("Location"))
	})

	t.Run("a forged state, another nonce or another client is refused", func(t *testing.T) {
		iss.next("mallory", "acme", "admin", nil)
		sessions := countRows(t, cp, `SELECT COUNT(*) FROM console_sessions`)
		b := newBrowser(t, cp.URL, nil)
		res, body := b.get(console.PathOIDCCallback + "?code=x&state=forged")
		require.Equal(t, http.StatusForbidden, res.StatusCode, body)
		require.Contains(t, body, "CSRF_REFUSED")

		iss.next("mallory", "acme", "admin", map[string]any{"nonce": "another"})
		res, body = b.oidcSignIn(t)
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, body)
		require.Contains(t, body, "nonce")
		iss.next("mallory", "acme", "admin", map[string]any{"aud": "another-client"})
		res, body = b.oidcSignIn(t)
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, body)
		require.Contains(t, body, "UNAUTHENTICATED")
		require.Equal(t, sessions, countRows(t, cp, `SELECT COUNT(*) FROM console_sessions`), "no session was stored")
		res, _ = b.get(console.PathOverview)
		require.Equal(t, http.StatusSeeOther, res.StatusCode, "not signed in")

		// A code is good once, and only with its own verifier: a replay
		// of the callback (its cookie now gone) is refused.
		iss.next("alice", "acme", "admin", nil)
		res, _ = b.get(console.PathOIDCStart)
		to, err := url.Parse(res.Header.Get("Location"))
		require.NoError(t, err)
		at, err := b.c.Get(to.String())
		require.NoError(t, err)
		_ = at.Body.Close()
		back, err := url.Parse(at.Header.Get("Location"))
		require.NoError(t, err)
		res, body = b.get(back.RequestURI())
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		res, body = b.get(back.RequestURI())
		require.Equal(t, http.StatusForbidden, res.StatusCode, body)
	})
}

// TestConsoleWithoutOIDC: without an issuer the sign-in page offers only
// the key form and the OIDC paths are not served.
func TestConsoleWithoutOIDC(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	b := newBrowser(t, cp.URL, nil)
	_, body := b.get(console.PathSignIn)
	require.NotContains(t, body, "Sign in with")
	res, _ := b.get(console.PathOIDCStart)
	require.Equal(t, http.StatusNotFound, res.StatusCode)
}

func countRows(t *testing.T, cp *bctest.ControlPlane, query string) int {
	t.Helper()
	f := &fixture{cp: cp}
	return f.count(t, query)
}
