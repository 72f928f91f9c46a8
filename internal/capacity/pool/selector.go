package pool

import (
	"fmt"
	"regexp"
	"strings"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
)

// Selector operators.
const (
	OpIn           = "In"
	OpNotIn        = "NotIn"
	OpExists       = "Exists"
	OpDoesNotExist = "DoesNotExist"
)

const (
	maxRequirements = 32
	maxValues       = 64
	maxValueLen     = 63
)

var (
	labelKeyRE   = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,125}[A-Za-z0-9])?$`)
	labelValueRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)
)

// validateSelector checks a selector's requirements, naming each offending
// field as selector[i].key, selector[i].operator or selector[i].values.
func validateSelector(vs *envelope.Violations, reqs []*apiv1.SelectorRequirement) {
	if len(reqs) > maxRequirements {
		vs.Add("selector", "must have at most %d requirements, got %d", maxRequirements, len(reqs))
		return
	}
	for i, r := range reqs {
		f := fmt.Sprintf("selector[%d]", i)
		if !labelKeyRE.MatchString(r.GetKey()) {
			vs.Add(f+".key", "must be a label key (alphanumeric with . _ / - inside, at most 127 bytes), got %q", truncate(r.GetKey()))
		}
		switch r.GetOperator() {
		case OpIn, OpNotIn:
			if len(r.GetValues()) == 0 {
				vs.Add(f+".values", "must not be empty for %s", r.GetOperator())
			} else if len(r.GetValues()) > maxValues {
				vs.Add(f+".values", "must have at most %d values, got %d", maxValues, len(r.GetValues()))
			}
			for _, v := range r.GetValues() {
				if !labelValueRE.MatchString(v) {
					vs.Add(f+".values", "value %q must be alphanumeric with . _ - inside, at most %d bytes", truncate(v), maxValueLen)
					break
				}
			}
		case OpExists, OpDoesNotExist:
			if len(r.GetValues()) != 0 {
				vs.Add(f+".values", "must be empty for %s", r.GetOperator())
			}
		default:
			vs.Add(f+".operator", "must be one of In, NotIn, Exists, DoesNotExist, got %q", truncate(r.GetOperator()))
		}
	}
}

// ParseSelector parses the CLI shorthand of a selector: comma-separated
// terms, each one of
//
//	key=value          In with one value
//	key in (a,b)       In
//	key notin (a,b)    NotIn
//	key                Exists
//	!key               DoesNotExist
//
// Errors name the offending term. Keys and values are checked again by the
// API; the parser only checks the shape.
func ParseSelector(s string) ([]*apiv1.SelectorRequirement, error) {
	var out []*apiv1.SelectorRequirement
	for _, term := range splitTerms(s) {
		t := strings.TrimSpace(term)
		if t == "" {
			return nil, fmt.Errorf("selector: empty term in %q", s)
		}
		r, err := parseTerm(t)
		if err != nil {
			return nil, fmt.Errorf("selector term %q: %w", t, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// splitTerms splits on commas outside parentheses.
func splitTerms(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	var (
		out   []string
		depth int
		start int
	)
	for i, c := range s {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

func parseTerm(t string) (*apiv1.SelectorRequirement, error) {
	if strings.ContainsAny(t, "()") {
		open := strings.IndexByte(t, '(')
		if open < 0 || !strings.HasSuffix(t, ")") || strings.Count(t, "(") != 1 || strings.Count(t, ")") != 1 {
			return nil, fmt.Errorf("want `key in (a,b)` or `key notin (a,b)`")
		}
		head := strings.Fields(t[:open])
		if len(head) != 2 {
			return nil, fmt.Errorf("want `key in (a,b)` or `key notin (a,b)`")
		}
		var op string
		switch strings.ToLower(head[1]) {
		case "in":
			op = OpIn
		case "notin":
			op = OpNotIn
		default:
			return nil, fmt.Errorf("unknown operator %q: want in or notin", head[1])
		}
		var values []string
		for v := range strings.SplitSeq(t[open+1:len(t)-1], ",") {
			v = strings.TrimSpace(v)
			if v == "" {
				return nil, fmt.Errorf("empty value in the list")
			}
			values = append(values, v)
		}
		return &apiv1.SelectorRequirement{Key: head[0], Operator: op, Values: values}, nil
	}
	if k, v, ok := strings.Cut(t, "="); ok {
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case strings.HasSuffix(k, "!"):
			return nil, fmt.Errorf("!= is not supported: use `key notin (value)`")
		case k == "" || strings.ContainsAny(k, " \t!"):
			return nil, fmt.Errorf("want key=value with a key")
		case v == "" || strings.ContainsAny(v, " \t=!"):
			return nil, fmt.Errorf("want key=value with one value")
		}
		return &apiv1.SelectorRequirement{Key: k, Operator: OpIn, Values: []string{v}}, nil
	}
	op := OpExists
	k := t
	if rest, ok := strings.CutPrefix(t, "!"); ok {
		op, k = OpDoesNotExist, strings.TrimSpace(rest)
	}
	if k == "" || strings.ContainsAny(k, " \t!") {
		return nil, fmt.Errorf("want a key, !key, key=value, key in (...) or key notin (...)")
	}
	return &apiv1.SelectorRequirement{Key: k, Operator: op}, nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
