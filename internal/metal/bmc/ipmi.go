package bmc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/chassis"
	"github.com/bougou/go-ipmi/pkg/rmcpplus"
	"github.com/bougou/go-ipmi/pkg/types"
)

// ipmiDriver speaks IPMI 2.0 over LAN (RMCP+), cipher suite 3
// (HMAC-SHA1 authentication and integrity, AES-CBC-128 confidentiality):
// the suite ipmitool's -C 3 uses and every IPMI 2.0 BMC must offer. Each
// call opens a session and closes it, as ipmitool does: BMCs allow few
// sessions, and one left open by a dead agent would hold a slot until the
// BMC times it out.
type ipmiDriver struct {
	ep    Endpoint
	creds Credentials
	opts  Options
	// mu serialises calls: one session at a time per BMC from this agent.
	mu sync.Mutex
}

func newIPMI(address string, creds Credentials, opts Options) (*ipmiDriver, error) {
	ep, err := ParseAddress("ipmi", address)
	if err != nil {
		return nil, err
	}
	if err := creds.validate(); err != nil {
		return nil, newError("ipmi", ep.String(), "new", ErrInvalidArgument, creds, err.Error())
	}
	if len(creds.username) > rmcpplus.MaxUserNameLength {
		return nil, newError("ipmi", ep.String(), "new", ErrInvalidArgument, creds,
			fmt.Sprintf("IPMI user names are at most %d bytes", rmcpplus.MaxUserNameLength))
	}
	if len(creds.password) > 20 {
		// RMCP+ carries at most 20 bytes of password (IPMI 2.0 §13.31).
		return nil, newError("ipmi", ep.String(), "new", ErrInvalidArgument, creds, "IPMI passwords are at most 20 bytes")
	}
	return &ipmiDriver{ep: ep, creds: creds, opts: opts}, nil
}

func (d *ipmiDriver) Name() string { return "ipmi" }

func (d *ipmiDriver) PowerOn(ctx context.Context) error {
	return d.control(ctx, "power on", chassis.ChassisControlPowerUp)
}

func (d *ipmiDriver) PowerOff(ctx context.Context) error {
	return d.control(ctx, "power off", chassis.ChassisControlPowerDown)
}

func (d *ipmiDriver) Shutdown(ctx context.Context) error {
	return d.control(ctx, "shutdown", chassis.ChassisControlSoftShutdown)
}

// PowerCycle sends a chassis power cycle when the machine is on; the IPMI
// spec leaves a cycle of a machine that is off undefined (many BMCs ignore
// it), so that one is powered on instead.
func (d *ipmiDriver) PowerCycle(ctx context.Context) error {
	return d.session(ctx, "power cycle", func(ctx context.Context, c *client.Client) error {
		st, err := c.GetChassisStatus(ctx)
		if err != nil {
			return err
		}
		control := chassis.ChassisControlPowerCycle
		if !st.PowerIsOn {
			control = chassis.ChassisControlPowerUp
		}
		_, err = c.ChassisControl(ctx, control)
		return err
	})
}

func (d *ipmiDriver) PowerStatus(ctx context.Context) (PowerState, error) {
	state := PowerUnknown
	err := d.session(ctx, "power status", func(ctx context.Context, c *client.Client) error {
		st, err := c.GetChassisStatus(ctx)
		if err != nil {
			return err
		}
		state = PowerOff
		if st.PowerIsOn {
			state = PowerOn
		}
		return nil
	})
	return state, err
}

// SetBootOverride sets the boot flags (Set System Boot Options, parameter
// 5). A BMC that refuses the parameter (OpenIPMI's ipmi_sim does) gets
// ErrUnsupported: PXE-first boot needs no override.
func (d *ipmiDriver) SetBootOverride(ctx context.Context, o BootOverride) error {
	if err := o.validate(); err != nil {
		return newError("ipmi", d.ep.String(), "set boot override", ErrInvalidArgument, d.creds, err.Error())
	}
	selector := map[BootTarget]types.BootDeviceSelector{
		BootPXE:  types.BootDeviceSelectorForcePXE,
		BootDisk: types.BootDeviceSelectorForceHardDrive,
		BootCD:   types.BootDeviceSelectorForceCDROM,
		BootBIOS: types.BootDeviceSelectorForceBIOSSetup,
		BootNone: types.BootDeviceSelectorNoOverride,
	}[o.Target]
	return d.session(ctx, "set boot override", func(ctx context.Context, c *client.Client) error {
		return c.SetBootDevice(ctx, selector, types.BIOSBootTypeLegacy, o.Persistent)
	})
}

