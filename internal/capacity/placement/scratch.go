package placement

import (
	"cmp"
	"slices"
	"strings"
	"sync"
)

// scratch is the working memory of one Place call: the free GPUs and units
// of the node being picked, the best candidates so far and the rejection
// counts of the class being scanned. Place takes one from a pool and gives
// it back, so a full scan allocates nothing per node.
type scratch struct {
	// The node being picked: its free whole GPUs when they are not in its
	// digest, or its free MIG instances or slots.
	freeBuf []freeGPU
	// bestGroup's keys of the free GPUs and the groups it has seen.
	keyIsland, keyNUMA []int
	seen               []bool
	groups             []unitGroup
	units              []int32
	numaFree           []numaCount
	// The pick: the whole GPUs picked, the GPUs touched with their NUMA
	// nodes and, for MIG instances and slots, each unit taken with its GPU.
	picked     []freeGPU
	chosen     []int32
	chosenNUMA []int
	unitGPU    []int32
	unit       []int32

	// Per-call caches of the request's model and MIG profile matches.
	model, migModel  string
	modelMatch       bool
	modelSet, migSet bool
	migN             int
	labelReasons     []string
	capReasons       []string
	taintReasons     map[Taint]string
	counts           []reasonCount
	top              []candidate
}

var scratchPool = sync.Pool{New: func() any { return &scratch{taintReasons: map[Taint]string{}} }}

// maxPooledTop bounds the candidate buffer a pooled scratch keeps, so one
// call with a huge limit does not pin its memory.
const maxPooledTop = 1024

func getScratch(req *Request) *scratch {
	sc := scratchPool.Get().(*scratch)
	sc.modelSet, sc.migSet = false, false
	sc.labelReasons = resetStrings(sc.labelReasons, len(req.Selector))
	sc.capReasons = resetStrings(sc.capReasons, len(req.Capabilities))
	sc.top = sc.top[:0]
	return sc
}

func putScratch(sc *scratch) {
	// Drop references into the caller's snapshot and request.
	clear(sc.top[:cap(sc.top)])
	clear(sc.labelReasons)
	clear(sc.capReasons)
	sc.model, sc.migModel = "", ""
	if cap(sc.top) > maxPooledTop {
		sc.top = nil
	}
	scratchPool.Put(sc)
}

func resetStrings(s []string, n int) []string {
	if cap(s) < n {
		return make([]string, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// reasonCount is how many nodes of the class being scanned one reason
// rejected.
type reasonCount struct {
	reason string
	nodes  int
}

// count adds a rejection of the class being scanned. A class sees a handful
// of distinct reasons, and most are the same constant string, so a linear
// scan beats hashing the reason into the explanation's maps per node.
func (sc *scratch) count(reason string) {
	for i := range sc.counts {
		if sc.counts[i].reason == reason {
			sc.counts[i].nodes++
			return
		}
	}
	sc.counts = append(sc.counts, reasonCount{reason, 1})
}

// flush moves the class's counts into the explanation.
func (sc *scratch) flush(ex *Explanation, class ClassKey) {
	for _, c := range sc.counts {
		ex.reject(class, c.reason, c.nodes)
	}
	clear(sc.counts)
	sc.counts = sc.counts[:0]
}

// candidate is a feasible node as ranked: its plan is built only if it is
// among the best when the scan ends.
type candidate struct {
	id    string
	node  int // index into the snapshot's nodes
	class int // index into the snapshot's classes
	numa  int
	split bool
	score ScoreBreakdown
}

// betterCandidate orders candidates as better orders their plans. It is
// written out rather than with cmp.Or, which would compare the node IDs of
// every pair: most pairs are decided by the score, and the IDs, compared
// only on a tie, are the scan's costliest comparison.
func betterCandidate(a, b *candidate) int {
	if a.split != b.split {
		return cmpBool(a.split, b.split)
	}
	if c := cmp.Compare(b.score.Total, a.score.Total); c != 0 {
		return c
	}
	return strings.Compare(a.id, b.id)
}

// insertTop keeps the best limit candidates in order without sorting every
// feasible node.
func (sc *scratch) insertTop(c *candidate, limit int) {
	top := sc.top
	if len(top) == limit && betterCandidate(c, &top[len(top)-1]) >= 0 {
		return
	}
	// The first position not better than c, as slices.BinarySearchFunc
	// finds it (written out so c stays on the caller's stack).
	lo, hi := 0, len(top)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if betterCandidate(&top[m], c) < 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	top = slices.Insert(top, lo, *c)
	if len(top) > limit {
		top = top[:limit]
	}
	sc.top = top
}
