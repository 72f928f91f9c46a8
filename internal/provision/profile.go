package provision

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
)

// Profile is a named, ordered list of steps: what a workflow runs.
type Profile struct {
	Name  string `json:"name"`
	Steps []Step `json:"steps"`
	// Cleanup runs when the workflow fails in its own steps (a step whose
	// rule is "fail"): the machine is left safe. It is not run after an
	// unknown outcome (a cleanup could be destructive too) nor on cancel.
	Cleanup []Step `json:"cleanup,omitempty"`
}

// Step is one step of a profile.
type Step struct {
	// Name is unique within its profile; goto names it.
	Name string `json:"name"`
	// Kind selects the StepRunner ("power.cycle", "disk.wipe", ...). A kind
	// that starts with "await." waits for Signal instead of dispatching.
	Kind string `json:"kind"`
	// Destructive steps (power, wipe, image write) are dispatched at most
	// once per idempotency key and never again after a worker died with
	// the dispatch in doubt.
	Destructive bool `json:"destructive,omitempty"`
	// Params go to the runner as they are.
	Params map[string]any `json:"params,omitempty"`
	// Timeout bounds one attempt; zero takes the engine's default.
	Timeout time.Duration `json:"timeout,omitempty"`
	// Retries is how many failed attempts are tried again.
	Retries int `json:"retries,omitempty"`
	// Backoff is the wait before the first retry; it doubles each time, up
	// to MaxBackoff. Zero takes one second.
	Backoff time.Duration `json:"backoff,omitempty"`
	// OnFailure is what a failure does once retries are spent: "fail"
	// (the default), "continue", "goto <step>" (a later step of the same
	// profile) or "run <profile>" (a cleanup profile; the workflow still
	// ends failed).
	OnFailure string `json:"on_failure,omitempty"`
	// When is a condition (ParseCond over input and machine) evaluated when
	// the step's turn comes: false skips the step, with the reason.
	When string `json:"when,omitempty"`
	// Acceptance are conditions over the step's output (and input and
	// machine): a step that succeeded fails when one is false.
	Acceptance []string `json:"acceptance,omitempty"`
	// FallbackFor names the step just before this one: this step runs only
	// when that one failed after its retries, instead of that failure's
	// rule; it is skipped when that one did not fail.
	FallbackFor string `json:"fallback_for,omitempty"`
}

// AwaitPrefix starts the kinds of steps that wait for an outside signal
// (Engine.Signal) instead of dispatching to a runner.
const AwaitPrefix = "await."

// KindAwaitRejoin waits for the ramdisk or the deployed OS to join.
const KindAwaitRejoin = "await.rejoin"

// Limits of a profile.
const (
	MaxSteps      = 64
	MaxRetries    = 10
	MaxTimeout    = 24 * time.Hour
	MaxBackoff    = time.Hour
	maxParamsSize = 16 << 10
	maxAcceptance = 16
)

// On-failure actions.
const (
	OnFailureFail     = "fail"
	OnFailureContinue = "continue"
	OnFailureGoto     = "goto"
	OnFailureRun      = "run"
)

// OnFailureRule is a parsed Step.OnFailure.
type OnFailureRule struct {
	Action string
	// Target is the step (goto) or profile (run) named.
	Target string
}