func (d *ipmiDriver) InsertVirtualMedia(context.Context, string) error {
	return newError("ipmi", d.ep.String(), "insert virtual media", ErrUnsupported, d.creds,
		"IPMI has no standard virtual media; use PXE or a Redfish BMC")
}

func (d *ipmiDriver) EjectVirtualMedia(context.Context) error {
	return newError("ipmi", d.ep.String(), "eject virtual media", ErrUnsupported, d.creds,
		"IPMI has no standard virtual media; use PXE or a Redfish BMC")
}

// SetPassword sets the password of the user the driver logs in as (IPMI
// 2.0 §22.30, Set User Password), found by name among the BMC's user ids.
// Passwords are at most MaxIPMIPassword bytes, printable ASCII: longer
// ones are stored in a form not every BMC authenticates with.
func (d *ipmiDriver) SetPassword(ctx context.Context, password string) error {
	// The new password is scrubbed from errors as the current one is.
	scrub := NewCredentials(d.creds.username, password)
	if len(password) == 0 || len(password) > MaxIPMIPassword {
		return newError("ipmi", d.ep.String(), "set password", ErrInvalidArgument, scrub,
			fmt.Sprintf("a new IPMI password must be 1 to %d bytes", MaxIPMIPassword))
	}
	for _, c := range password {
		if c < 0x21 || c > 0x7e {
			return newError("ipmi", d.ep.String(), "set password", ErrInvalidArgument, scrub, "a new IPMI password must be printable ASCII")
		}
	}
	err := d.session(ctx, "set password", func(ctx context.Context, c *client.Client) error {
		id, err := d.userID(ctx, c)
		if err != nil {
			return err
		}
		_, err = c.SetUserPassword(ctx, id, password, false)
		return err
	})
	var e *Error
	if errors.As(err, &e) {
		e.Detail = scrub.scrub(e.Detail)
	}
	return err
}

// userID finds the id of the driver's user: Get User Name over the ids
// Get User Access says the BMC has (1-based; id 1 is the anonymous user).
func (d *ipmiDriver) userID(ctx context.Context, c *client.Client) (uint8, error) {
	// Channel 0x0e is "this channel": the LAN channel of the session.
	acc, err := c.GetUserAccess(ctx, 0x0e, 1)
	if err != nil {
		return 0, err
	}
	for id := uint8(1); id <= acc.MaxUsersIDCount && id < 64; id++ {
		res, err := c.GetUsername(ctx, id)
		if err != nil {
			continue // an id without a name set
		}
		if strings.TrimRight(res.Username, "\x00 ") == d.creds.username {
			return id, nil
		}
	}
	return 0, fmt.Errorf("user %q is not among the BMC's %d user ids", d.creds.username, acc.MaxUsersIDCount)
}

// Close has nothing to release: every call closes its own session.
func (d *ipmiDriver) Close(context.Context) error { return nil }

func (d *ipmiDriver) control(ctx context.Context, op string, control chassis.ChassisControl) error {
	return d.session(ctx, op, func(ctx context.Context, c *client.Client) error {
		_, err := c.ChassisControl(ctx, control)
		return err
	})
}

