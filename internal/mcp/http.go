package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/better-compute/better-compute/client"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
)

// Path is where the API listener serves MCP over streamable HTTP.
const Path = "/mcp"

// HTTPConfig configures Handler.
type HTTPConfig struct {
	// API is the API's own handler (interceptors and all): tool calls are
	// sent to it in process, so they pass the same envelope as any client.
	API http.Handler
	// Authn authenticates the bearer key before a session is opened.
	Authn envelope.Authenticator
	// Version is reported to clients.
	Version string
	// MaxRequestBytes caps a request body (the API's own limit).
	MaxRequestBytes int64
	// SessionTimeout closes sessions idle this long (default 30 minutes).
	SessionTimeout time.Duration
	// APIURL is the API listener's own URL, where exec_sandbox's SSH
	// tunnel dials ("" refuses exec_sandbox).
	APIURL func() string
}

// Handler serves MCP over streamable HTTP. Only an API key of kind agent
// is let in: MCP is how AI agents reach the platform, and policy's
// agent rules (confirmations for what a human must approve) apply only to
// agent principals, so a user or service key over MCP would slip past
// them. Every tool call then runs as that key through the API.
func Handler(cfg HTTPConfig) (http.Handler, error) {
	if cfg.API == nil || cfg.Authn == nil {
		return nil, errors.New("mcp: HTTPConfig.API and Authn are required")
	}
	inproc := &http.Client{Transport: handlerTransport{cfg.API}}
	srv, err := New(Config{Version: cfg.Version, APIURL: cfg.APIURL, Connect: func(_ context.Context, h http.Header) (*client.Client, error) {
		token, ok := bearer(h)
		if !ok {
			// The middleware let nobody in without one.
			return nil, errors.New("mcp: the request carries no bearer key")
		}
		// The base URL only fills the request line; the transport never
		// dials.
		return client.New("http://api.internal", token, client.WithHTTPClient(inproc),
			client.WithHeader("User-Agent", "better-compute-mcp/"+cfg.Version)), nil
	}})
	if err != nil {
		return nil, err
	}
	timeout := cfg.SessionTimeout
	if timeout == 0 {
		timeout = 30 * time.Minute
	}
	streamable := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv },
		&sdk.StreamableHTTPOptions{SessionTimeout: timeout, MaxRequestBodyBytes: cfg.MaxRequestBytes,
			// The SDK refuses a loopback peer whose Host is not localhost, a
			// guard against DNS rebinding for unauthenticated local
			// servers. Every request here carries an agent key a rebinding
			// page cannot know, and the guard would refuse a reverse proxy
			// on the same host.
			DisableLocalhostProtection: true})
	// RequireBearerToken ties a session to the key that opened it (the SDK
	// refuses a session id presented with another key).
	verified := auth.RequireBearerToken(func(ctx context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		caller, ok := r.Context().Value(callerKey{}).(envelope.Caller)
		if !ok {
			return nil, fmt.Errorf("%w: not authenticated", auth.ErrInvalidToken)
		}
		// API keys are checked on every call; the SDK wants an expiry.
		return &auth.TokenInfo{UserID: caller.Principal.ID, Expiration: time.Now().Add(24 * time.Hour)}, nil
	}, nil)(streamable)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller, err := cfg.Authn.Authenticate(r.Context(), r.Header)
		if err != nil {
			writeRefusal(w, http.StatusUnauthorized, refusalOfEnvelope(err))
			return
		}
		if caller.Principal.Kind != iam.KindAgent {
			writeRefusal(w, http.StatusForbidden, &Refusal{Code: "PERMISSION_DENIED",
				Message: fmt.Sprintf("MCP over HTTP takes an API key of kind agent; %s is a %s key (create one with: better-compute api-keys create --role agent)",
					caller.Principal.ID, caller.Principal.Kind)})
			return
		}
		verified.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, caller)))
	}), nil
}

type callerKey struct{}

func bearer(h http.Header) (string, bool) {
	const prefix = "Bearer "
	v := h.Get("Authorization")
	if len(v) <= len(prefix) || v[:len(prefix)] != prefix {
		return "", false
	}
	return v[len(prefix):], true
}

func refusalOfEnvelope(err error) *Refusal {
	var e *envelope.Error
	if errors.As(err, &e) {
		return &Refusal{Code: string(e.Code), Message: e.Message}
	}
	return &Refusal{Code: "UNAUTHENTICATED", Message: err.Error()}
}

// writeRefusal answers a refused HTTP request with the refusal as JSON.
func writeRefusal(w http.ResponseWriter, status int, r *Refusal) {
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="better-compute"`)
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": r})
}

// handlerTransport sends a request to an http.Handler in process. The API's
// tool calls are unary, so a buffered response is enough.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	rw := &bufferedResponse{header: http.Header{}}
	// The handler reads the body as a server would: never nil.
	if req.Body == nil {
		req.Body = http.NoBody
	}
	in := req.Clone(req.Context())
	in.RequestURI = req.URL.RequestURI()
	in.RemoteAddr = "mcp"
	t.h.ServeHTTP(rw, in)
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	return &http.Response{
		Status: fmt.Sprintf("%d %s", rw.status, http.StatusText(rw.status)), StatusCode: rw.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rw.header, Body: io.NopCloser(&rw.body), ContentLength: int64(rw.body.Len()), Request: req,
	}, nil
}

type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}
