package bmc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"
)

// redfishDriver speaks DMTF Redfish through gofish. It opens a session on
// first use (POST /redfish/v1/SessionService/Sessions, then X-Auth-Token on
// every request), or sends Basic credentials when Options.BasicAuth, and
// reopens the session once when the BMC says it expired.
type redfishDriver struct {
	ep    Endpoint
	creds Credentials
	opts  Options

	mu  sync.Mutex
	api *gofish.APIClient // nil until the first call connects
}

func newRedfish(address string, creds Credentials, opts Options) (*redfishDriver, error) {
	ep, err := ParseAddress("redfish", address)
	if err != nil {
		return nil, err
	}
	if err := creds.validate(); err != nil {
		return nil, newError("redfish", ep.String(), "new", ErrInvalidArgument, creds, err.Error())
	}
	return &redfishDriver{ep: ep, creds: creds, opts: opts}, nil
}

func (d *redfishDriver) Name() string { return "redfish" }

func (d *redfishDriver) PowerOn(ctx context.Context) error {
	return d.call(ctx, "power on", func(sys *schemas.ComputerSystem) error {
		if sys.PowerState == schemas.OnPowerState {
			return nil
		}
		return reset(sys, schemas.OnResetType)
	})
}

func (d *redfishDriver) PowerOff(ctx context.Context) error {
	return d.call(ctx, "power off", func(sys *schemas.ComputerSystem) error {
		if sys.PowerState == schemas.OffPowerState {
			return nil
		}
		return reset(sys, schemas.ForceOffResetType)
	})
}

func (d *redfishDriver) Shutdown(ctx context.Context) error {
	return d.call(ctx, "shutdown", func(sys *schemas.ComputerSystem) error {
		if sys.PowerState == schemas.OffPowerState {
			return nil
		}
		return reset(sys, schemas.GracefulShutdownResetType)
	})
}

// PowerCycle uses the BMC's PowerCycle reset where it offers one, else
// ForceRestart; a machine that is off is turned on.
func (d *redfishDriver) PowerCycle(ctx context.Context) error {
	return d.call(ctx, "power cycle", func(sys *schemas.ComputerSystem) error {
		if sys.PowerState == schemas.OffPowerState {
			return reset(sys, schemas.OnResetType)
		}
		if allowed, _ := sys.GetSupportedResetTypes(); len(allowed) > 0 && !slices.Contains(allowed, schemas.PowerCycleResetType) {
			return reset(sys, schemas.ForceRestartResetType)
		}
		return reset(sys, schemas.PowerCycleResetType)
	})
}

func (d *redfishDriver) PowerStatus(ctx context.Context) (PowerState, error) {
	state := PowerUnknown
	err := d.call(ctx, "power status", func(sys *schemas.ComputerSystem) error {
		switch sys.PowerState {
		case schemas.OnPowerState:
			state = PowerOn
		case schemas.OffPowerState:
			state = PowerOff
		}
		return nil
	})
	return state, err
}

var redfishBootSource = map[BootTarget]schemas.BootSource{
	BootPXE:  schemas.PxeBootSource,
	BootDisk: schemas.HddBootSource,
	BootCD:   schemas.CdBootSource,
	BootBIOS: schemas.BiosSetupBootSource,
	BootNone: schemas.NoneBootSource,
}

func (d *redfishDriver) SetBootOverride(ctx context.Context, o BootOverride) error {
	if err := o.validate(); err != nil {
		return newError("redfish", d.ep.String(), "set boot override", ErrInvalidArgument, d.creds, err.Error())
	}
	return d.call(ctx, "set boot override", func(sys *schemas.ComputerSystem) error {
		source := redfishBootSource[o.Target]
		if allowed := sys.Boot.AllowableBootSourceOverrideTargetValues; len(allowed) > 0 && !slices.Contains(allowed, source) {
			return unsupported{fmt.Sprintf("the BMC offers boot targets %v, not %s", allowed, source)}
		}
		enabled := schemas.OnceBootSourceOverrideEnabled
		switch {
		case o.Target == BootNone:
			enabled = schemas.DisabledBootSourceOverrideEnabled
		case o.Persistent:
			enabled = schemas.ContinuousBootSourceOverrideEnabled
		}
		return sys.SetBoot(&schemas.Boot{BootSourceOverrideTarget: source, BootSourceOverrideEnabled: enabled})
	})
}

