// Package conformance is the suite every provider passes against its
// emulator before it ships: idempotent create under retries and a lost
// answer, delete of a missing server, every page of a listing, rate limits
// mapped to a retry delay, the service's errors mapped to the API's kinds,
// power and rebuild, and no credential in any log line or error.
//
// A provider's test calls Run with a Harness that builds the provider
// against a fresh emulator (bctest's, which speak the real APIs: the
// services' own clients are run against them in .ci/run).
package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/internal/providers"
)

// Emulator is what the suite needs from a provider's emulator.
type Emulator interface {
	// Servers counts the account's servers that exist (for a claiming
	// provider, the claimed ones).
	Servers() int
	// Offers counts the offers the catalog holds (Offers must return them
	// all, across pages).
	Offers() int
	// PageSize is the emulator's page size for listings.
	PageSize() int
	// RateLimitNext makes the next n requests answer the service's rate
	// limit (HTTP 429 with its retry headers).
	RateLimitNext(n int)
	// LoseNextCreate makes the next create take effect on the service and
	// its answer lost (the connection closes before a byte of it).
	LoseNextCreate()
	// FailNext makes the next request answer the HTTP status with the
	// service's error body, whose message includes body.
	FailNext(status int, body string)
	// Secrets are the credentials the account was made with.
	Secrets() []string
}

// Harness is one provider under test.
type Harness struct {
	// New builds the provider against a fresh emulator; the provider logs
	// to log.
	New func(t *testing.T, log *slog.Logger) (providers.Provider, Emulator)
	// Request is a valid create on the emulator (server type, image,
	// location); the suite sets InstanceID, Name and UserData.
	Request providers.CreateRequest
	// Claims is set for a provider that claims existing machines instead
	// of ordering them (Hetzner Robot): the emulator holds enough.
	Claims bool
	// Timeout bounds each case; default 30 s.
	Timeout time.Duration
}

// logBuffer collects every log line the provider writes.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type env struct {
	t    *testing.T
	p    providers.Provider
	emu  Emulator
	logs *logBuffer
	errs []error
	ctx  context.Context
	h    Harness
	n    int
}

func (e *env) req(t *testing.T) providers.CreateRequest {
	e.n++
	r := e.h.Request
	r.InstanceID = fmt.Sprintf("ins_conformance%04d", e.n)
	r.Name = fmt.Sprintf("bc-conformance-%04d", e.n)
	// The join token travels in the user data: it is a secret too.
	r.UserData = "#cloud-config\nwrite_files:\n- path: /etc/bcd/join-token\n  content: bcjoin_conformance_secret_token\n"
	return r
}

// keep records an error for the leak check.
func (e *env) keep(err error) error {
	if err != nil {
		e.errs = append(e.errs, err)
	}
	return err
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	if h.Timeout == 0 {
		h.Timeout = 30 * time.Second
	}
	setup := func(t *testing.T) *env {
		t.Helper()
		logs := &logBuffer{}
		log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		p, emu := h.New(t, log)
		ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
		t.Cleanup(cancel)
		e := &env{t: t, p: p, emu: emu, logs: logs, ctx: ctx, h: h}
		t.Cleanup(func() { e.noLeaks(t) })
		return e
	}
	cases := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"create is idempotent", createIdempotent},
		{"create after a lost answer", createLostAnswer},
		{"rate limits carry a retry delay", rateLimited},
		{"delete of a missing server", deleteMissing},
		{"get of a missing server", getMissing},
		{"list and offers read every page", pagination},
		{"errors map to kinds", errorKinds},
		{"power and rebuild", powerRebuild},
		{"delete removes the server", deleteRemoves},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, setup(t))
		})
	}
}

// ok fails the case on err and returns v; the error is kept for the leak
// check.
func ok[T any](e *env, v T, err error) T {
	e.t.Helper()
	if err := e.keep(err); err != nil {
		e.t.Fatalf("unexpected error: %v", err)
	}
	return v
}

