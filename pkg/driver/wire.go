package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	driverv1 "github.com/better-compute/better-compute/gen/bettercompute/driver/v1"
)

// The wire forms of this package's types. Each table is the one place a
// value and its enum meet, so adding a target or a kind is one line.

var powerStates = map[PowerState]driverv1.PowerState{
	PowerOn:      driverv1.PowerState_POWER_STATE_ON,
	PowerOff:     driverv1.PowerState_POWER_STATE_OFF,
	PowerUnknown: driverv1.PowerState_POWER_STATE_UNKNOWN,
}

var bootTargets = map[BootTarget]driverv1.BootTarget{
	BootPXE:  driverv1.BootTarget_BOOT_TARGET_PXE,
	BootDisk: driverv1.BootTarget_BOOT_TARGET_DISK,
	BootCD:   driverv1.BootTarget_BOOT_TARGET_CD,
	BootBIOS: driverv1.BootTarget_BOOT_TARGET_BIOS,
	BootNone: driverv1.BootTarget_BOOT_TARGET_NONE,
}

var capabilities = map[Capability]driverv1.Capability{
	CapSetPassword:  driverv1.Capability_CAPABILITY_SET_PASSWORD,
	CapVirtualMedia: driverv1.Capability_CAPABILITY_VIRTUAL_MEDIA,
	CapBootOverride: driverv1.Capability_CAPABILITY_BOOT_OVERRIDE,
}

var errorKinds = map[error]driverv1.ErrorKind{
	ErrAuth:            driverv1.ErrorKind_ERROR_KIND_AUTH,
	ErrUnreachable:     driverv1.ErrorKind_ERROR_KIND_UNREACHABLE,
	ErrUnsupported:     driverv1.ErrorKind_ERROR_KIND_UNSUPPORTED,
	ErrInvalidAddress:  driverv1.ErrorKind_ERROR_KIND_INVALID_ADDRESS,
	ErrInvalidArgument: driverv1.ErrorKind_ERROR_KIND_INVALID_ARGUMENT,
	ErrRefused:         driverv1.ErrorKind_ERROR_KIND_REFUSED,
}

// errorCodes gives each kind a gRPC code, so a failure reads sensibly
// even to a client that ignores the Failure detail.
var errorCodes = map[error]codes.Code{
	ErrAuth:            codes.Unauthenticated,
	ErrUnreachable:     codes.Unavailable,
	ErrUnsupported:     codes.Unimplemented,
	ErrInvalidAddress:  codes.InvalidArgument,
	ErrInvalidArgument: codes.InvalidArgument,
	ErrRefused:         codes.FailedPrecondition,
}

func reverse[K comparable, V comparable](m map[K]V) map[V]K {
	r := make(map[V]K, len(m))
	for k, v := range m {
		r[v] = k
	}
	return r
}

var (
	powerStateOf  = reverse(powerStates)
	bootTargetOf  = reverse(bootTargets)
	capabilityOf  = reverse(capabilities)
	errorKindOf   = reverse(errorKinds)
	wireBootNames = []BootTarget{BootPXE, BootDisk, BootCD, BootBIOS, BootNone}
)

func infoToWire(i Info) *driverv1.InfoResponse {
	r := &driverv1.InfoResponse{Name: i.Name, Version: i.Version, ProtocolVersion: uint32(i.ProtocolVersion)} //nolint:gosec // a small protocol number
	for _, c := range i.Capabilities {
		if w, ok := capabilities[c]; ok {
			r.Capabilities = append(r.Capabilities, w)
		}
	}
	return r
}

func infoFromWire(r *driverv1.InfoResponse) Info {
	i := Info{Name: r.GetName(), Version: r.GetVersion(), ProtocolVersion: int(r.GetProtocolVersion())}
	for _, w := range r.GetCapabilities() {
		if c, ok := capabilityOf[w]; ok {
			i.Capabilities = append(i.Capabilities, c)
		}
	}
	return i
}

