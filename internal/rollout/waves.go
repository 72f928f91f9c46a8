package rollout

import (
	"fmt"
	"strconv"
	"strings"
)

// maxWaves bounds a rollout's waves.
const maxWaves = 20

// waveTarget is one wave as given: a node count or a percentage of the
// pool, cumulative.
type waveTarget struct {
	n       int
	percent bool
}

func parseWave(s string) (waveTarget, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.Atoi(p)
		if err != nil || v < 1 || v > 100 {
			return waveTarget{}, fmt.Errorf("%q is not a percentage from 1%% to 100%%", s)
		}
		return waveTarget{n: v, percent: true}, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		return waveTarget{}, fmt.Errorf("%q is neither a node count (1 or more) nor a percentage (\"10%%\")", s)
	}
	return waveTarget{n: v}, nil
}

// cumulative is how many of total nodes the waves up to this one reach;
// a percentage rounds up, so "1%" of a small pool is one node.
func (w waveTarget) cumulative(total int) int {
	if w.percent {
		return min(total, (w.n*total+99)/100)
	}
	return min(total, w.n)
}

// ParseWaves checks waves (ascending, the last reaching the whole pool)
// and returns how many of total nodes each wave adds. It does not depend
// on total for what it refuses, so a valid list is valid for any pool.
func ParseWaves(waves []string, total int) ([]int, error) {
	if len(waves) == 0 {
		return nil, fmt.Errorf("is required: cumulative sizes such as 1,10%%,50%%,100%%")
	}
	if len(waves) > maxWaves {
		return nil, fmt.Errorf("has %d waves: at most %d", len(waves), maxWaves)
	}
	ts := make([]waveTarget, len(waves))
	for i, s := range waves {
		t, err := parseWave(s)
		if err != nil {
			return nil, fmt.Errorf("wave %d: %w", i+1, err)
		}
		if i > 0 {
			prev := ts[i-1]
			if prev.percent == t.percent && t.n <= prev.n {
				return nil, fmt.Errorf("wave %d (%s) is not larger than wave %d (%s): waves are cumulative and ascending", i+1, s, i, waves[i-1])
			}
			if prev.percent && !t.percent {
				return nil, fmt.Errorf("wave %d (%s) is a node count after a percentage: give counts first, then percentages", i+1, s)
			}
		}
		ts[i] = t
	}
	if last := ts[len(ts)-1]; !last.percent || last.n != 100 {
		return nil, fmt.Errorf("the last wave is %s: it must be 100%% (every node of the pool)", waves[len(waves)-1])
	}
	sizes := make([]int, len(ts))
	done := 0
	for i, t := range ts {
		c := max(done, t.cumulative(total))
		sizes[i] = c - done
		done = c
	}
	return sizes, nil
}
