package fleet_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/fleet"
)

func TestSanitizeText(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"plain ascii", "plain ascii"},
		{"Ünïcode 研究室 \u05e9\u05dc\u05d5\u05dd\u200f", "Ünïcode 研究室 \u05e9\u05dc\u05d5\u05dd\u200f"},
		{"\x1b[32mSUCCEEDED", "\uFFFD[32mSUCCEEDED"},
		{"a\x00b\x7fc\u0085d\u009be", "a\uFFFDb\uFFFDc\uFFFDd\uFFFDe"},
		{"\u202eabc\u202c \u2066x\u2069", "\uFFFDabc\uFFFD \uFFFDx\uFFFD"},
		{"line\nbreak\ttab\rcr\u2028", "line\uFFFDbreak\uFFFDtab\uFFFDcr\uFFFD"},
		{"bad\xff\xfebytes", "bad\uFFFD\uFFFDbytes"},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, fleet.SanitizeText(tc.in), "%q", tc.in)
	}
}

func TestSanitizeNodeTextWalksEveryString(t *testing.T) {
	t.Parallel()
	result, err := structpb.NewStruct(map[string]any{"k\x1b": "v\x1b", "list": []any{"x\u202e"}})
	require.NoError(t, err)
	m := &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_CommandUpdate{CommandUpdate: &agentv1.CommandUpdate{
		CommandId: "cmd_1", Message: "\x1b[2J", Result: result,
	}}}
	fleet.SanitizeNodeText(m)
	u := m.GetCommandUpdate()
	require.Equal(t, "cmd_1", u.GetCommandId(), "clean text is left alone")
	require.Equal(t, "\uFFFD[2J", u.GetMessage())
	require.Equal(t, map[string]any{"k\uFFFD": "v\uFFFD", "list": []any{"x\uFFFD"}}, u.GetResult().AsMap())
	fleet.SanitizeNodeText(nil)
}
