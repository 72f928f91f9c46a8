package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Explanation says why nodes were rejected: counts by reason, and by node
// class and reason.
type Explanation struct {
	Evaluated int
	Feasible  int
	ByReason  map[string]int
	ByClass   map[ClassKey]map[string]int
}

func newExplanation() Explanation {
	return Explanation{ByReason: map[string]int{}, ByClass: map[ClassKey]map[string]int{}}
}

func (e *Explanation) reject(class ClassKey, reason string, nodes int) {
	e.ByReason[reason] += nodes
	m := e.ByClass[class]
	if m == nil {
		m = map[string]int{}
		e.ByClass[class] = m
	}
	m[reason] += nodes
}

// String gives the sentence form, most common reason first, e.g.
// "12 nodes: not enough NVLink-connected GPUs; 3 nodes: tainted dedicated=acme".
func (e Explanation) String() string {
	if len(e.ByReason) == 0 {
		return ""
	}
	return sentence(e.ByReason)
}

// ClassString gives the sentence form for one node class.
func (e Explanation) ClassString(k ClassKey) string { return sentence(e.ByClass[k]) }

func sentence(m map[string]int) string {
	type kv struct {
		reason string
		n      int
	}
	rows := make([]kv, 0, len(m))
	for r, n := range m {
		rows = append(rows, kv{r, n})
	}
	slices.SortFunc(rows, func(a, b kv) int {
		return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.reason, b.reason))
	})
	parts := make([]string, len(rows))
	for i, r := range rows {
		noun := "nodes"
		if r.n == 1 {
			noun = "node"
		}
		parts[i] = fmt.Sprintf("%d %s: %s", r.n, noun, r.reason)
	}
	return strings.Join(parts, "; ")
}

// Line is one (class, reason) count of an explanation.
type Line struct {
	Class  ClassKey
	Reason string
	Nodes  int
}

// Lines lists the rejections by class and reason, most nodes first, then by
// class and reason, so the order is stable.
func (e Explanation) Lines() []Line {
	var out []Line
	for c, m := range e.ByClass {
		for r, n := range m {
			out = append(out, Line{Class: c, Reason: r, Nodes: n})
		}
	}
	slices.SortFunc(out, func(a, b Line) int {
		return cmp.Or(cmp.Compare(b.Nodes, a.Nodes), cmp.Compare(a.Class.String(), b.Class.String()), cmp.Compare(a.Reason, b.Reason))
	})
	return out
}
