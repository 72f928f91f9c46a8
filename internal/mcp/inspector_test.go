package mcp_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/mcp"
)

// inspector returns the CLI of the npm package @modelcontextprotocol/inspector
// (a third-party MCP client): $BC_MCP_INSPECTOR, else mcp-inspector on PATH.
func inspector(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("BC_MCP_INSPECTOR"); p != "" {
		return p
	}
	if p, err := exec.LookPath("mcp-inspector"); err == nil {
		return p
	}
	t.Skip("the MCP inspector is not installed: npm install @modelcontextprotocol/inspector@0.17.5 in a directory and set " +
		"BC_MCP_INSPECTOR=<dir>/node_modules/.bin/mcp-inspector (needs node and npm)")
	return ""
}

// runInspector runs `mcp-inspector --cli args...` and decodes its JSON answer.
func runInspector(t *testing.T, bin string, env []string, args ...string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--cli"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr []byte
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = ee.Stderr
	}
	require.NoError(t, err, "mcp-inspector %v\nstdout: %s\nstderr: %s", args, out, stderr)
	var v map[string]any
	require.NoError(t, json.Unmarshal(out, &v), "%s", out)
	return v
}

func toolNames(t *testing.T, v map[string]any) []string {
	t.Helper()
	tools, ok := v["tools"].([]any)
	require.True(t, ok, "%v", v)
	var names []string
	for _, tl := range tools {
		m := tl.(map[string]any)
		require.NotNil(t, m["outputSchema"], "%v", m["name"])
		names = append(names, m["name"].(string))
	}
	slices.Sort(names)
	return names
}

// TestMCPInspector drives the server with the inspector's CLI: over
// streamable HTTP with an agent key, and over stdio by starting the built
// `better-compute mcp` with the key in its environment, as a desktop agent
// would.
func TestMCPInspector(t *testing.T) {
	t.Parallel()
	bin := inspector(t)
	f := setup(t)
	url := f.cp.URL + mcp.Path
	auth := "Authorization: Bearer " + f.acmeAgent

	names := toolNames(t, runInspector(t, bin, nil, url, "--transport", "http", "--header", auth, "--method", "tools/list"))
	require.Equal(t, wantTools, names)
	pools := runInspector(t, bin, nil, url, "--transport", "http", "--header", auth, "--method", "tools/call", "--tool-name", "list_pools")
	require.NotEqual(t, true, pools["isError"], "%v", pools)
	require.Equal(t, "gpus", pools["structuredContent"].(map[string]any)["pools"].([]any)[0].(map[string]any)["name"])
	made := runInspector(t, bin, nil, url, "--transport", "http", "--header", auth, "--method", "tools/call",
		"--tool-name", "reserve_gpus", "--tool-arg", "pool=gpus", "gpus=1", "duration=2h")
	require.NotEqual(t, true, made["isError"], "%v", made)
	id := made["structuredContent"].(map[string]any)["reservation"].(map[string]any)["id"].(string)
	require.Equal(t, f.acmeAgentID, f.reservation(t, id).GetCreatedBy())

	// stdio: the real binary, configured only by its environment.
	exe := filepath.Join(t.TempDir(), "better-compute")
	build := exec.Command("go", "build", "-o", exe, "github.com/better-compute/better-compute/cmd/better-compute")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	env := []string{"BETTER_COMPUTE_SERVER=" + f.cp.URL, "BETTER_COMPUTE_TOKEN=" + f.acmeAgent,
		"BETTER_COMPUTE_CONFIG=" + filepath.Join(t.TempDir(), "config.yaml")}
	names = toolNames(t, runInspector(t, bin, env, exe, "mcp", "--method", "tools/list"))
	require.Equal(t, wantTools, names)
	list := runInspector(t, bin, env, exe, "mcp", "--method", "tools/call", "--tool-name", "list_reservations")
	require.NotEqual(t, true, list["isError"], "%v", list)
	require.Equal(t, id, list["structuredContent"].(map[string]any)["reservations"].([]any)[0].(map[string]any)["id"])
	res := runInspector(t, bin, env, exe, "mcp", "--method", "resources/read", "--uri", "bettercompute://tenants/acme/reservations/"+id)
	require.Contains(t, res["contents"].([]any)[0].(map[string]any)["text"], id)
}
