package cli

import (
	"bytes"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// mcpInitialize is a desktop agent's first message on stdin.
const mcpInitialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}` + "\n"

// lineWriter collects what the server writes and closes its stdin once a
// whole line (the answer to initialize) came out: the server stops at EOF
// on stdin, and must not see it before it answered.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	stdin io.Closer
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if bytes.Contains(w.buf.Bytes(), []byte("\n")) {
		_ = w.stdin.Close()
	}
	return n, err
}

// runMCP runs `mcp` with args, sends initialize and ends stdin once the
// server answered (or at once when it refuses to start).
func (b *bundle) runMCP(t *testing.T, args ...string) result {
	t.Helper()
	env := map[string]string{envConfig: b.cfgPath, envServer: b.srv.URL, envToken: token}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" }
	a := newApp("v1.2.3", lookup)
	a.retryBackoff = time.Millisecond
	inR, inW := io.Pipe()
	go func() { _, _ = io.WriteString(inW, mcpInitialize) }()
	out := &lineWriter{stdin: inW}
	var errb bytes.Buffer
	code := run(t.Context(), a, append([]string{"mcp"}, args...), inR, out, &errb)
	_ = inW.Close()
	out.mu.Lock()
	defer out.mu.Unlock()
	r := result{code: code, stdout: out.buf.String(), stderr: errb.String()}
	require.NotContains(t, r.stdout+r.stderr, token, "the CLI must never print the token")
	return r
}

// TestMCPTakesAnAgentKey: stdio MCP refuses a key that is not of kind
// agent (a tenant admin's, the platform admin's), with nothing on stdout;
// --allow-non-agent-key serves with a warning on stderr; an agent key is
// served without one.
func TestMCPTakesAnAgentKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, me := range []*apiv1.WhoAmIResponse{
		{PrincipalId: "key_1", Kind: "service", Role: "admin", TenantId: "ten_1", TenantName: "acme"},
		{PrincipalId: "key_root", Kind: "service", Role: "platform-admin"},
		{PrincipalId: "usr_1", Kind: "user", Role: "member", TenantId: "ten_1", TenantName: "acme", AuthenticatedBy: "oidc"},
	} {
		b.f.me = me
		r := b.runMCP(t)
		require.Equal(t, 1, r.code, me.GetPrincipalId())
		require.Contains(t, r.stderr, "Error: PERMISSION_DENIED: mcp takes an API key of kind agent; "+me.GetPrincipalId()+
			" is a "+me.GetKind()+" key (role "+me.GetRole()+")")
		require.Contains(t, r.stderr, "api-keys create --role agent")
		require.Contains(t, r.stderr, "--allow-non-agent-key")
		require.Empty(t, r.stdout, "nothing is served")

		r = b.runMCP(t, "--allow-non-agent-key")
		require.Equal(t, 0, r.code, r.stderr)
		require.Contains(t, r.stderr, "WARNING: --allow-non-agent-key: "+me.GetPrincipalId()+" is a "+me.GetKind()+" key")
		require.Contains(t, r.stderr, "full rights")
		require.Contains(t, r.stdout, `"id":1,"result"`, "the agent is served")
	}

	b.f.me = &apiv1.WhoAmIResponse{PrincipalId: "key_2", Kind: "agent", Role: "agent", TenantId: "ten_1", TenantName: "acme"}
	r := b.runMCP(t)
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stderr, "no warning for an agent key")
	require.Contains(t, r.stdout, `"id":1,"result"`)
}
