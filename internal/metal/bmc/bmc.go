// Package bmc drives a machine's baseboard management controller: power on,
// off, cycle and status, a boot override and virtual media where the BMC
// offers them. Two drivers sit behind one interface: "ipmi" (IPMI 2.0 over
// LAN, RMCP+ cipher suite 3, github.com/bougou/go-ipmi) and "redfish"
// (DMTF Redfish over HTTP(S), github.com/stmcginnis/gofish). A third
// kind runs out of process: a driver binary built with pkg/driver, named
// "plugin:<path>" or registered in a Registry, which lists the built-ins
// and the external drivers with their versions.
//
// Only the site agent uses it, and only for enrolled machines of its site:
// the control plane never talks to a BMC. The package must never print,
// log or return a BMC password; Credentials redacts itself in every format,
// and every error the drivers return is scrubbed of it.
package bmc

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Driver is what the site agent needs from a BMC. Every method honours its
// context and is bounded by the driver's own timeout as well; a method a BMC
// cannot do returns an error that matches ErrUnsupported.
type Driver interface {
	// Name is the driver's registry name: "ipmi" or "redfish".
	Name() string
	// PowerOn turns the machine on; a machine already on stays on.
	PowerOn(ctx context.Context) error
	// PowerOff cuts power at once (no guest shutdown); a machine already
	// off stays off.
	PowerOff(ctx context.Context) error
	// Shutdown asks the guest to shut down (ACPI power button); it returns
	// when the BMC accepted the request, not when the machine is off.
	Shutdown(ctx context.Context) error
	// PowerCycle turns the machine off and on again; a machine that is off
	// is turned on.
	PowerCycle(ctx context.Context) error
	// PowerStatus reads the machine's power state.
	PowerStatus(ctx context.Context) (PowerState, error)
	// SetBootOverride sets the device the machine boots from next (or from
	// now on, when Persistent).
	SetBootOverride(ctx context.Context, o BootOverride) error
	// InsertVirtualMedia attaches the image at imageURL (http or https) as
	// a virtual CD.
	InsertVirtualMedia(ctx context.Context, imageURL string) error
	// EjectVirtualMedia detaches any virtual CD.
	EjectVirtualMedia(ctx context.Context) error
	// Close releases what the driver holds (a Redfish session). The driver
	// must not be used afterwards.
	Close(ctx context.Context) error
}

// PasswordSetter is a driver that can change the password of the account
// it logs in with (a BMC password rotation). The driver keeps using the
// credentials it was built with: a caller checks the new password by
// building a driver with it.
type PasswordSetter interface {
	// SetPassword makes password the account's password on the BMC.
	SetPassword(ctx context.Context, password string) error
}

// MaxIPMIPassword is the longest password every IPMI 2.0 BMC takes in
// full: the 20-byte form is optional, and a BMC that stores 16 bytes
// (OpenIPMI's ipmi_sim does) accepts a 20-byte one and then refuses it.
const MaxIPMIPassword = 16

// PowerState is a machine's power as its BMC reports it.
type PowerState string

const (
	PowerOn      PowerState = "on"
	PowerOff     PowerState = "off"
	PowerUnknown PowerState = "unknown" // the BMC answered, but with a state we do not know
)

// BootTarget is a device a boot override selects.
type BootTarget string

const (
	BootPXE  BootTarget = "pxe"
	BootDisk BootTarget = "disk"
	BootCD   BootTarget = "cd"
	BootBIOS BootTarget = "bios" // the firmware's setup screen
	// BootNone clears an override: the machine boots by its own order.
	BootNone BootTarget = "none"
)

var bootTargets = []BootTarget{BootPXE, BootDisk, BootCD, BootBIOS, BootNone}

// BootOverride selects the boot device. It applies to the next boot only
// unless Persistent.
type BootOverride struct {
	Target     BootTarget
	Persistent bool
}

func (o BootOverride) validate() error {
	if !slices.Contains(bootTargets, o.Target) {
		return fmt.Errorf("boot target %q is not one of %v", o.Target, bootTargets)
	}
	return nil
}

// Options tune a driver. The zero value is ready to use.
type Options struct {
	// Timeout bounds every call (default 30 s); a caller's earlier context
	// deadline wins.
	Timeout time.Duration
	// Logger receives one debug line per BMC call (never a password).
	Logger *slog.Logger
	// InsecureSkipVerify accepts any TLS certificate from a Redfish BMC;
	// BMCs ship self-signed certificates far more often than not.
	InsecureSkipVerify bool
	// RootCAs verifies a Redfish BMC's certificate (default: the system's
	// pool), for a site that issues its BMCs certificates from its own CA.
	RootCAs *x509.CertPool
	// BasicAuth makes the Redfish driver send HTTP Basic credentials on
	// every request instead of opening a session (POST
	// /redfish/v1/SessionService/Sessions, then X-Auth-Token).
	BasicAuth bool
}

const defaultTimeout = 30 * time.Second

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = defaultTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Drivers lists the driver names New accepts.
func Drivers() []string { return []string{"ipmi", "redfish"} }

// New returns the driver called name for the BMC at address. It refuses an
// address that is not a plain host[:port] (ipmi) or an http(s) URL or
// host[:port] (redfish) before it sends anything. A name
// "plugin:<path>" starts the out-of-process driver at path (pkg/driver)
// and opens the BMC through it; the process ends when the Driver is
// closed. A Registry also builds external drivers by their own names.
func New(name, address string, creds Credentials, opts Options) (Driver, error) {
	opts = opts.withDefaults()
	var (
		d   Driver
		err error
	)
	switch path, external := strings.CutPrefix(name, PluginPrefix); {
	case name == "ipmi":
		d, err = newIPMI(address, creds, opts)
	case name == "redfish":
		d, err = newRedfish(address, creds, opts)
	case external && path != "":
		d, err = newPlugin(name, path, address, creds, opts)
	default:
		err = &Error{Driver: name, Address: printable(address), Op: "new", Kind: ErrUnsupported,
			Detail: fmt.Sprintf("unknown driver %q (want one of %v)", name, Drivers())}
	}
	if err != nil {
		// An address may carry the password by mistake (a URL's path, a
		// user:password@ the parser did not recognise): scrub it.
		var e *Error
		if errors.As(err, &e) {
			e.Address, e.Detail = creds.scrub(e.Address), creds.scrub(e.Detail)
		}
		return nil, err
	}
	return d, nil
}

// callContext bounds one BMC call by the driver's timeout.
func callContext(ctx context.Context, o Options) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, o.Timeout)
}
