package envelope

import (
	"fmt"
	"regexp"
	"strings"
)

var (
	nameRE = regexp.MustCompile(`^[a-z0-9-]{1,63}$`)
	idRE   = regexp.MustCompile(`^[a-z]{2,4}_[0-9a-z]{26}$`)
)

// Violations collects field violations while a request is validated.
type Violations []Violation

// Add records a violation.
func (vs *Violations) Add(field, format string, args ...any) {
	*vs = append(*vs, Violation{Field: field, Reason: fmt.Sprintf(format, args...)})
}

// Name checks a resource name: [a-z0-9-]{1,63}.
func (vs *Violations) Name(field, value string) {
	switch {
	case value == "":
		vs.Add(field, "is required")
	case !nameRE.MatchString(value):
		vs.Add(field, "must match [a-z0-9-]{1,63}, got %q", truncate(value))
	}
}

// OptionalName checks a name that may be empty.
func (vs *Violations) OptionalName(field, value string) {
	if value != "" {
		vs.Name(field, value)
	}
}

// Ref checks a reference that may be a name or an id of the given prefix.
func (vs *Violations) Ref(field, value, prefix string) {
	switch {
	case value == "":
		vs.Add(field, "is required")
	case strings.Contains(value, "_"):
		if !IsID(value, prefix) {
			vs.Add(field, "is not a valid %s id", prefix)
		}
	case !nameRE.MatchString(value):
		vs.Add(field, "must be a name matching [a-z0-9-]{1,63} or a %s_ id, got %q", prefix, truncate(value))
	}
}

// ID checks an id of the given prefix.
func (vs *Violations) ID(field, value, prefix string) {
	switch {
	case value == "":
		vs.Add(field, "is required")
	case !IsID(value, prefix):
		vs.Add(field, "is not a valid %s id", prefix)
	}
}

// MaxLen checks a free-text field's length. Its characters need no check
// here: CheckText (text.go) refuses control and bidi characters in every
// string field of every request before a handler runs.
func (vs *Violations) MaxLen(field, value string, n int) {
	if len(value) > n {
		vs.Add(field, "must be at most %d bytes, got %d", n, len(value))
	}
}

// PageSize checks a page size.
func (vs *Violations) PageSize(field string, n int32) {
	if n < 0 || n > MaxPageSize {
		vs.Add(field, "must be between 0 and %d", MaxPageSize)
	}
}

// Err returns nil when nothing was refused, else an INVALID_ARGUMENT error.
func (vs Violations) Err() error {
	if len(vs) == 0 {
		return nil
	}
	return Invalid(vs...)
}

// IsID reports whether s is an id with the given prefix.
func IsID(s, prefix string) bool {
	return strings.HasPrefix(s, prefix+"_") && idRE.MatchString(s)
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
