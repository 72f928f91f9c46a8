package envelope

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWordsAndArticles: refusals read "an IP pool", "an agent", "a user",
// never "a i p pool" or "a agent".
func TestWordsAndArticles(t *testing.T) {
	t.Parallel()
	for typ, want := range map[string]string{
		"ApiKey": "api key", "IPPool": "IP pool", "Instance": "instance", "MIGLayout": "MIG layout",
		"BMCCredential": "BMC credential", "": "resource", "SandboxTemplate": "sandbox template",
	} {
		require.Equal(t, want, words(typ), typ)
	}
	for noun, want := range map[string]string{
		"IP pool": "an", "agent": "an", "instance": "an", "user": "a", "usage window": "a", "update": "an",
		"BMC credential": "a", "MIG layout": "an", "pool": "a", "": "a",
	} {
		require.Equal(t, want, article(noun), noun)
	}
}
