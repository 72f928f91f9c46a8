package robot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/providers"
)

// minRetryAfter is the least a rate-limited caller waits.
const minRetryAfter = time.Second

// apiError is Robot's error body.
type apiError struct {
	Status     int    `json:"status"`
	Code       string `json:"code"`
	Message    string `json:"message"`
	MaxRequest int    `json:"max_request"`
	Interval   int    `json:"interval"`
}

// call sends one webservice request (form-encoded for POST) and decodes
// the JSON answer into out. Every error is a *providers.Error whose
// message went through Redact with the account's credentials and secrets.
func (p *Provider) call(ctx context.Context, method, path string, form url.Values, out any, secrets ...string) error {
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, p.endpoint+path, body)
	if err != nil {
		return p.wrap(method+" "+path, providers.KindInternal, err.Error(), secrets...)
	}
	req.SetBasicAuth(p.user, p.password)
	req.Header.Set("Accept", "application/json")
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := p.http.Do(req)
	if err != nil {
		// The request or its answer was lost on the way: Robot may or may
		// not have acted, and a retry (idempotent) finds out.
		e := p.wrap(method+" "+path, providers.KindUnavailable, err.Error(), secrets...)
		e.RetryAfter = minRetryAfter
		return e
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return p.wrap(method+" "+path, providers.KindUnavailable, "reading the answer: "+err.Error(), secrets...)
	}
	if resp.StatusCode >= 300 {
		return p.apiFailure(method+" "+path, resp.StatusCode, raw, secrets...)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return p.wrap(method+" "+path, providers.KindInternal, "decoding the answer: "+err.Error(), secrets...)
	}
	return nil
}

// apiFailure turns a non-2xx answer into an Error: by Robot's code where it
// sent one, else by the HTTP status.
func (p *Provider) apiFailure(op string, status int, raw []byte, secrets ...string) error {
	var body struct {
		Error *apiError `json:"error"`
	}
	msg := fmt.Sprintf("HTTP %d", status)
	var ae apiError
	if json.Unmarshal(raw, &body) == nil && body.Error != nil {
		ae = *body.Error
		msg += ": " + ae.Message
	}
	kind := kindOfCode(ae.Code)
	if kind == "" {
		kind = kindOfStatus(status)
	}
	e := p.wrap(op, kind, msg, secrets...)
	e.Code = ae.Code
	if kind == providers.KindRateLimited {
		e.RetryAfter = retryAfter(ae)
	}
	if kind == providers.KindUnavailable {
		e.RetryAfter = minRetryAfter
	}
	return e
}

// wrap makes an Error whose message is free of the password, the user,
// and secrets (user data line by line and word by word too, in case the
// service or a command quotes a piece of it back).
func (p *Provider) wrap(op string, kind providers.ErrorKind, msg string, secrets ...string) *providers.Error {
	return &providers.Error{Provider: Type, Kind: kind, Message: p.redact(op+": "+msg, secrets...)}
}

func (p *Provider) redact(s string, secrets ...string) string {
	redact := []string{p.password, p.user}
	for _, v := range secrets {
		redact = append(redact, v)
		for _, line := range strings.Split(v, "\n") {
			if line = strings.TrimSpace(line); len(line) >= 12 {
				redact = append(redact, line)
			}
			for _, w := range strings.Fields(line) {
				if len(w) >= 12 {
					redact = append(redact, w)
				}
			}
		}
	}
	return providers.Redact(s, redact...)
}

// kindOfCode maps Robot's error codes; "" leaves it to the status.
func kindOfCode(code string) providers.ErrorKind {
	switch {
	case code == "":
		return ""
	case code == "RATE_LIMIT_EXCEEDED":
		return providers.KindRateLimited
	case code == "INVALID_INPUT":
		return providers.KindInvalid
	case code == "UNAUTHORIZED":
		return providers.KindAuth
	case code == "MAINTENANCE":
		return providers.KindUnavailable
	case code == "CONFLICT", strings.Contains(code, "ALREADY"), strings.HasSuffix(code, "_ACTIVE"):
		// BOOT_ALREADY_ENABLED, KEY_ALREADY_EXISTS, RESET_MANUAL_ACTIVE.
		return providers.KindConflict
	case code == "RESET_NOT_AVAILABLE", code == "BOOT_NOT_AVAILABLE":
		return providers.KindNotSupported
	case code == "NOT_FOUND", strings.HasSuffix(code, "_NOT_FOUND"):
		return providers.KindNotFound
	}
	return ""
}

func kindOfStatus(status int) providers.ErrorKind {
	switch {
	case status == http.StatusBadRequest, status == http.StatusUnprocessableEntity:
		return providers.KindInvalid
	case status == http.StatusUnauthorized:
		return providers.KindAuth
	case status == http.StatusForbidden:
		return providers.KindForbidden
	case status == http.StatusNotFound:
		return providers.KindNotFound
	case status == http.StatusConflict:
		return providers.KindConflict
	case status == http.StatusTooManyRequests:
		return providers.KindRateLimited
	case status >= 500:
		return providers.KindUnavailable
	}
	return providers.KindInternal
}

// retryAfter is one request's share of Robot's limit: it allows
// max_request requests an interval, refilled evenly.
func retryAfter(ae apiError) time.Duration {
	if ae.MaxRequest <= 0 || ae.Interval <= 0 {
		return minRetryAfter
	}
	return max(time.Duration(ae.Interval)*time.Second/time.Duration(ae.MaxRequest), minRetryAfter)
}

// isKind reports whether err is a provider error of kind.
func isKind(err error, kind providers.ErrorKind) bool {
	var e *providers.Error
	return errors.As(err, &e) && e.Kind == kind
}
