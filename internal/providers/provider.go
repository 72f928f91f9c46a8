// Package providers is the contract between the control plane and the
// services that rent it servers: Hetzner Cloud, Hetzner Robot, Proxmox VE
// and whatever an out-of-process driver adds. A Provider creates, finds,
// powers, rebuilds and deletes servers for instances of a provider pool;
// the control plane calls it outside database transactions and converges
// what it reports (the instance reconciler).
//
// Two rules every provider keeps, and the conformance suite
// (providers/conformance) checks:
//
//   - Create is idempotent by the instance id: the server carries it as the
//     label InstanceLabel, and a Create for an instance whose server
//     exists (a retry after a lost answer, a control plane killed between
//     the call and its commit) returns that server instead of making a
//     second one. Delete of a missing server is not an error.
//   - No credential ever appears in a log line, an event or an error: the
//     provider scrubs what its client returns (Redact) before it wraps it.
package providers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// InstanceLabel names, on a provider's server, the instance it was made
// for; ManagedLabel marks every server this control plane made (its value
// is the control plane's id, so two deployments sharing an account keep
// apart).
const (
	InstanceLabel = "bettercompute.io/instance"
	ManagedLabel  = "bettercompute.io/managed-by"
)

// Provider manages servers on one account of an external service.
type Provider interface {
	// Type is the registry name ("hetzner-cloud", "hetzner-robot",
	// "proxmox").
	Type() string
	// Offers lists what can be created, with prices and availability:
	// every page of the service's catalog.
	Offers(ctx context.Context) ([]Offer, error)
	// Create makes (or, for a provider that claims existing machines,
	// claims) the server of req.InstanceID and starts it. Idempotent by
	// InstanceID: an existing server of the instance is returned as it is.
	Create(ctx context.Context, req CreateRequest) (Server, error)
	// Get finds the server of an instance: ErrNotFound when there is none.
	Get(ctx context.Context, instanceID string) (Server, error)
	// List lists every server this control plane manages on the account
	// (ManagedLabel), every page.
	List(ctx context.Context) ([]Server, error)
	// Delete deletes (or, for a claimed machine, releases) the server of an
	// instance; a missing server is not an error.
	Delete(ctx context.Context, instanceID string) error
	// Power turns the instance's server on or off, or reboots it.
	Power(ctx context.Context, instanceID string, action PowerAction) error
	// Rebuild writes image to the instance's server (the disk is lost).
	Rebuild(ctx context.Context, instanceID, image string) error
}

// PowerAction is what Power does.
type PowerAction string

const (
	PowerOn     PowerAction = "on"
	PowerOff    PowerAction = "off"
	PowerReboot PowerAction = "reboot"
)

// CreateRequest is one instance's server.
type CreateRequest struct {
	InstanceID string
	// Name is the server's name on the provider (unique per account where
	// the provider requires it).
	Name string
	// ServerType is the provider's size or model ("cx22", a Robot
	// product, a Proxmox template's VM size).
	ServerType string
	// Image is what the server boots (a provider image name, a Proxmox
	// template, an installimage image).
	Image    string
	Location string
	// UserData is the cloud-init document that carries the bcd join token
	// (Hetzner Cloud, Proxmox); Robot delivers it over SSH stdin instead.
	// It is a secret: never logged.
	UserData string
	SSHKeys  []string
	// Labels are added to InstanceLabel and ManagedLabel.
	Labels map[string]string
}

// ServerStatus is a server's state, the same words for every provider.
type ServerStatus string

const (
	StatusStarting ServerStatus = "starting"
	StatusRunning  ServerStatus = "running"
	StatusStopped  ServerStatus = "stopped"
	StatusDeleting ServerStatus = "deleting"
	StatusUnknown  ServerStatus = "unknown"
)

// Server is a provider's server as the control plane sees it.
type Server struct {
	// ID is the provider's id of the server.
	ID         string
	InstanceID string
	Name       string
	Status     ServerStatus
	IPv4       string
	IPv6       string
	ServerType string
	Location   string
	Labels     map[string]string
	Created    time.Time
}

// Offer is one thing a provider rents, where, at what price.
type Offer struct {
	ServerType string
	Location   string
	VCPU       int
	MemoryGiB  float64
	DiskGiB    int
	GPUs       int
	GPUModel   string
	// PriceHourly and PriceMonthly are decimal strings in Currency, gross
	// of nothing the provider adds (as its API states them).
	PriceHourly  string
	PriceMonthly string
	Currency     string
	Available    bool
}

// ErrorKind classifies a provider's failure so the API can answer with its
// code.
type ErrorKind string

