package bmc

import (
	"context"
	"errors"
	"strings"
)

// The kinds of failure a caller acts on differently. Every error a driver
// returns is an *Error whose Kind is one of these, so errors.Is works.
var (
	// ErrAuth: the BMC refused the credentials (fix the secret, do not retry).
	ErrAuth = errors.New("authentication failed")
	// ErrUnreachable: nothing answered at the address in time (retry later,
	// check the network and the address).
	ErrUnreachable = errors.New("bmc unreachable")
	// ErrUnsupported: this driver or this BMC cannot do the operation.
	ErrUnsupported = errors.New("not supported")
	// ErrInvalidAddress: the address is not one the driver will talk to.
	ErrInvalidAddress = errors.New("invalid bmc address")
	// ErrInvalidArgument: a boot target, image URL or credential is malformed.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrRefused: the BMC answered and refused or failed the request.
	ErrRefused = errors.New("bmc refused the request")
)

// Error is a failed BMC call: which driver, which BMC, which operation, its
// kind and what the BMC or the network said. It never holds a password.
type Error struct {
	Driver  string
	Address string
	Op      string // "power on", "power status", "set boot override", …
	Kind    error  // one of the Err* kinds above
	Detail  string // what happened, scrubbed of the password
	// Err is context.Canceled or context.DeadlineExceeded when the call's
	// context ended it, nil otherwise. Library errors are not kept: their
	// text may quote what the BMC sent, and Detail carries it scrubbed.
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

// Unwrap exposes the kind (errors.Is(err, bmc.ErrAuth)) and, when the
// context ended the call, the context's error.
func (e *Error) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Kind, e.Err}
	}
	return []error{e.Kind}
}

// contextError returns the context error err wraps, if any.
func contextError(err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return context.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return context.Canceled
	}
	return nil
}

// newError builds an Error whose Detail is scrubbed of the password, so no
// library message that happens to echo it can carry it further.
func newError(driver, address, op string, kind error, creds Credentials, detail string) *Error {
	return &Error{Driver: driver, Address: address, Op: op, Kind: kind, Detail: creds.scrub(detail)}
}