func (d *redfishDriver) InsertVirtualMedia(ctx context.Context, imageURL string) error {
	u, err := url.Parse(imageURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return newError("redfish", d.ep.String(), "insert virtual media", ErrInvalidArgument, d.creds,
			fmt.Sprintf("image URL %q is not an http(s) URL without credentials", printable(imageURL)))
	}
	return d.call(ctx, "insert virtual media", func(sys *schemas.ComputerSystem) error {
		vm, err := cdMedia(sys)
		if err != nil {
			return err
		}
		if vm.Image != "" || (vm.Inserted != nil && *vm.Inserted) {
			// The schema lets a service refuse an insert over inserted media.
			if _, err := vm.EjectMedia(); err != nil {
				return err
			}
		}
		inserted, writeProtected := true, true
		_, err = vm.InsertMedia(&schemas.VirtualMediaInsertMediaParameters{
			Image: imageURL, Inserted: &inserted, WriteProtected: &writeProtected,
		})
		return err
	})
}

func (d *redfishDriver) EjectVirtualMedia(ctx context.Context) error {
	return d.call(ctx, "eject virtual media", func(sys *schemas.ComputerSystem) error {
		vm, err := cdMedia(sys)
		if err != nil {
			return err
		}
		if vm.Inserted != nil && !*vm.Inserted && vm.Image == "" {
			return nil
		}
		_, err = vm.EjectMedia()
		return err
	})
}

// Close ends the driver's session, if it opened one.
func (d *redfishDriver) Close(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.api == nil {
		return nil
	}
	ctx, cancel := callContext(ctx, d.opts)
	defer cancel()
	d.api.WithContext(ctx).Logout()
	d.api = nil
	return nil
}

// unsupported marks a failure found before asking the BMC (a reset type or
// boot target it does not list).
type unsupported struct{ why string }

func (u unsupported) Error() string { return u.why }

// reset posts ComputerSystem.Reset after checking the BMC lists the type.
func reset(sys *schemas.ComputerSystem, t schemas.ResetType) error {
	if allowed, _ := sys.GetSupportedResetTypes(); len(allowed) > 0 && !slices.Contains(allowed, t) {
		return unsupported{fmt.Sprintf("the BMC offers reset types %v, not %s", allowed, t)}
	}
	_, err := sys.Reset(t)
	return err
}

// cdMedia finds a virtual CD/DVD drive: on the system (Redfish 1.13+) or
// on a manager of it.
func cdMedia(sys *schemas.ComputerSystem) (*schemas.VirtualMedia, error) {
	all, err := sys.VirtualMedia()
	if err != nil {
		return nil, err
	}
	if len(all) == 0 {
		managers, err := sys.ManagedBy()
		if err != nil {
			return nil, err
		}
		for _, m := range managers {
			media, err := m.VirtualMedia()
			if err != nil {
				return nil, err
			}
			all = append(all, media...)
		}
	}
	for _, vm := range all {
		if slices.Contains(vm.MediaTypes, schemas.CDVirtualMediaType) || slices.Contains(vm.MediaTypes, schemas.DVDVirtualMediaType) {
			return vm, nil
		}
	}
	return nil, unsupported{"the BMC offers no virtual CD or DVD drive"}
}

