// Package profiles reads profile documents: deploy profiles (the steps a
// machine workflow runs) and hardware profiles (what a kind of machine
// needs, such as its BMC driver), written as YAML or JSON, validated with
// every violation naming its field, and expanded into the provision
// engine's steps. It also stores a tenant's documents (ProfileService) and
// ships the built-in profiles as documents (builtin/).
//
// It is its own package, apart from provision, because a document is an
// API resource (versioned, tenant-owned, parsed from text) while the
// engine only runs the expanded steps it persists; metal and health load
// their built-in workflows from here.
package profiles

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/provision"
)

// APIVersion is the only apiVersion a document may have.
const APIVersion = "bettercompute.io/v1"

// Document kinds.
const (
	KindDeploy   = "DeployProfile"
	KindHardware = "HardwareProfile"
)

// Formats a document is written in.
const (
	FormatYAML = "yaml"
	FormatJSON = "json"
)

// KindDriverInvoke is the step kind a driver.invoke step expands to: an
// operation of the machine's BMC driver, carried out by its site agent.
const KindDriverInvoke = "driver.invoke"

// MaxDocument bounds a document's text.
const MaxDocument = 256 << 10

// Constructs lists what a step may say, in the order docs/profiles.md
// describes them (a test keeps the two in step).
var Constructs = []string{"name", "kind", "driver.invoke", "destructive", "params", "timeout", "retries", "backoff",
	"when", "acceptance", "on_failure", "fallback"}

// Document is a parsed profile document.
type Document struct {
	APIVersion  string
	Kind        string
	Name        string
	Description string
	// Driver is the BMC driver a hardware profile's machines need ("" any).
	Driver string
	// Profile is the expansion: what the engine persists and runs. A
	// hardware profile without steps has none.
	Profile provision.Profile
	// origins maps an expanded step index to its document field.
	origins []string
}

// Catalog is what a document is checked against: the step kinds the
// engine runs and the operations driver.invoke may name. A zero Catalog
// checks neither (the built-ins, whose kinds provision.New checks).
type Catalog struct {
	Kinds     []string
	DriverOps []string
	// Profiles are the engine's profiles a step's "run <profile>" rule
	// may name.
	Profiles []string
}