var kindRE = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$`)

// ParseOnFailure parses an on_failure rule; "" means fail.
func ParseOnFailure(s string) (OnFailureRule, error) {
	f := strings.Fields(s)
	switch {
	case len(f) == 0:
		return OnFailureRule{Action: OnFailureFail}, nil
	case len(f) == 1 && (f[0] == OnFailureFail || f[0] == OnFailureContinue):
		return OnFailureRule{Action: f[0]}, nil
	case len(f) == 2 && f[0] == OnFailureGoto:
		return OnFailureRule{Action: OnFailureGoto, Target: f[1]}, nil
	case len(f) == 2 && f[0] == OnFailureRun:
		return OnFailureRule{Action: OnFailureRun, Target: f[1]}, nil
	case len(f) == 3 && f[0] == OnFailureRun && f[1] == "profile":
		return OnFailureRule{Action: OnFailureRun, Target: f[2]}, nil
	}
	return OnFailureRule{}, fmt.Errorf(`must be "fail", "continue", "goto <step>" or "run <profile>", got %q`, truncate(s))
}

// IsAwait reports whether a kind waits for a signal.
func IsAwait(kind string) bool { return strings.HasPrefix(kind, AwaitPrefix) }

// Validate checks one profile on its own and returns an INVALID_ARGUMENT
// error naming every bad field (steps[2].timeout, ...). Cross-profile
// references (run <profile>) are checked by ValidateProfiles.
func (p Profile) Validate() error {
	var vs envelope.Violations
	p.validate(&vs)
	return vs.Err()
}

func (p Profile) validate(vs *envelope.Violations) {
	vs.Name("name", p.Name)
	switch {
	case len(p.Steps) == 0:
		vs.Add("steps", "must list at least one step")
	case len(p.Steps) > MaxSteps:
		vs.Add("steps", "must list at most %d steps, got %d", MaxSteps, len(p.Steps))
	}
	index := map[string]int{}
	for i, s := range p.Steps {
		f := fmt.Sprintf("steps[%d]", i)
		vs.Name(f+".name", s.Name)
		if j, dup := index[s.Name]; dup && s.Name != "" {
			vs.Add(f+".name", "%q is already the name of steps[%d]", s.Name, j)
		} else {
			index[s.Name] = i
		}
		switch {
		case s.Kind == "":
			vs.Add(f+".kind", "is required (e.g. power.cycle, disk.wipe, await.rejoin)")
		case len(s.Kind) > 63 || !kindRE.MatchString(s.Kind):
			vs.Add(f+".kind", "must be dotted lower-case words like power.cycle, got %q", truncate(s.Kind))
		case IsAwait(s.Kind) && s.Destructive:
			vs.Add(f+".destructive", "an %s step dispatches nothing, so it cannot be destructive", s.Kind)
		}
		if s.Timeout < 0 || s.Timeout > MaxTimeout {
			vs.Add(f+".timeout", "must be between 0 (the default) and %s, got %s", MaxTimeout, s.Timeout)
		}
		if s.Retries < 0 || s.Retries > MaxRetries {
			vs.Add(f+".retries", "must be between 0 and %d, got %d", MaxRetries, s.Retries)
		}
		if s.Backoff < 0 || s.Backoff > MaxBackoff {
			vs.Add(f+".backoff", "must be between 0 (one second) and %s, got %s", MaxBackoff, s.Backoff)
		}
		if b, err := json.Marshal(s.Params); err != nil {
			vs.Add(f+".params", "must encode as JSON: %v", err)
		} else if len(b) > maxParamsSize {
			vs.Add(f+".params", "must be at most %d bytes as JSON, got %d", maxParamsSize, len(b))
		}
		validateConds(vs, f, s)
		if s.FallbackFor != "" {
			switch {
			case i == 0 || p.Steps[i-1].Name != s.FallbackFor:
				vs.Add(f+".fallback_for", "must name the step just before it, got %q", truncate(s.FallbackFor))
			case p.Steps[i-1].FallbackFor != "":
				vs.Add(f+".fallback_for", "%q is itself a fallback: a fallback has no fallback", s.FallbackFor)
			}
		}
	}
	p.validateCleanup(vs)
	for i, s := range p.Steps {
		f := fmt.Sprintf("steps[%d].on_failure", i)
		r, err := ParseOnFailure(s.OnFailure)
		if err != nil {
			vs.Add(f, "%v", err)
			continue
		}
		switch r.Action {
		case OnFailureGoto:
			j, ok := index[r.Target]
			switch {
			case !ok:
				vs.Add(f, "goto names no step of profile %q: %q", p.Name, truncate(r.Target))
			case j <= i:
				// Forward only: a workflow always ends.
				vs.Add(f, "goto must name a later step, %q is steps[%d]", r.Target, j)
			}
		case OnFailureRun:
			if r.Target == p.Name {
				vs.Add(f, "run names the profile itself")
			}
		}
	}
}

// validateConds parses a step's when and acceptance conditions.
func validateConds(vs *envelope.Violations, f string, s Step) {
	if s.When != "" {
		if _, err := ParseCond(s.When, RootInput, RootMachine); err != nil {
			vs.Add(f+".when", "%v", err)
		}
	}
	if len(s.Acceptance) > maxAcceptance {
		vs.Add(f+".acceptance", "must list at most %d checks, got %d", maxAcceptance, len(s.Acceptance))
	}
	for j, a := range s.Acceptance {
		if _, err := ParseCond(a, RootOutput, RootInput, RootMachine); err != nil {
			vs.Add(fmt.Sprintf("%s.acceptance[%d]", f, j), "%v", err)
		}
	}
}

// validateCleanup checks the cleanup steps: like steps, but a cleanup ends
// the workflow, so its rules are only fail or continue, and it has no
// fallbacks.
func (p Profile) validateCleanup(vs *envelope.Violations) {
	if len(p.Steps)+len(p.Cleanup) > MaxSteps {
		vs.Add("cleanup", "steps and cleanup must list at most %d steps together, got %d", MaxSteps, len(p.Steps)+len(p.Cleanup))
	}
	seen := map[string]int{}
	for i, s := range p.Cleanup {
		f := fmt.Sprintf("cleanup[%d]", i)
		vs.Name(f+".name", s.Name)
		if j, dup := seen[s.Name]; dup && s.Name != "" {
			vs.Add(f+".name", "%q is already the name of cleanup[%d]", s.Name, j)
		}
		seen[s.Name] = i
		switch {
		case s.Kind == "":
			vs.Add(f+".kind", "is required (e.g. power.off)")
		case len(s.Kind) > 63 || !kindRE.MatchString(s.Kind):
			vs.Add(f+".kind", "must be dotted lower-case words like power.off, got %q", truncate(s.Kind))
		case IsAwait(s.Kind) && s.Destructive:
			vs.Add(f+".destructive", "an %s step dispatches nothing, so it cannot be destructive", s.Kind)
		}
		if s.Timeout < 0 || s.Timeout > MaxTimeout {
			vs.Add(f+".timeout", "must be between 0 (the default) and %s, got %s", MaxTimeout, s.Timeout)
		}
		if s.Retries < 0 || s.Retries > MaxRetries {
			vs.Add(f+".retries", "must be between 0 and %d, got %d", MaxRetries, s.Retries)
		}
		if s.Backoff < 0 || s.Backoff > MaxBackoff {
			vs.Add(f+".backoff", "must be between 0 (one second) and %s, got %s", MaxBackoff, s.Backoff)
		}
		if b, err := json.Marshal(s.Params); err != nil {
			vs.Add(f+".params", "must encode as JSON: %v", err)
		} else if len(b) > maxParamsSize {
			vs.Add(f+".params", "must be at most %d bytes as JSON, got %d", maxParamsSize, len(b))
		}
		if r, err := ParseOnFailure(s.OnFailure); err != nil || (r.Action != OnFailureFail && r.Action != OnFailureContinue) {
			vs.Add(f+".on_failure", `a cleanup step's rule must be "fail" or "continue", got %q`, truncate(s.OnFailure))
		}
		if s.FallbackFor != "" {
			vs.Add(f+".fallback_for", "a cleanup step has no fallback")
		}
		validateConds(vs, f, s)
	}
}

