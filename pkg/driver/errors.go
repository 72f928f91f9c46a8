package driver

import (
	"errors"
	"strings"
)

// The kinds of failure a host acts on differently; every error a BMC
// call returns through this package is an *Error whose Kind is one of
// these, so errors.Is works across the process boundary.
var (
	// ErrAuth: the BMC refused the credentials.
	ErrAuth = errors.New("authentication failed")
	// ErrUnreachable: nothing answered at the address in time.
	ErrUnreachable = errors.New("bmc unreachable")
	// ErrUnsupported: this driver or this BMC cannot do the operation.
	ErrUnsupported = errors.New("not supported")
	// ErrInvalidAddress: the address is not one the driver will talk to.
	ErrInvalidAddress = errors.New("invalid bmc address")
	// ErrInvalidArgument: a boot target, image URL or credential is malformed.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrRefused: the BMC answered and refused or failed the request.
	ErrRefused = errors.New("bmc refused the request")
	// ErrDriver: the driver process failed (it exited, crashed, or broke
	// the protocol); the BMC itself may be fine. Opening the driver again
	// starts a new process.
	ErrDriver = errors.New("driver process failed")
)

var kinds = []error{ErrAuth, ErrUnreachable, ErrUnsupported, ErrInvalidAddress, ErrInvalidArgument, ErrRefused, ErrDriver}

// Error is a failed BMC call: which driver, which BMC, which operation, its
// kind and what happened. It never holds a password.
type Error struct {
	Driver  string
	Address string
	Op      string
	Kind    error  // one of the Err* kinds above
	Detail  string // what happened, scrubbed of the password
	// Err is context.Canceled or context.DeadlineExceeded when the call's
	// context ended it, nil otherwise.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("bmc ")
	b.WriteString(e.Driver)
	if e.Address != "" {
		b.WriteString(" ")
		b.WriteString(e.Address)
	}
	b.WriteString(": ")
	b.WriteString(e.Op)
	b.WriteString(": ")
	b.WriteString(e.Kind.Error())
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// Unwrap exposes the kind and, when the context ended the call, the
// context's error.
func (e *Error) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Kind, e.Err}
	}
	return []error{e.Kind}
}

// kindOf finds the kind err matches; ErrRefused when none.
func kindOf(err error) error {
	for _, k := range kinds {
		if errors.Is(err, k) {
			return k
		}
	}
	return ErrRefused
}
