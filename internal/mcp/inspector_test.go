package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
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
	var ee *exec.ExitError
	if errors.As(err, &ee) {
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

// buildCLI builds better-compute once for the tests that start it.
func buildCLI(t *testing.T) string {
	t.Helper()
	cliOnce.Do(func() {
		dir, err := os.MkdirTemp("", "bc-mcp-test-")
		if err != nil {
			cliErr = err
			return
		}
		cliPath = filepath.Join(dir, "better-compute")
		out, err := exec.Command("go", "build", "-o", cliPath, "github.com/better-compute/better-compute/cmd/better-compute").CombinedOutput()
		if err != nil {
			cliErr = fmt.Errorf("go build: %w: %s", err, out)
		}
	})
	require.NoError(t, cliErr)
	return cliPath
}

var (
	cliOnce sync.Once
	cliPath string
	cliErr  error
)

// TestMain removes the binary buildCLI built, which outlives each test.
func TestMain(m *testing.M) {
	code := m.Run()
	if cliPath != "" {
		_ = os.RemoveAll(filepath.Dir(cliPath))
	}
	os.Exit(code)
}

// TestMCPStdioBinary starts the built `better-compute mcp` as a desktop
// agent does and drives it with the Go SDK's client over its stdin and
// stdout: the tenant from --tenant, the key from the environment.
func TestMCPStdioBinary(t *testing.T) {
	t.Parallel()
	f := setup(t)
	cmd := exec.Command(buildCLI(t), "mcp", "--tenant", "acme")
	cmd.Env = append(os.Environ(), "BETTER_COMPUTE_SERVER="+f.cp.URL, "BETTER_COMPUTE_TOKEN="+f.acmeAgent,
		"BETTER_COMPUTE_CONFIG="+filepath.Join(t.TempDir(), "config.yaml"))
	c := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &sdk.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, cs.Close()) }()
	var made mcp.ReservationOutput
	res := call(t, cs, "reserve_gpus", map[string]any{"pool": "gpus", "gpus": 1, "duration": "30m"}, &made)
	require.False(t, res.IsError, "%v", res.Content)
	require.Equal(t, f.acmeAgentID, f.reservation(t, made.Reservation.ID).GetCreatedBy())
	r := refused(t, cs, "extend_reservation", map[string]any{"reservation": made.Reservation.ID, "by": "2d"})
	require.Equal(t, mcp.CodeConfirmationRequired, r.Code)
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

	// An instance that runs, and a command in a sandbox, driven by the
	// inspector.
	f.workloads(t)
	vm := runInspector(t, bin, nil, url, "--transport", "http", "--header", auth, "--method", "tools/call",
		"--tool-name", "create_instance", "--tool-arg", "name=vm1", "flavor=small", "pool=gpus", "ip_pool=dev", "image=debian-12")
	require.NotEqual(t, true, vm["isError"], "%v", vm)
	require.Equal(t, "running", vm["structuredContent"].(map[string]any)["instance"].(map[string]any)["state"])
	box := runInspector(t, bin, nil, url, "--transport", "http", "--header", auth, "--method", "tools/call",
		"--tool-name", "create_sandbox", "--tool-arg", "template=box")
	require.NotEqual(t, true, box["isError"], "%v", box)
	sbID := box["structuredContent"].(map[string]any)["sandbox"].(map[string]any)["id"].(string)
	// The exec's tunnel command is due within 30 s of the control plane's
	// clock, which stood still while the steps above ran.
	f.cp.Clock.CatchUp()
	ran := runInspector(t, bin, nil, url, "--transport", "http", "--header", auth, "--method", "tools/call",
		"--tool-name", "exec_sandbox", "--tool-arg", "sandbox="+sbID, "command=echo from-the-inspector")
	require.NotEqual(t, true, ran["isError"], "%v", ran)
	require.Equal(t, "from-the-inspector\n", ran["structuredContent"].(map[string]any)["stdout"])

	// stdio: the real binary, configured only by its environment.
	exe := buildCLI(t)
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
