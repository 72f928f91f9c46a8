package rollout

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseWaves(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		waves []string
		total int
		want  []int
	}{
		{[]string{"1", "10%", "50%", "100%"}, 20, []int{1, 1, 8, 10}},
		{[]string{"1", "10%", "50%", "100%"}, 3, []int{1, 0, 1, 1}},
		{[]string{"100%"}, 5, []int{5}},
		{[]string{"2", "5", "100%"}, 4, []int{2, 2, 0}},
		{[]string{"1%", "100%"}, 1000, []int{10, 990}},
	} {
		got, err := ParseWaves(tc.waves, tc.total)
		require.NoError(t, err, tc.waves)
		require.Equal(t, tc.want, got, tc.waves)
	}
	for _, tc := range []struct {
		waves []string
		why   string
	}{
		{nil, "is required"},
		{[]string{"50%", "10%", "100%"}, "not larger"},
		{[]string{"10%", "5", "100%"}, "node count after a percentage"},
		{[]string{"1", "10"}, "must be 100%"},
		{[]string{"1", "90%"}, "must be 100%"},
		{[]string{"0", "100%"}, "neither a node count"},
		{[]string{"abc", "100%"}, "neither a node count"},
		{[]string{"101%"}, "percentage from 1% to 100%"},
		{[]string{"5", "5", "100%"}, "not larger"},
	} {
		_, err := ParseWaves(tc.waves, 10)
		require.ErrorContains(t, err, tc.why, tc.waves)
	}
}