func (e *env) server(v providers.Server, err error) providers.Server   { return ok(e, v, err) }
func (e *env) list(v []providers.Server, err error) []providers.Server { return ok(e, v, err) }
func (e *env) offers(v []providers.Offer, err error) []providers.Offer { return ok(e, v, err) }

func createIdempotent(t *testing.T, e *env) {
	r := e.req(t)
	s1 := e.server(e.p.Create(e.ctx, r))
	if s1.ID == "" || s1.InstanceID != r.InstanceID {
		t.Fatalf("create returned %+v: want an id and instance %s", s1, r.InstanceID)
	}
	s2 := e.server(e.p.Create(e.ctx, r))
	if s2.ID != s1.ID {
		t.Fatalf("a second create made server %s beside %s", s2.ID, s1.ID)
	}
	if n := e.emu.Servers(); n != 1 {
		t.Fatalf("%d servers after two creates of one instance, want 1", n)
	}
	got := e.server(e.p.Get(e.ctx, r.InstanceID))
	if got.ID != s1.ID {
		t.Fatalf("get found %s, want %s", got.ID, s1.ID)
	}
}

func createLostAnswer(t *testing.T, e *env) {
	r := e.req(t)
	e.emu.LoseNextCreate()
	if _, err := e.p.Create(e.ctx, r); e.keep(err) == nil {
		// A provider may look again itself after a lost answer; then
		// it must have found the server the lost create made.
		t.Log("the provider recovered the lost answer itself")
	}
	s := e.server(e.p.Create(e.ctx, r))
	if s.InstanceID != r.InstanceID {
		t.Fatalf("create after a lost answer returned %+v", s)
	}
	if n := e.emu.Servers(); n != 1 {
		t.Fatalf("%d servers after a lost answer and a retry, want 1", n)
	}
}

func rateLimited(t *testing.T, e *env) {
	r := e.req(t)
	e.emu.RateLimitNext(1)
	_, err := e.p.Create(e.ctx, r)
	if err == nil {
		// A provider may wait out a short limit itself; the server must
		// then be there once.
		if n := e.emu.Servers(); n != 1 {
			t.Fatalf("%d servers after a rate-limited create that succeeded", n)
		}
		return
	}
	_ = e.keep(err)
	if !errors.Is(err, providers.ErrRateLimited) {
		t.Fatalf("a 429 became %v, want kind %s", err, providers.KindRateLimited)
	}
	if ok, after := providers.Retryable(err); !ok || after <= 0 {
		t.Fatalf("a rate limit must say when to retry: retryable %v after %s", ok, after)
	}
	e.server(e.p.Create(e.ctx, r))
	if n := e.emu.Servers(); n != 1 {
		t.Fatalf("%d servers after a rate limit and a retry, want 1", n)
	}
}

func deleteMissing(t *testing.T, e *env) {
	if err := e.keep(e.p.Delete(e.ctx, "ins_neverexisted")); err != nil {
		t.Fatalf("delete of a missing server: %v", err)
	}
}

func getMissing(t *testing.T, e *env) {
	_, err := e.p.Get(e.ctx, "ins_neverexisted")
	_ = e.keep(err)
	if !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("get of a missing server: %v, want kind %s", err, providers.KindNotFound)
	}
}

func pagination(t *testing.T, e *env) {
	n := e.emu.PageSize() + 2
	for range n {
		e.server(e.p.Create(e.ctx, e.req(t)))
	}
	list := e.list(e.p.List(e.ctx))
	if len(list) != n {
		t.Fatalf("list returned %d servers, want %d (page size %d)", len(list), n, e.emu.PageSize())
	}
	seen := map[string]bool{}
	for _, s := range list {
		if seen[s.InstanceID] {
			t.Fatalf("list returned instance %s twice", s.InstanceID)
		}
		seen[s.InstanceID] = true
	}
	offers := e.offers(e.p.Offers(e.ctx))
	if len(offers) != e.emu.Offers() {
		t.Fatalf("offers returned %d, want the catalog's %d", len(offers), e.emu.Offers())
	}
	for _, o := range offers {
		if o.ServerType == "" || o.PriceHourly == "" || o.Currency == "" {
			t.Fatalf("offer without a type, an hourly price or a currency: %+v", o)
		}
	}
}