// call runs fn against the machine's ComputerSystem, connecting first when
// needed and once more when the session expired.
func (d *redfishDriver) call(ctx context.Context, op string, fn func(*schemas.ComputerSystem) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, cancel := callContext(ctx, d.opts)
	defer cancel()
	log := d.opts.Logger.With("driver", "redfish", "bmc", d.ep.String(), "op", op)

	err := d.attemptLocked(ctx, fn)
	if err != nil && d.api != nil && !d.opts.BasicAuth && statusOf(err) == http.StatusUnauthorized {
		// The session expired or the BMC restarted: log in again, once.
		log.DebugContext(ctx, "session refused; logging in again")
		d.api = nil
		err = d.attemptLocked(ctx, fn)
	}
	if err != nil {
		e := d.classify(op, err)
		log.DebugContext(ctx, "bmc call failed", "error", e)
		return e
	}
	log.DebugContext(ctx, "bmc call done")
	return nil
}

func (d *redfishDriver) attemptLocked(ctx context.Context, fn func(*schemas.ComputerSystem) error) error {
	if d.api == nil {
		api, err := gofish.ConnectContext(ctx, gofish.ClientConfig{
			Endpoint:   d.ep.String(),
			Username:   d.creds.username,
			Password:   d.creds.password,
			Insecure:   d.opts.InsecureSkipVerify,
			BasicAuth:  d.opts.BasicAuth,
			HTTPClient: d.httpClient(),
		})
		if err != nil {
			return err
		}
		d.api = api
	}
	api := d.api.WithContext(ctx)
	systems, err := api.Service.Systems()
	if err != nil {
		return err
	}
	if len(systems) != 1 {
		return fmt.Errorf("the BMC manages %d systems; this driver drives a BMC of exactly one", len(systems))
	}
	return fn(systems[0])
}

// httpClient never follows a redirect: a BMC that points elsewhere would
// otherwise receive our session token at another host.
func (d *redfishDriver) httpClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: d.opts.RootCAs,
		InsecureSkipVerify: d.opts.InsecureSkipVerify} //nolint:gosec // BMCs ship self-signed certificates; the operator chooses
	return &http.Client{
		Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// statusOf finds the HTTP status a gofish error carries, 0 if none.
func statusOf(err error) int {
	var re *schemas.Error
	if errors.As(err, &re) {
		return re.HTTPReturnedStatusCode
	}
	var ce *schemas.CollectionError
	if errors.As(err, &ce) {
		for _, f := range ce.Failures {
			if s := statusOf(f); s != 0 {
				return s
			}
		}
	}
	return 0
}

func (d *redfishDriver) classify(op string, err error) *Error {
	kind := ErrRefused
	var (
		u    unsupported
		nerr net.Error
	)
	status := statusOf(err)
	switch {
	case errors.As(err, &u):
		kind = ErrUnsupported
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		kind = ErrAuth
	case status == http.StatusNotFound, status == http.StatusMethodNotAllowed, status == http.StatusNotImplemented:
		kind = ErrUnsupported
	case status != 0:
		kind = ErrRefused
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), errors.As(err, &nerr):
		kind = ErrUnreachable
	}
	e := newError("redfish", d.ep.String(), op, kind, d.creds, redfishDetail(err))
	e.Err = contextError(err)
	return e
}

// redfishDetail says what the BMC answered: status, code and message from a
// Redfish error body, shortened; any other error as it is.
func redfishDetail(err error) string {
	var re *schemas.Error
	if !errors.As(err, &re) {
		var ce *schemas.CollectionError
		if errors.As(err, &ce) {
			for _, f := range ce.Failures {
				if errors.As(f, &re) {
					break
				}
			}
		}
	}
	if re == nil {
		return err.Error()
	}
	msg := re.Message
	for _, info := range re.ExtendedInfos {
		if info.Message != "" {
			msg = info.Message
			break
		}
	}
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	parts := []string{fmt.Sprintf("HTTP %d", re.HTTPReturnedStatusCode)}
	if re.Code != "" {
		parts = append(parts, re.Code)
	}
	if msg = strings.TrimSpace(msg); msg != "" {
		parts = append(parts, msg)
	}
	return strings.Join(parts, ": ")
}
