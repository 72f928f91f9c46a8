package pool_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/pool"
)

func TestParseSelector(t *testing.T) {
	t.Parallel()
	req := func(key, op string, values ...string) *apiv1.SelectorRequirement {
		return &apiv1.SelectorRequirement{Key: key, Operator: op, Values: values}
	}
	tests := []struct {
		in      string
		want    []*apiv1.SelectorRequirement
		wantErr string
	}{
		{in: "", want: nil},
		{in: "gpu.model=H100", want: []*apiv1.SelectorRequirement{req("gpu.model", "In", "H100")}},
		{in: "gpu.model=H100,zone in (a,b),!spot,gpu", want: []*apiv1.SelectorRequirement{
			req("gpu.model", "In", "H100"), req("zone", "In", "a", "b"), req("spot", "DoesNotExist"), req("gpu", "Exists"),
		}},
		{in: " zone notin ( a , b ) , region = eu ", want: []*apiv1.SelectorRequirement{
			req("zone", "NotIn", "a", "b"), req("region", "In", "eu"),
		}},
		{in: "zone IN (a)", want: []*apiv1.SelectorRequirement{req("zone", "In", "a")}},
		{in: "a,,b", wantErr: "empty term"},
		{in: "zone in (a,)", wantErr: `term "zone in (a,)": empty value`},
		{in: "zone within (a)", wantErr: `term "zone within (a)": unknown operator "within"`},
		{in: "zone in a,b)", wantErr: `term "zone in a"`},
		{in: "zone in (a", wantErr: `term "zone in (a"`},
		{in: "=H100", wantErr: `term "=H100": want key=value with a key`},
		{in: "gpu.model=", wantErr: `term "gpu.model=": want key=value with one value`},
		{in: "gpu.model!=H100", wantErr: `term "gpu.model!=H100": != is not supported`},
		{in: "!", wantErr: `term "!": want a key`},
		{in: "two words", wantErr: `term "two words"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := pool.ParseSelector(tt.in)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Len(t, got, len(tt.want))
			for i := range tt.want {
				require.Equal(t, tt.want[i].GetKey(), got[i].GetKey(), i)
				require.Equal(t, tt.want[i].GetOperator(), got[i].GetOperator(), i)
				require.Equal(t, tt.want[i].GetValues(), got[i].GetValues(), i)
			}
		})
	}
}
