package mcp

import (
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/client"
)

// CodeConfirmationRequired is the API's machine code for a request that
// policy holds until a human approves it.
const CodeConfirmationRequired = "CONFIRMATION_REQUIRED"

// Outcome is embedded in every tool's output: on a refusal the tool result
// has isError true and Error says why, with a stable machine code.
type Outcome struct {
	Error *Refusal `json:"error,omitempty" jsonschema:"set when the call did not do what was asked; the result's isError is then true"`
}

func (o *Outcome) setError(r *Refusal) { o.Error = r }

// outcome is what addTool needs of an output to report a refusal in it.
type outcome interface{ setError(*Refusal) }

// Refusal is a tool call the API (or the tool's own argument check)
// refused.
type Refusal struct {
	Code       string      `json:"code" jsonschema:"stable machine code, e.g. INVALID_ARGUMENT, PERMISSION_DENIED, NOT_FOUND, NO_CAPACITY, QUOTA_EXCEEDED, CONFIRMATION_REQUIRED"`
	Message    string      `json:"message" jsonschema:"what went wrong, for a human"`
	Violations []Violation `json:"violations,omitempty" jsonschema:"the arguments that were refused, each with its reason"`
	// ConfirmationID, Approve and Retry are set for CONFIRMATION_REQUIRED.
	ConfirmationID string `json:"confirmation_id,omitempty" jsonschema:"the confirmation a human must approve before the retry"`
	Approve        string `json:"approve,omitempty" jsonschema:"the command a human runs to approve"`
	Retry          string `json:"retry,omitempty" jsonschema:"what the agent does once a human approved"`
}

// Violation names one refused argument.
type Violation struct {
	Field  string `json:"field" jsonschema:"the tool argument"`
	Reason string `json:"reason"`
}

// Error implements error, so a tool's own argument check can return one.
func (r *Refusal) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", r.Code, r.Message)
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "\n  %s: %s", v.Field, v.Reason)
	}
	if r.ConfirmationID != "" {
		fmt.Fprintf(&b, "\nA human must approve: %s\nThen: %s", r.Approve, r.Retry)
	}
	return b.String()
}

// invalid is a tool argument refused before any API call.
func invalid(field, format string, args ...any) *Refusal {
	reason := fmt.Sprintf(format, args...)
	return &Refusal{Code: "INVALID_ARGUMENT", Message: "invalid " + field + ": " + reason,
		Violations: []Violation{{Field: field, Reason: reason}}}
}

// refusal turns err into a Refusal. fields maps the API's field names to
// the tool's argument names where they differ (duration_seconds →
// duration); tool and tenant build the CONFIRMATION_REQUIRED advice.
func refusal(err error, tool, tenant string, fields map[string]string) *Refusal {
	var r *Refusal
	if errors.As(err, &r) {
		return r
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return &Refusal{Code: "INTERNAL", Message: err.Error()}
	}
	r = &Refusal{Code: client.Code(err), Message: ce.Message()}
	d := client.Detail(err)
	if d.GetMessage() != "" {
		r.Message = d.GetMessage()
	}
	for _, v := range d.GetViolations() {
		// Preview nests the create request; the tool's arguments are flat.
		f := strings.TrimPrefix(v.GetField(), "request.")
		if to, ok := fields[f]; ok {
			f = to
		}
		r.Violations = append(r.Violations, Violation{Field: f, Reason: v.GetReason()})
	}
	if id := d.GetConfirmationId(); id != "" {
		r.ConfirmationID = id
		r.Approve = "better-compute confirmations approve " + id
		if tenant != "" {
			r.Approve += " --tenant " + tenant
		}
		r.Retry = "call " + tool + " again with the same arguments and confirmation_id " + id
		r.Message = "policy holds this call until a human approves confirmation " + id
	}
	return r
}