// ValidateProfiles checks a set of profiles: each on its own, names unique,
// and every "run <profile>" naming a profile of the set whose own steps run
// no further cleanup (a cleanup ends the workflow).
func ValidateProfiles(ps []Profile) error {
	var vs envelope.Violations
	byName := map[string]Profile{}
	for i, p := range ps {
		var pvs envelope.Violations
		p.validate(&pvs)
		for _, v := range pvs {
			vs.Add(fmt.Sprintf("profiles[%d].%s", i, v.Field), "%s", v.Reason)
		}
		if _, dup := byName[p.Name]; dup && p.Name != "" {
			vs.Add(fmt.Sprintf("profiles[%d].name", i), "profile %q is given twice", p.Name)
		}
		byName[p.Name] = p
	}
	for i, p := range ps {
		for j, s := range p.Steps {
			r, err := ParseOnFailure(s.OnFailure)
			if err != nil || r.Action != OnFailureRun {
				continue
			}
			f := fmt.Sprintf("profiles[%d].steps[%d].on_failure", i, j)
			c, ok := byName[r.Target]
			if !ok {
				vs.Add(f, "run names no known profile: %q", truncate(r.Target))
				continue
			}
			for _, cs := range c.Steps {
				if cr, err := ParseOnFailure(cs.OnFailure); err == nil && cr.Action == OnFailureRun {
					vs.Add(f, "cleanup profile %q itself runs a cleanup (step %q); a cleanup must end the workflow", c.Name, cs.Name)
					break
				}
			}
		}
	}
	return vs.Err()
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
