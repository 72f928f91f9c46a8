package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// BMC is one machine's baseboard management controller, as a driver
// serves it and as the host sees it. It has the method set of the site
// agent's bmc.Driver, so the agent adapts one to the other. Every method
// honours its context; a method a BMC cannot do returns an error that
// matches ErrUnsupported.
type BMC interface {
	// Name is the driver's name ("ipmi").
	Name() string
	// PowerOn turns the machine on; a machine already on stays on.
	PowerOn(ctx context.Context) error
	// PowerOff cuts power at once; a machine already off stays off.
	PowerOff(ctx context.Context) error
	// Shutdown asks the guest to shut down (ACPI power button); it
	// returns when the BMC accepted the request.
	Shutdown(ctx context.Context) error
	// PowerCycle turns the machine off and on again; off, it turns it on.
	PowerCycle(ctx context.Context) error
	// PowerStatus reads the machine's power state.
	PowerStatus(ctx context.Context) (PowerState, error)
	// SetBootOverride sets the device the machine boots from next (or
	// from now on, when Persistent).
	SetBootOverride(ctx context.Context, o BootOverride) error
	// InsertVirtualMedia attaches the image at imageURL as a virtual CD.
	InsertVirtualMedia(ctx context.Context, imageURL string) error
	// EjectVirtualMedia detaches any virtual CD.
	EjectVirtualMedia(ctx context.Context) error
	// Close releases what the driver holds for this BMC.
	Close(ctx context.Context) error
}

// PasswordSetter is a BMC that can change the password of the account it
// logs in with. It keeps using the credentials it was opened with.
type PasswordSetter interface {
	SetPassword(ctx context.Context, password string) error
}

// BMCDriver is what a driver binary serves: it names itself and opens a
// BMC for each target the host asks for. One driver process serves every
// BMC the host opens through it.
type BMCDriver interface {
	// Info names the driver. ServeBMC fills in ProtocolVersion.
	Info() Info
	// Open validates the target and returns its BMC. It should not need
	// to reach the BMC: the host opens before every use.
	Open(ctx context.Context, t Target) (BMC, error)
}

// Info names a driver: what `drivers list` shows.
type Info struct {
	Name            string
	Version         string
	ProtocolVersion int
	Capabilities    []Capability
}

// Capability is something a driver can do beyond the power calls.
type Capability string

const (
	// CapSetPassword: the driver's BMCs implement PasswordSetter.
	CapSetPassword Capability = "set_password"
	// CapVirtualMedia: the driver may attach virtual media.
	CapVirtualMedia Capability = "virtual_media"
	// CapBootOverride: the driver may set a boot override.
	CapBootOverride Capability = "boot_override"
)

// PowerState is a machine's power as its BMC reports it.
type PowerState string

const (
	PowerOn      PowerState = "on"
	PowerOff     PowerState = "off"
	PowerUnknown PowerState = "unknown" // the BMC answered with a state the driver does not know
)

// BootTarget is a device a boot override selects.
type BootTarget string

const (
	BootPXE  BootTarget = "pxe"
	BootDisk BootTarget = "disk"
	BootCD   BootTarget = "cd"
	BootBIOS BootTarget = "bios"
	BootNone BootTarget = "none" // clears an override
)

// BootOverride selects the boot device, for the next boot only unless
// Persistent.
type BootOverride struct {
	Target     BootTarget
	Persistent bool
}

// Target is one BMC to open: where it is and how to log in. Printing a
// Target (fmt with any verb, slog) shows "[redacted]" for the password.
type Target struct {
	Address  string
	Username string
	// Password is the BMC password: hand it to the BMC, never to a log.
	Password string
	// Timeout bounds each BMC call (0: the driver's default).
	Timeout time.Duration
	// InsecureSkipVerify accepts any TLS certificate from the BMC.
	InsecureSkipVerify bool
	// BasicAuth asks an HTTP driver for Basic credentials on every
	// request instead of a session.
	BasicAuth bool
}

const redacted = "[redacted]"

// String shows everything but the password.
func (t Target) String() string {
	return fmt.Sprintf("driver.Target{Address:%s Username:%s Password:%s Timeout:%s InsecureSkipVerify:%t BasicAuth:%t}",
		t.Address, t.Username, redacted, t.Timeout, t.InsecureSkipVerify, t.BasicAuth)
}

// GoString serves %#v like String.
func (t Target) GoString() string { return t.String() }

// Format serves every fmt verb the redacted form; without it a verb that
// bypasses String would print the fields.
func (t Target) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(t.String())) }

// LogValue keeps the password out of slog output.
func (t Target) LogValue() slog.Value {
	return slog.GroupValue(slog.String("address", t.Address), slog.String("username", t.Username),
		slog.String("password", redacted))
}

// MarshalJSON keeps the password out of JSON.
func (t Target) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Address  string `json:"address"`
		Username string `json:"username"`
		Password string `json:"password"`
	}{t.Address, t.Username, redacted})
}

// scrubber removes known secrets from text that crosses to the host's
// logs or errors. The host adds every password it hands a driver, so a
// driver that echoes one (in a log line, an error, a panic) cannot leak
// it further. It is safe for concurrent use: the driver's output is read
// while calls add passwords.
type scrubber struct {
	mu      sync.Mutex
	secrets []string
}

func newScrubber() *scrubber { return &scrubber{} }

func (s *scrubber) add(secret string) {
	if secret == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.secrets, secret) {
		s.secrets = append(s.secrets, secret)
	}
}

func (s *scrubber) scrub(text string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, secret := range s.secrets {
		text = strings.ReplaceAll(text, secret, redacted)
	}
	return text
}