var driverRE = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,62}$`)

// Parse reads a document and checks it against cat; a bad document is
// INVALID_ARGUMENT with every violation naming its field (spec.steps[2].when,
// metadata.name, ...).
func Parse(text []byte, format string, cat Catalog) (Document, error) {
	var vs envelope.Violations
	d := parse(&vs, text, format)
	if err := vs.Err(); err != nil {
		return Document{}, err
	}
	d.check(&vs, cat)
	if err := vs.Err(); err != nil {
		return Document{}, err
	}
	return d, nil
}

func parse(vs *envelope.Violations, text []byte, format string) Document {
	var d Document
	if len(text) == 0 {
		vs.Add("document", "is required")
		return d
	}
	if len(text) > MaxDocument {
		vs.Add("document", "must be at most %d bytes, got %d", MaxDocument, len(text))
		return d
	}
	var raw any
	switch strings.ToLower(format) {
	case FormatJSON:
		dec := json.NewDecoder(bytes.NewReader(text))
		if err := dec.Decode(&raw); err != nil {
			vs.Add("document", "is not JSON: %v", err)
			return d
		}
	case FormatYAML, "":
		if err := yaml.Unmarshal(text, &raw); err != nil {
			vs.Add("document", "is not YAML: %v", err)
			return d
		}
	default:
		vs.Add("format", "must be yaml or json, got %q", trunc(format))
		return d
	}
	top := object(vs, "", raw)
	if top == nil {
		return d
	}
	known(vs, "", top, "apiVersion", "kind", "metadata", "spec")
	d.APIVersion = str(vs, "apiVersion", top["apiVersion"])
	if d.APIVersion != APIVersion {
		vs.Add("apiVersion", "must be %s, got %q", APIVersion, trunc(d.APIVersion))
	}
	d.Kind = str(vs, "kind", top["kind"])
	if d.Kind != KindDeploy && d.Kind != KindHardware {
		vs.Add("kind", "must be %s or %s, got %q", KindDeploy, KindHardware, trunc(d.Kind))
	}
	if md := object(vs, "metadata", top["metadata"]); md != nil {
		known(vs, "metadata", md, "name", "description")
		d.Name = str(vs, "metadata.name", md["name"])
		d.Description = str(vs, "metadata.description", md["description"])
		vs.MaxLen("metadata.description", d.Description, 1024)
	}
	vs.Name("metadata.name", d.Name)
	spec := object(vs, "spec", top["spec"])
	if spec == nil {
		return d
	}
	if d.Kind == KindHardware {
		// A hardware profile says what its machines need; what runs on
		// them is a deploy profile's (no workflow runs a hardware
		// profile's steps, so it takes none).
		known(vs, "spec", spec, "driver")
		d.Driver = str(vs, "spec.driver", spec["driver"])
		if d.Driver != "" && !driverRE.MatchString(d.Driver) {
			vs.Add("spec.driver", "must be a driver name like redfish or ipmi, got %q", trunc(d.Driver))
		}
		return d
	}
	known(vs, "spec", spec, "steps", "cleanup")
	d.Profile.Name = d.Name
	steps := list(vs, "spec.steps", spec["steps"])
	if len(steps) == 0 && d.Kind == KindDeploy {
		vs.Add("spec.steps", "must list at least one step")
	}
	for i, s := range steps {
		f := fmt.Sprintf("spec.steps[%d]", i)
		st, fb := step(vs, f, s, true)
		d.Profile.Steps = append(d.Profile.Steps, st)
		d.origins = append(d.origins, f)
		if fb != nil {
			fb.FallbackFor = st.Name
			if fb.OnFailure == "" {
				// The fallback's failure is the step's failure.
				fb.OnFailure = st.OnFailure
			}
			d.Profile.Steps = append(d.Profile.Steps, *fb)
			d.origins = append(d.origins, f+".fallback")
		}
	}
	for i, s := range list(vs, "spec.cleanup", spec["cleanup"]) {
		st, _ := step(vs, fmt.Sprintf("spec.cleanup[%d]", i), s, false)
		d.Profile.Cleanup = append(d.Profile.Cleanup, st)
	}
	return d
}

// step reads one step, and its fallback when allowed.
func step(vs *envelope.Violations, f string, raw any, fallback bool) (provision.Step, *provision.Step) {
	var s provision.Step
	m := object(vs, f, raw)
	if m == nil {
		return s, nil
	}
	keys := slices.Clone(Constructs)
	if !fallback {
		keys = slices.DeleteFunc(keys, func(k string) bool { return k == "fallback" })
	}
	known(vs, f, m, keys...)
	s.Name = str(vs, f+".name", m["name"])
	s.Kind = str(vs, f+".kind", m["kind"])
	inv, hasInv := m["driver.invoke"]
	switch {
	case hasInv && s.Kind != "":
		vs.Add(f+".driver.invoke", "a step is either a kind or a driver.invoke, not both")
	case hasInv:
		s.Kind = KindDriverInvoke
		if im := object(vs, f+".driver.invoke", inv); im != nil {
			known(vs, f+".driver.invoke", im, "operation", "params")
			op := str(vs, f+".driver.invoke.operation", im["operation"])
			s.Params = map[string]any{"operation": op}
			if p, ok := im["params"]; ok {
				s.Params["params"] = object(vs, f+".driver.invoke.params", p)
			}
		}
		// A driver operation acts on the machine: at most once per key,
		// unless the document says it destroys nothing.
		s.Destructive = true
	case s.Kind == "":
		vs.Add(f+".kind", "is required: a step kind (power.cycle, disk.wipe, ...) or driver.invoke")
	}
	if v, ok := m["destructive"]; ok {
		b, isBool := v.(bool)
		if !isBool {
			vs.Add(f+".destructive", "must be true or false")
		}
		s.Destructive = b
	}
	if p, ok := m["params"]; ok {
		if hasInv {
			vs.Add(f+".params", "a driver.invoke step takes its params under driver.invoke.params")
		} else {
			s.Params = object(vs, f+".params", p)
		}
	}
	s.Timeout = duration(vs, f+".timeout", m["timeout"])
	s.Backoff = duration(vs, f+".backoff", m["backoff"])
	s.Retries = integer(vs, f+".retries", m["retries"])
	s.When = str(vs, f+".when", m["when"])
	s.OnFailure = str(vs, f+".on_failure", m["on_failure"])
	for j, a := range list(vs, f+".acceptance", m["acceptance"]) {
		s.Acceptance = append(s.Acceptance, str(vs, fmt.Sprintf("%s.acceptance[%d]", f, j), a))
	}
	if !fallback {
		return s, nil
	}
	fbRaw, ok := m["fallback"]
	if !ok {
		return s, nil
	}
	fb, _ := step(vs, f+".fallback", fbRaw, false)
	if fb.Name == "" {
		// A fallback needs a step name of its own; default to one.
		fb.Name = s.Name + "-fallback"
	}
	return s, &fb
}

// check validates the expansion (the engine's own rules) and the catalog,
// naming the document's fields.
func (d *Document) check(vs *envelope.Violations, cat Catalog) {
	if d.Kind == KindHardware {
		return
	}
	if err := d.Profile.Validate(); err != nil {
		for _, v := range violations(err) {
			// Reasons name steps by their expanded index too.
			reason := reasonStepRE.ReplaceAllStringFunc(v.Reason, d.field)
			vs.Add(d.field(v.Field), "%s", reason)
		}
	}
	if cat.Kinds == nil {
		return
	}
	kinds := map[string]bool{}
	for _, k := range cat.Kinds {
		kinds[k] = true
	}
	ops := map[string]bool{}
	for _, o := range cat.DriverOps {
		ops[o] = true
	}
	checkKinds := func(prefix func(int) string, steps []provision.Step) {
		for i, s := range steps {
			switch {
			case s.Kind == KindDriverInvoke:
				op, _ := s.Params["operation"].(string)
				if !ops[op] {
					vs.Add(prefix(i)+".driver.invoke.operation", "must be an operation drivers carry out (%s), got %q",
						strings.Join(cat.DriverOps, ", "), trunc(op))
				}
				if !kinds[KindDriverInvoke] {
					vs.Add(prefix(i)+".driver.invoke", "this control plane runs no driver.invoke steps")
				}
			case s.Kind != "" && !kinds[s.Kind]:
				vs.Add(prefix(i)+".kind", "must be a registered step kind (%s), got %q", strings.Join(cat.Kinds, ", "), trunc(s.Kind))
			}
		}
	}
	checkKinds(func(i int) string { return d.origins[i] }, d.Profile.Steps)
	for i, s := range d.Profile.Steps {
		if r, err := provision.ParseOnFailure(s.OnFailure); err == nil && r.Action == provision.OnFailureRun && !slices.Contains(cat.Profiles, r.Target) {
			vs.Add(d.origins[i]+".on_failure", "run names no profile the engine has (%s), got %q", strings.Join(cat.Profiles, ", "), trunc(r.Target))
		}
	}
	checkKinds(func(i int) string { return fmt.Sprintf("spec.cleanup[%d]", i) }, d.Profile.Cleanup)
}

var (
	stepFieldRE  = regexp.MustCompile(`^steps\[(\d+)\](.*)$`)
	reasonStepRE = regexp.MustCompile(`\bsteps\[\d+\]`)
)

// field maps a provision.Profile violation's field to the document's.
func (d *Document) field(f string) string {
	switch {
	case f == "name":
		return "metadata.name"
	case f == "steps":
		return "spec.steps"
	case strings.HasPrefix(f, "cleanup"):
		return "spec." + f
	}
	if m := stepFieldRE.FindStringSubmatch(f); m != nil {
		i, _ := strconv.Atoi(m[1])
		if i < len(d.origins) {
			rest := m[2]
			if rest == ".fallback_for" {
				rest = ""
			}
			return d.origins[i] + rest
		}
	}
	return "spec." + f
}

func violations(err error) []envelope.Violation {
	var ee *envelope.Error
	if errors.As(err, &ee) {
		return ee.Violations
	}
	return []envelope.Violation{{Field: "spec", Reason: err.Error()}}
}

// Decoding helpers: each names its field when the value has the wrong type.

func object(vs *envelope.Violations, f string, v any) map[string]any {
	if v == nil {
		if f != "" && f != "spec" && f != "metadata" {
			return nil
		}
		vs.Add(cmpOr(f, "document"), "is required")
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		vs.Add(cmpOr(f, "document"), "must be a mapping")
		return nil
	}
	return m
}

func list(vs *envelope.Violations, f string, v any) []any {
	if v == nil {
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		vs.Add(f, "must be a list")
	}
	return l
}

func str(vs *envelope.Violations, f string, v any) string {
	if v == nil {
		return ""
	}
	s, ok := v.(string)
	if !ok {
		vs.Add(f, "must be a string")
	}
	return s
}

func integer(vs *envelope.Violations, f string, v any) int {
	switch n := v.(type) {
	case nil:
		return 0
	case int:
		return n
	case float64:
		if n == float64(int(n)) {
			return int(n)
		}
	}
	vs.Add(f, "must be a whole number")
	return 0
}

func duration(vs *envelope.Violations, f string, v any) time.Duration {
	if v == nil {
		return 0
	}
	s, ok := v.(string)
	if !ok {
		vs.Add(f, `must be a duration like "5m" or "90s"`)
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		vs.Add(f, `must be a duration like "5m" or "90s", got %q`, trunc(s))
	}
	return d
}

func known(vs *envelope.Violations, f string, m map[string]any, keys ...string) {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !slices.Contains(keys, k) {
			field := k
			if f != "" {
				field = f + "." + k
			}
			vs.Add(field, "is not a field here (known: %s)", strings.Join(keys, ", "))
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