const (
	KindNotFound     ErrorKind = "not_found"
	KindInvalid      ErrorKind = "invalid"
	KindAuth         ErrorKind = "unauthenticated"
	KindForbidden    ErrorKind = "forbidden"
	KindConflict     ErrorKind = "conflict"
	KindRateLimited  ErrorKind = "rate_limited"
	KindQuota        ErrorKind = "quota"
	KindUnavailable  ErrorKind = "unavailable"
	KindInternal     ErrorKind = "internal"
	KindNotSupported ErrorKind = "not_supported"
)

// Error is a provider's failure: its kind, a message free of credentials,
// and when to retry (rate limits, unavailability).
type Error struct {
	Provider   string
	Kind       ErrorKind
	Message    string
	RetryAfter time.Duration
	// Code is the provider's own error code ("uniqueness_error"), if any.
	Code string
}

func (e *Error) Error() string {
	s := e.Provider + ": " + string(e.Kind) + ": " + e.Message
	if e.Code != "" {
		s += " (" + e.Code + ")"
	}
	return s
}

// Is lets errors.Is(err, ErrNotFound) (and the others) match by kind.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Provider == "" && t.Message == "" && t.Kind == e.Kind
}

// Sentinels for errors.Is.
var (
	ErrNotFound    = &Error{Kind: KindNotFound}
	ErrRateLimited = &Error{Kind: KindRateLimited}
	ErrAuth        = &Error{Kind: KindAuth}
	ErrInvalid     = &Error{Kind: KindInvalid}
)

// Errorf makes an Error of kind for provider.
func Errorf(provider string, kind ErrorKind, format string, args ...any) *Error {
	return &Error{Provider: provider, Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// KindOf is err's kind (KindInternal for an error that is no *Error).
func KindOf(err error) ErrorKind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}

// Retryable reports whether a call that failed with err may succeed later
// unchanged, and after how long at least.
func Retryable(err error) (bool, time.Duration) {
	var e *Error
	if !errors.As(err, &e) {
		return false, 0
	}
	switch e.Kind {
	case KindRateLimited, KindUnavailable:
		return true, e.RetryAfter
	}
	return false, 0
}

// Redact replaces every non-empty secret in s with "[redacted]": a
// provider runs what its client returns through it before it wraps it.
func Redact(s string, secrets ...string) string {
	for _, v := range secrets {
		if len(v) >= 4 {
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	return s
}

// Field is one setting of a provider account.
type Field struct {
	Name        string
	Description string
	Required    bool
	// Secret: given only as a reference to the sealed secret store, never
	// inline; the provider gets the resolved value in Config.Credentials.
	Secret bool
}

// Manifest says what an account of a provider type needs.
type Manifest struct {
	Type        string
	Description string
	Fields      []Field
}

// Config builds a Provider for one account.
type Config struct {
	// Endpoint overrides the service's API URL (an emulator's, a private
	// region's); "" is the service's own.
	Endpoint string
	// Credentials are the resolved secret fields; Settings the others.
	Credentials map[string]string
	Settings    map[string]string
	// ControlPlaneID is ManagedLabel's value.
	ControlPlaneID string
	HTTPClient     *http.Client
	Logger         *slog.Logger
}

// Factory is a provider type in the registry.
type Factory struct {
	Manifest Manifest
	New      func(cfg Config) (Provider, error)
}

var (
	regMu    sync.RWMutex
	registry = map[string]Factory{}
)

// Register adds a provider type; a second one of a name panics (a build
// mistake, as with database/sql drivers).
func Register(f Factory) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[f.Manifest.Type]; dup {
		panic("providers: type " + f.Manifest.Type + " registered twice")
	}
	registry[f.Manifest.Type] = f
}

// Lookup finds a provider type.
func Lookup(typ string) (Factory, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	f, ok := registry[typ]
	return f, ok
}

// Types lists the registered provider types, sorted.
func Types() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	out := make([]string, 0, len(registry))
	for t := range registry {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Validate checks an account's settings and secret references against the
// type's manifest: it returns one problem per field ("" field for the
// type).
func (m Manifest) Validate(settings map[string]string, secretRefs map[string]string) map[string]string {
	problems := map[string]string{}
	known := map[string]Field{}
	for _, f := range m.Fields {
		known[f.Name] = f
		_, inSettings := settings[f.Name]
		_, inRefs := secretRefs[f.Name]
		switch {
		case f.Secret && inSettings:
			problems[f.Name] = "is a credential: give it as a secret reference, never inline"
		case f.Required && f.Secret && !inRefs:
			problems[f.Name] = "is required (a secret reference)"
		case f.Required && !f.Secret && !inSettings:
			problems[f.Name] = "is required"
		case !f.Secret && inRefs:
			problems[f.Name] = "is not a credential: give it as a setting"
		}
	}
	for k := range settings {
		if _, ok := known[k]; !ok {
			problems[k] = "is not a setting of provider type " + m.Type
		}
	}
	for k := range secretRefs {
		if _, ok := known[k]; !ok {
			problems[k] = "is not a credential of provider type " + m.Type
		}
	}
	return problems
}