func errorKinds(t *testing.T, e *env) {
	secret := e.emu.Secrets()[0]
	for _, c := range []struct {
		status int
		want   providers.ErrorKind
	}{
		{401, providers.KindAuth},
		{403, providers.KindForbidden},
		{422, providers.KindInvalid},
		{500, providers.KindUnavailable},
		{503, providers.KindUnavailable},
	} {
		// The service echoes what it was sent: the provider must not pass
		// a credential on in its error.
		e.emu.FailNext(c.status, "token "+secret+" refused")
		_, err := e.p.List(e.ctx)
		_ = e.keep(err)
		if got := providers.KindOf(err); got != c.want {
			t.Errorf("HTTP %d became %v (kind %s), want %s", c.status, err, got, c.want)
		}
	}
}

func powerRebuild(t *testing.T, e *env) {
	r := e.req(t)
	e.server(e.p.Create(e.ctx, r))
	if err := e.keep(e.p.Power(e.ctx, r.InstanceID, providers.PowerOff)); err != nil {
		t.Fatalf("power off: %v", err)
	}
	if s := e.server(e.p.Get(e.ctx, r.InstanceID)); s.Status != providers.StatusStopped {
		t.Fatalf("after power off the server is %s", s.Status)
	}
	if err := e.keep(e.p.Power(e.ctx, r.InstanceID, providers.PowerOn)); err != nil {
		t.Fatalf("power on: %v", err)
	}
	if s := e.server(e.p.Get(e.ctx, r.InstanceID)); s.Status != providers.StatusRunning && s.Status != providers.StatusStarting {
		t.Fatalf("after power on the server is %s", s.Status)
	}
	if err := e.keep(e.p.Power(e.ctx, r.InstanceID, providers.PowerReboot)); err != nil {
		t.Fatalf("reboot: %v", err)
	}
	if err := e.keep(e.p.Rebuild(e.ctx, r.InstanceID, r.Image)); err != nil && providers.KindOf(err) != providers.KindNotSupported {
		t.Fatalf("rebuild: %v", err)
	}
	if err := e.keep(e.p.Power(e.ctx, "ins_neverexisted", providers.PowerOff)); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("power of a missing server: %v, want kind %s", err, providers.KindNotFound)
	}
}

func deleteRemoves(t *testing.T, e *env) {
	r := e.req(t)
	e.server(e.p.Create(e.ctx, r))
	if err := e.keep(e.p.Delete(e.ctx, r.InstanceID)); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if n := e.emu.Servers(); n != 0 {
		t.Fatalf("%d servers after the delete, want 0", n)
	}
	if _, err := e.p.Get(e.ctx, r.InstanceID); !errors.Is(e.keep(err), providers.ErrNotFound) {
		t.Fatalf("get after delete: %v, want kind %s", err, providers.KindNotFound)
	}
	if err := e.keep(e.p.Delete(e.ctx, r.InstanceID)); err != nil {
		t.Fatalf("a second delete: %v", err)
	}
}

// noLeaks checks every error the case saw and every log line for the
// account's credentials and the join token.
func (e *env) noLeaks(t *testing.T) {
	secrets := append(append([]string{}, e.emu.Secrets()...), "bcjoin_conformance_secret_token")
	logs := e.logs.String()
	for _, s := range secrets {
		if s == "" {
			continue
		}
		if strings.Contains(logs, s) {
			t.Errorf("a credential appears in the provider's log")
		}
		for _, err := range e.errs {
			if strings.Contains(err.Error(), s) || strings.Contains(fmt.Sprintf("%+v", err), s) {
				t.Errorf("a credential appears in an error: %s", providers.Redact(err.Error(), s))
			}
		}
	}
}