// session opens an RMCP+ session, runs fn and closes the session, mapping
// any failure to a typed, scrubbed *Error.
func (d *ipmiDriver) session(ctx context.Context, op string, fn func(context.Context, *client.Client) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, cancel := callContext(ctx, d.opts)
	defer cancel()
	log := d.opts.Logger.With("driver", "ipmi", "bmc", d.ep.String(), "op", op)

	c, err := client.NewClient(d.ep.Host, d.ep.Port, d.creds.username, d.creds.password)
	if err != nil {
		return newError("ipmi", d.ep.String(), op, ErrInvalidArgument, d.creds, err.Error())
	}
	c.WithInterface(client.InterfaceLanplus).WithCipherSuiteID(types.CipherSuiteID3)
	if err := c.Connect(ctx); err != nil {
		// No session to close, but go-ipmi opened a UDP socket: a Close
		// with an ended context skips the Close Session exchange and only
		// releases the socket.
		done, end := context.WithCancel(ctx)
		end()
		_ = c.Close(done)
		e := d.classify(op, err, true)
		log.DebugContext(ctx, "bmc call failed", "error", e)
		return e
	}
	// Close with a context of its own: a session must be closed even when
	// the call ran out of time, or it holds one of the BMC's few slots.
	defer func() {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), d.opts.Timeout)
		defer ccancel()
		if err := c.Close(cctx); err != nil {
			log.DebugContext(ctx, "closing the IPMI session failed", "error", d.creds.scrub(err.Error()))
		}
	}()
	if err := fn(ctx, c); err != nil {
		e := d.classify(op, err, false)
		log.DebugContext(ctx, "bmc call failed", "error", e)
		return e
	}
	log.DebugContext(ctx, "bmc call done")
	return nil
}

// classify maps a go-ipmi error to a kind. While connecting, silence means
// the BMC is unreachable and a refused RAKP handshake means bad
// credentials; once in session, the BMC's completion code decides.
// go-ipmi reports a failed handshake with %v, not %w (the chain is cut), so
// the handshake's kinds are also recognised by their text.
func (d *ipmiDriver) classify(op string, err error, connecting bool) *Error {
	kind := ErrRefused
	var (
		rmcp *types.RmcpStatusError
		resp *types.ResponseError
		nerr net.Error
	)
	text := err.Error()
	switch {
	case errors.Is(err, client.ErrRAKPAuthentication), strings.Contains(text, client.ErrRAKPAuthentication.Error()):
		kind = ErrAuth
	case errors.As(err, &rmcp):
		kind = rmcpKind(rmcp.StatusCode())
	case connecting && rmcpTextKind(text) != nil:
		kind = rmcpTextKind(text)
	case errors.As(err, &resp):
		switch resp.CompletionCode() {
		case types.CodeInvalidCommand, types.CodeRequestDataFieldInvalid, types.CodeNotSupported,
			types.CodeParameterNotSupported:
			kind = ErrUnsupported
		case types.CodeInsufficientPrivilege:
			kind = ErrAuth
		}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), errors.As(err, &nerr),
		strings.Contains(text, "no datagram matched"),
		connecting && strings.Contains(text, "Get Channel Authentication Capabilities"):
		kind = ErrUnreachable
	}
	e := newError("ipmi", d.ep.String(), op, kind, d.creds, text)
	e.Err = contextError(err)
	return e
}

// rmcpKind maps an RMCP+ session-setup status to a kind.
func rmcpKind(code types.RmcpStatusCode) error {
	switch code {
	case types.RmcpStatusCodeUnauthorizedName, types.RmcpStatusCodeInvalidIntegrityCheckValue,
		types.RmcpStatusCodeUnauthorizedRoleOfPriLevel, types.RmcpStatusCodeInvalidRole,
		types.RmcpStatusCodeUnauthorizedGUID, types.RmcpStatusCodeInvalidNameLength:
		return ErrAuth
	case types.RmcpStatusCodeNoCipherSuiteMatch, types.RmcpStatusCodeInvalidAuthAlg,
		types.RmcpStatusCodeInvalidIntegrityAlg, types.RmcpStatusCodeInvalidConfidentAlg:
		return ErrUnsupported
	}
	return ErrRefused
}

// rmcpTextKind finds an RMCP+ status in an error's text, nil if none.
func rmcpTextKind(text string) error {
	for code := types.RmcpStatusCode(1); code <= types.RmcpStatusCodeIllegalParameter; code++ {
		if strings.Contains(text, types.NewRmcpStatusError(code).Error()) {
			return rmcpKind(code)
		}
	}
	return nil
}
