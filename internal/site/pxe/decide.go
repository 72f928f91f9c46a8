package pxe

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
)

// Phase says which service asks the Decider, so a Decider can mint per-boot
// secrets (a discovery token) only when the script that carries them is
// rendered, not on every DHCP packet of the same boot.
type Phase int

const (
	// PhaseDHCP: a DHCP or proxyDHCP packet; only the kind of the answer is used.
	PhaseDHCP Phase = iota + 1
	// PhaseScript: the machine's iPXE script is being rendered.
	PhaseScript
)

func (p Phase) String() string {
	switch p {
	case PhaseDHCP:
		return "dhcp"
	case PhaseScript:
		return "script"
	default:
		return fmt.Sprintf("phase(%d)", int(p))
	}
}

// Request is what the server knows about a booting machine when it asks.
type Request struct {
	MAC   net.HardwareAddr
	Phase Phase
	// Arch is the client system architecture (DHCP option 93, RFC 4578):
	// 0 BIOS, 7 and 9 UEFI x86-64. HasArch is false when the client sent none
	// (an HTTP script request from a machine not seen on DHCP).
	Arch    uint16
	HasArch bool
	// UserClass is DHCP option 77 ("iPXE" once the chainloaded iPXE asks).
	UserClass string
}

// Boot is the Decider's answer: one of Ramdisk, LocalDisk or Unknown.
type Boot interface{ isBoot() }

// Ramdisk boots a kernel and initrd over HTTP.
//
// Kernel and Initrd are references: "sha256:<64 hex>" is served from the
// site's content-addressed cache (fetched through from upstream on first use),
// an http:// or https:// URL is handed to iPXE as is, and any other name is a
// file in Config.FilesDir.
type Ramdisk struct {
	Kernel  string
	Initrd  string
	Cmdline string
	// Token is a per-boot secret appended to the kernel command line as
	// TokenArg=<token> (a single-use discovery token). It is never logged.
	Token    Secret
	TokenArg string // default "bc.token"
}

// LocalDisk boots the machine's first disk: sanboot on BIOS, exit to the
// firmware's next boot entry on UEFI.
type LocalDisk struct{}

// Unknown means the site does not know the machine: no DHCP boot answer, and
// a script that waits and asks again.
type Unknown struct{}

func (Ramdisk) isBoot()   {}
func (LocalDisk) isBoot() {}
func (Unknown) isBoot()   {}

// Decider says what a machine boots. It is supplied by the site agent and may
// be called several times per boot (DHCP, proxyDHCP, script) and
// concurrently.
type Decider interface {
	Decide(ctx context.Context, req Request) (Boot, error)
}

// DeciderFunc adapts a function to a Decider.
type DeciderFunc func(ctx context.Context, req Request) (Boot, error)

// Decide calls f.
func (f DeciderFunc) Decide(ctx context.Context, req Request) (Boot, error) { return f(ctx, req) }

// Secret is a value that must never reach a log: every way of printing it
// prints a placeholder. Reveal returns the value for the one place that needs
// it (the rendered script).
type Secret string

const redacted = "[redacted]"

// Reveal returns the secret's value.
func (s Secret) Reveal() string { return string(s) }

// String hides the value from fmt's %s and %v.
func (s Secret) String() string { return redacted }

// GoString hides the value from %#v.
func (s Secret) GoString() string { return redacted }

// MarshalText hides the value from encoders (JSON logs of a whole Ramdisk).
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// LogValue hides the value from slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// validToken accepts the characters of base64, base64url and hex tokens; the
// iPXE script language expands "${...}" and ends a command at a newline, so
// anything else could change the script.
func validToken(s string) bool {
	if s == "" || len(s) > 512 {
		return false
	}
	for _, c := range s {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.ContainsRune("-_.~+/=", c)
		if !ok {
			return false
		}
	}
	return true
}

// validScriptText refuses control characters, which would end or split an
// iPXE command line.
func validScriptText(s string) bool {
	for _, c := range s {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// normalizeMAC parses a 6-byte Ethernet address in any form net.ParseMAC
// accepts, so "AA-BB-…" and "aa:bb:…" name the same machine.
func normalizeMAC(s string) (net.HardwareAddr, error) {
	hw, err := net.ParseMAC(s)
	if err != nil {
		return nil, fmt.Errorf("mac %q: %w", s, err)
	}
	if len(hw) != 6 {
		return nil, fmt.Errorf("mac %q: want a 6-byte Ethernet address", s)
	}
	return hw, nil
}