func targetToWire(t Target) *driverv1.OpenRequest {
	return &driverv1.OpenRequest{Address: t.Address, Username: t.Username, Password: t.Password,
		TimeoutMs: t.Timeout.Milliseconds(), InsecureSkipVerify: t.InsecureSkipVerify, BasicAuth: t.BasicAuth}
}

func targetFromWire(r *driverv1.OpenRequest) Target {
	return Target{Address: r.GetAddress(), Username: r.GetUsername(), Password: r.GetPassword(),
		Timeout: time.Duration(r.GetTimeoutMs()) * time.Millisecond, InsecureSkipVerify: r.GetInsecureSkipVerify(),
		BasicAuth: r.GetBasicAuth()}
}

// failureStatus turns a driver's error into a gRPC status carrying a
// Failure, scrubbed of every secret the session knows.
func failureStatus(err error, sc *scrubber, name, address, op string) error {
	f := &driverv1.Failure{Driver: name, Address: address, Op: op}
	kind := kindOf(err)
	var e *Error
	if errors.As(err, &e) {
		f.Driver, f.Address, f.Op, f.Detail = orDefault(e.Driver, name), e.Address, orDefault(e.Op, op), e.Detail
		if e.Kind != nil {
			kind = kindOf(e.Kind)
		}
	} else {
		f.Detail = err.Error()
	}
	if errors.Is(kind, ErrDriver) {
		// A driver cannot claim its own process failed; that is the host's
		// finding.
		kind = ErrRefused
	}
	f.Kind = errorKinds[kind]
	f.Address, f.Detail = sc.scrub(f.Address), sc.scrub(f.Detail)
	code := errorCodes[kind]
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		f.ContextEnd = driverv1.ContextEnd_CONTEXT_END_DEADLINE_EXCEEDED
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		f.ContextEnd = driverv1.ContextEnd_CONTEXT_END_CANCELED
		code = codes.Canceled
	}
	st, derr := status.New(code, f.GetDetail()).WithDetails(f)
	if derr != nil {
		return status.Error(code, f.GetDetail())
	}
	return st.Err()
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// errorFromStatus rebuilds a driver's *Error from a failed call. A call
// that failed without a Failure never reached the driver's code: the
// process or the connection failed (ErrDriver), or the host's context
// ended the call (ErrUnreachable, as a BMC that did not answer in time).
func errorFromStatus(err error, sc *scrubber, name, address, op string) error {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		f, ok := d.(*driverv1.Failure)
		if !ok {
			continue
		}
		e := &Error{Driver: orDefault(f.GetDriver(), name), Address: sc.scrub(f.GetAddress()), Op: orDefault(f.GetOp(), op),
			Kind: ErrRefused, Detail: sc.scrub(f.GetDetail())}
		if k, ok := errorKindOf[f.GetKind()]; ok {
			e.Kind = k
		}
		switch f.GetContextEnd() {
		case driverv1.ContextEnd_CONTEXT_END_DEADLINE_EXCEEDED:
			e.Err = context.DeadlineExceeded
		case driverv1.ContextEnd_CONTEXT_END_CANCELED:
			e.Err = context.Canceled
		}
		return e
	}
	e := &Error{Driver: name, Address: sc.scrub(address), Op: op, Kind: ErrDriver, Detail: sc.scrub(st.Message())}
	switch st.Code() {
	case codes.DeadlineExceeded:
		e.Kind, e.Err = ErrUnreachable, context.DeadlineExceeded
	case codes.Canceled:
		e.Kind, e.Err = ErrUnreachable, context.Canceled
	}
	return e
}

// unknownBootTarget is the error for a target the wire cannot carry.
func unknownBootTarget(t BootTarget) error {
	return fmt.Errorf("boot target %q is not one of %v: %w", t, wireBootNames, ErrInvalidArgument)
}
