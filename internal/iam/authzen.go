package iam

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"time"
)

// AuthZENConfig configures the remote PDP client.
type AuthZENConfig struct {
	// URL is the PDP base; requests go to POST {URL}/access/v1/evaluation.
	URL string
	// Timeout bounds one evaluation; 2s when zero. Every mutation waits on
	// it, so a slow PDP must turn into a deny rather than a stuck API.
	Timeout time.Duration
	// Client defaults to a fresh http.Client.
	Client *http.Client
	// Token, when set, is sent as a bearer token.
	Token string
}

// AuthZEN is an Authorizer backed by a remote policy decision point speaking
// OpenID AuthZEN 1.0. It fails closed: any failure is a deny plus an error.
type AuthZEN struct {
	endpoint string
	timeout  time.Duration
	client   *http.Client
	token    string
}

var _ Authorizer = (*AuthZEN)(nil)

// maxAuthZENResponse caps what we read from the PDP; a decision is tiny.
const maxAuthZENResponse = 1 << 20

// NewAuthZEN returns a client for the PDP at cfg.URL.
func NewAuthZEN(cfg AuthZENConfig) *AuthZEN {
	client := cfg.Client
	if client == nil {
		client = &http.Client{}
	}
	return &AuthZEN{
		endpoint: strings.TrimRight(cfg.URL, "/") + "/access/v1/evaluation",
		timeout:  cmp.Or(cfg.Timeout, 2*time.Second),
		client:   client,
		token:    cfg.Token,
	}
}

// The AuthZEN 1.0 evaluation request and response.
type (
	authzenEntity struct {
		Type       string         `json:"type"`
		ID         string         `json:"id"`
		Properties map[string]any `json:"properties,omitempty"`
	}
	authzenAction struct {
		Name string `json:"name"`
	}
	authzenRequest struct {
		Subject  authzenEntity  `json:"subject"`
		Action   authzenAction  `json:"action"`
		Resource authzenEntity  `json:"resource"`
		Context  map[string]any `json:"context"`
	}
	authzenResponse struct {
		Decision *bool          `json:"decision"`
		Context  map[string]any `json:"context"`
	}
)

// ErrPDP marks failures talking to the remote PDP, so callers can tell an
// unreachable PDP from a policy deny in logs and metrics.
var ErrPDP = errors.New("authzen pdp")

// Authorize asks the PDP.
func (a *AuthZEN) Authorize(ctx context.Context, req Request) (Decision, error) {
	d, err := a.authorize(ctx, req)
	if err != nil {
		return Decision{Reasons: []string{err.Error()}}, fmt.Errorf("%w: %w", ErrPDP, err)
	}
	return d, nil
}

func (a *AuthZEN) authorize(ctx context.Context, req Request) (Decision, error) {
	body, err := json.Marshal(toAuthZEN(req))
	if err != nil {
		return Decision{}, fmt.Errorf("encode request: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, a.endpoint, bytes.NewReader(body))
	if err != nil {
		return Decision{}, fmt.Errorf("build request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	if a.token != "" {
		hreq.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.client.Do(hreq)
	if err != nil {
		return Decision{}, fmt.Errorf("post evaluation: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAuthZENResponse))
	if err != nil {
		return Decision{}, fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return Decision{}, fmt.Errorf("evaluation returned %s", resp.Status)
	}
	var out authzenResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		return Decision{}, fmt.Errorf("decode response: %w", err)
	}
	if out.Decision == nil {
		return Decision{}, errors.New("decode response: no decision")
	}
	d := Decision{Allowed: *out.Decision}
	if !d.Allowed {
		if v, _ := out.Context["confirmation_required"].(bool); v {
			d.ConfirmationRequired = true
		}
	}
	// AuthZEN leaves reasons free-form; keep the admin-facing one for logs.
	if r, ok := out.Context["reason_admin"]; ok {
		if b, err := json.Marshal(r); err == nil {
			d.Reasons = []string{string(b)}
		}
	}
	return d, nil
}

// toAuthZEN maps a request onto AuthZEN's subject/action/resource/context,
// with tenancy in properties since AuthZEN has no parent chain.
func toAuthZEN(req Request) authzenRequest {
	subj := map[string]any{"role": string(req.Principal.Role)}
	if req.Principal.TenantID != "" {
		subj["tenant"] = req.Principal.TenantID
	}
	res := map[string]any{}
	maps.Copy(res, req.Resource.Attrs)
	// Set after the attrs so an attribute cannot spoof tenancy.
	if t := resourceTenant(req.Resource); t != "" {
		res["tenant"] = t
	}
	if req.Resource.ProjectID != "" {
		res["project"] = req.Resource.ProjectID
	}
	rctx := map[string]any{ContextConfirmed: false}
	maps.Copy(rctx, req.Context)
	return authzenRequest{
		Subject:  authzenEntity{Type: string(req.Principal.Kind), ID: req.Principal.ID, Properties: subj},
		Action:   authzenAction{Name: req.Action},
		Resource: authzenEntity{Type: req.Resource.Type, ID: cmp.Or(req.Resource.ID, DraftID), Properties: res},
		Context:  rctx,
	}
}
