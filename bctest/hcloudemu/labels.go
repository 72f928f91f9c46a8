package hcloudemu

import (
	"fmt"
	"regexp"
	"strings"
)

// Hetzner's label rules (https://docs.hetzner.cloud/#labels): a key is an
// optional DNS-subdomain prefix and "/" and a name of up to 63 characters;
// a value is empty or up to 63 characters; both start and end with a
// letter or digit and hold only letters, digits, "-", "_" and ".".
var (
	labelNameRE   = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9._-]{0,61}[a-zA-Z0-9])?$`)
	labelPrefixRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)
)

func validLabel(key, value string) error {
	name := key
	if prefix, rest, ok := strings.Cut(key, "/"); ok {
		if len(prefix) > 253 || !labelPrefixRE.MatchString(prefix) {
			return fmt.Errorf("label key %q has an invalid prefix", key)
		}
		name = rest
	}
	if !labelNameRE.MatchString(name) {
		return fmt.Errorf("label key %q is invalid", key)
	}
	if value != "" && !labelNameRE.MatchString(value) {
		return fmt.Errorf("label value %q of key %q is invalid", value, key)
	}
	return nil
}

// requirement is one term of a label selector.
type requirement struct {
	key    string
	op     string // "=", "!=", "exists", "!exists", "in", "notin"
	values []string
}

func (r requirement) matches(labels map[string]string) bool {
	v, has := labels[r.key]
	switch r.op {
	case "=":
		return has && v == r.values[0]
	case "!=":
		return !has || v != r.values[0]
	case "exists":
		return has
	case "!exists":
		return !has
	case "in":
		return has && contains(r.values, v)
	case "notin":
		return !has || !contains(r.values, v)
	}
	return false
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// selector is a parsed label selector: every requirement must hold.
type selector []requirement

func (s selector) matches(labels map[string]string) bool {
	for _, r := range s {
		if !r.matches(labels) {
			return false
		}
	}
	return true
}

// parseSelector reads Hetzner's label selector syntax: comma-separated
// terms "k=v", "k==v", "k!=v", "k", "!k", "k in (a,b)", "k notin (a,b)".
func parseSelector(s string) (selector, error) {
	var out selector
	for _, term := range splitTerms(s) {
		term = strings.TrimSpace(term)
		if term == "" {
			continue
		}
		r, err := parseTerm(term)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// splitTerms splits on the commas outside parentheses.
func splitTerms(s string) []string {
	var out []string
	depth, start := 0, 0
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

func parseTerm(term string) (requirement, error) {
	for _, op := range []string{"!=", "==", "="} {
		if k, v, ok := strings.Cut(term, op); ok {
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if k == "" {
				return requirement{}, fmt.Errorf("label selector term %q has no key", term)
			}
			if op == "==" {
				op = "="
			}
			return requirement{key: k, op: op, values: []string{v}}, nil
		}
	}
	for _, op := range []string{" notin ", " in "} {
		if k, rest, ok := strings.Cut(term, op); ok {
			rest = strings.TrimSpace(rest)
			if !strings.HasPrefix(rest, "(") || !strings.HasSuffix(rest, ")") {
				return requirement{}, fmt.Errorf("label selector term %q: values must be in parentheses", term)
			}
			var values []string
			for _, v := range strings.Split(rest[1:len(rest)-1], ",") {
				values = append(values, strings.TrimSpace(v))
			}
			return requirement{key: strings.TrimSpace(k), op: strings.TrimSpace(op), values: values}, nil
		}
	}
	if k, ok := strings.CutPrefix(term, "!"); ok {
		return requirement{key: strings.TrimSpace(k), op: "!exists"}, nil
	}
	if strings.ContainsAny(term, " ()") {
		return requirement{}, fmt.Errorf("label selector term %q is invalid", term)
	}
	return requirement{key: term, op: "exists"}, nil
}
