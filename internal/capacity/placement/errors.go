package placement

import "fmt"

// RequestError is returned for an invalid request; Field names the request
// field at fault, in the API's spelling.
type RequestError struct {
	Field  string
	Reason string
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("invalid placement request: %s: %s", e.Field, e.Reason)
}

// Validate checks the request on its own, before any node is looked at.
func (r *Request) Validate() error {
	switch {
	case r.GPUs < 0:
		return &RequestError{"gpus", "must not be negative"}
	case r.Slots < 0:
		return &RequestError{"slots", "must not be negative"}
	case r.GPUs == 0 && r.Slots == 0 && (r.MIGProfile != "" || r.VCPU <= 0 || r.MemoryGiB+r.Hugepages1Gi+r.Hugepages2Mi <= 0):
		// Without devices a request is host resources alone (a guest):
		// it must ask for CPUs and memory, or it would book nothing.
		return &RequestError{"gpus", "must ask for at least one GPU, MIG instance or slot (or, without devices, vCPUs and memory)"}
	case r.GPUs > 0 && r.Slots > 0:
		return &RequestError{"slots", "cannot be combined with gpus"}
	case r.VCPU < 0:
		return &RequestError{"vcpu", "must not be negative"}
	case r.MemoryGiB < 0:
		return &RequestError{"memoryGiB", "must not be negative"}
	case r.Hugepages2Mi < 0:
		return &RequestError{"hugepages2Mi", "must not be negative"}
	case r.Hugepages1Gi < 0:
		return &RequestError{"hugepages1Gi", "must not be negative"}
	}
	if r.MIGProfile != "" {
		if r.Model != "" && migMax(r.Model, r.MIGProfile) == 0 {
			return &RequestError{"migProfile", fmt.Sprintf("%q is not a MIG profile of %s", r.MIGProfile, r.Model)}
		}
		if r.Model == "" && !migProfileKnown(r.MIGProfile) {
			return &RequestError{"migProfile", fmt.Sprintf("%q is not a known MIG profile", r.MIGProfile)}
		}
	}
	for i, l := range r.Selector {
		switch l.Op {
		case OpIn, OpNotIn:
			if len(l.Values) == 0 {
				return &RequestError{fmt.Sprintf("selector[%d].values", i), "must not be empty for " + string(l.Op)}
			}
		case OpExists, OpDoesNotExist:
		default:
			return &RequestError{fmt.Sprintf("selector[%d].op", i), fmt.Sprintf("unknown operator %q", l.Op)}
		}
		if l.Key == "" {
			return &RequestError{fmt.Sprintf("selector[%d].key", i), "must not be empty"}
		}
	}
	return nil
}
