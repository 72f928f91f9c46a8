package envelope

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func TestTextProblem(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in    string
		multi bool
		want  string
	}{
		{"Acme Research", false, ""},
		{"Ünïcode 研究室 \u05e9\u05dc\u05d5\u05dd\u200f 🚀", false, ""},
		{"a\x00", false, "contains a control character (U+0000) at byte 1"},
		{"\x1b[2J", false, "contains a control character (U+001B) at byte 0"},
		{"ab\x7f", false, "contains a control character (U+007F) at byte 2"},
		{"é\u0085", false, "contains a control character (U+0085) at byte 2"},
		{"x\u202e", false, "contains a bidirectional formatting character (U+202E) at byte 1"},
		{"x\u2069", false, "contains a bidirectional formatting character (U+2069) at byte 1"},
		{"x\u2028", true, "contains a line or paragraph separator (U+2028) at byte 1"},
		{"a\nb", false, "contains a control character (U+000A) at byte 1"},
		{"a\nb\tc", true, ""},
		{"a\r\nb", true, "contains a control character (U+000D) at byte 1"},
		{"ok\xffno", false, "is not valid UTF-8 at byte 2 (invalid bytes, a lone surrogate or U+FFFF)"},
		{"ok\uffff", false, "is not valid UTF-8 at byte 2 (invalid bytes, a lone surrogate or U+FFFF)"},
		{"ok\ufffe", false, "contains a noncharacter (U+FFFE) at byte 2"},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, TextProblem(tc.in, tc.multi), "%q", tc.in)
	}
}

func TestCheckTextNamesFields(t *testing.T) {
	t.Parallel()
	params, err := structpb.NewStruct(map[string]any{"why": "x\x1b", "list": []any{"ok", "y\u202e"}})
	require.NoError(t, err)
	tests := []struct {
		msg  proto.Message
		want []string
	}{
		{&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web", DisplayName: "Web"}, nil},
		{&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web", DisplayName: "W\x00eb"}, []string{"display_name"}},
		{&apiv1.CreatePoolRequest{Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Values: []string{"H100", "A\u202e"}}}}, []string{"selector[0].values[1]"}},
		{&apiv1.CreateJoinTokenRequest{Labels: map[string]string{"zone": "a\x1b", "b\x00": "v"}}, []string{`labels["zone"]`, "labels"}},
		{&apiv1.RunCommandRequest{Params: params}, []string{`params["why"]`, `params["list"][1]`}},
		{&apiv1.PutPolicyRequest{Id: "p", Text: "permit (principal, action, resource)\n\twhen { true };"}, nil},
		{&apiv1.PutPolicyRequest{Id: "p\n", Text: "permit\r\n"}, []string{"id", "text"}},
	}
	for _, tc := range tests {
		err := CheckText(tc.msg)
		var got []string
		if err != nil {
			for _, v := range AsError(err).Violations {
				got = append(got, v.Field)
			}
		}
		require.ElementsMatch(t, tc.want, got, "%v", tc.msg)
	}
}

func TestRepairJSONText(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{`{"a":"\ud800"}`, `{"a":"\uffff"}`},
		{`{"a":"x\udc00y"}`, `{"a":"x\uffffy"}`},
		{`{"a":"\ud83d\ude80 ok"}`, ""},
		{`{"a":"\\ud800"}`, ""},
		{"{\"a\":\"b\xffc\"}", `{"a":"b\uffffc"}`},
		{`{"a":"\ud800\ud800"}`, `{"a":"\uffff\uffff"}`},
		{`{"a\ud800":1}`, `{"a\uffff":1}`},
	}
	for _, tc := range tests {
		got, changed := RepairJSONText([]byte(tc.in))
		if tc.want == "" {
			require.False(t, changed, "%s", tc.in)
			continue
		}
		require.True(t, changed, "%s", tc.in)
		require.Equal(t, tc.want, string(got), "%s", tc.in)
	}
}

func TestRepairProtoText(t *testing.T) {
	t.Parallel()
	b, err := proto.Marshal(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Labels: map[string]string{"zone": "ZQZQ"}})
	require.NoError(t, err)
	b = bytes.Replace(b, []byte("ZQZQ"), []byte("a\xffb\xfe"), 1)
	var m apiv1.CreateJoinTokenRequest
	require.Error(t, proto.Unmarshal(b, &m))
	fixed, ok := RepairProtoText(b, m.ProtoReflect().Descriptor())
	require.True(t, ok)
	require.NoError(t, proto.Unmarshal(fixed, &m))
	require.Equal(t, "a\uffffb\uffff", m.GetLabels()["zone"])
	vs := AsError(CheckText(&m)).Violations
	require.Len(t, vs, 1)
	require.Equal(t, `labels["zone"]`, vs[0].Field)

	_, ok = RepairProtoText([]byte{0xff, 0xff}, m.ProtoReflect().Descriptor())
	require.False(t, ok, "a malformed body is left to the decoder's own error")
	good, err := proto.Marshal(&apiv1.CreateJoinTokenRequest{Tenant: "acme"})
	require.NoError(t, err)
	_, ok = RepairProtoText(good, m.ProtoReflect().Descriptor())
	require.False(t, ok, "nothing to repair")
}

// BenchmarkCheckText is the text check's cost per request, paid by every
// call the interceptor lets through.
func BenchmarkCheckText(b *testing.B) {
	req := &apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100", Selector: []*apiv1.SelectorRequirement{
		{Key: "gpu.model", Operator: "In", Values: []string{"H100", "H200"}},
		{Key: "zone", Operator: "In", Values: []string{"eu-west-1a"}},
	}}
	b.ReportAllocs()
	for b.Loop() {
		if err := CheckText(req); err != nil {
			b.Fatal(err)
		}
	}
}
