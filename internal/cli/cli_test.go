package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// A command registered the way serve.go and dev.go register theirs.
func init() {
	register(func() *cobra.Command {
		return &cobra.Command{Use: "hooked", RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "hooked ran")
			return err
		}}
	})
}

const token = "bc_testtoken_never_print_me"

type bundle struct {
	f       *fake
	srv     *httptest.Server
	cfgPath string
	// env is the environment commands see; tests add to it.
	env map[string]string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	f := newFake()
	dir := t.TempDir()
	return &bundle{
		f:       f,
		srv:     f.serve(t),
		cfgPath: filepath.Join(dir, "cfg", "config.yaml"),
		env:     map[string]string{"HOME": dir},
	}
}

type result struct {
	code           int
	stdout, stderr string
}

// run executes the CLI with the bundle's env and config; server and token
// come from the env unless the test removed them.
func (b *bundle) run(t *testing.T, stdin string, argv ...string) result {
	t.Helper()
	env := map[string]string{envConfig: b.cfgPath, envServer: b.srv.URL, envToken: token}
	for k, v := range b.env {
		env[k] = v
	}
	lookup := func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok && v != ""
	}
	a := newApp("v1.2.3", lookup)
	a.retryBackoff = time.Millisecond
	var out, errb bytes.Buffer
	code := run(t.Context(), a, argv, strings.NewReader(stdin), &out, &errb)
	r := result{code: code, stdout: out.String(), stderr: errb.String()}
	require.NotContains(t, r.stdout+r.stderr, token, "the CLI must never print the token")
	return r
}

func (b *bundle) ok(t *testing.T, argv ...string) string {
	t.Helper()
	r := b.run(t, "", argv...)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	return r.stdout
}

func TestVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, "v1.2.3\n", b.ok(t, "version"))
	var got map[string]string
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "version", "-o", "json")), &got))
	require.Equal(t, map[string]string{"version": "v1.2.3"}, got)
	require.Equal(t, "version: v1.2.3\n", b.ok(t, "version", "-o", "yaml"))
	require.Empty(t, b.f.callsTo("WhoAmI"), "version must not call the server")
}

func TestTenantsOutputFormats(t *testing.T) {
	t.Parallel()
	b := setup(t)

	table := b.ok(t, "tenants", "list")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	require.Len(t, lines, 4, "header and all three tenants across two pages")
	require.Equal(t, []string{"NAME", "ID", "DISPLAY", "NAME", "STATE", "CREATED"}, strings.Fields(lines[0]))
	require.Equal(t, []string{"acme", "ten_1", "Acme", "Corp", "active", "2025-01-02T03:04:05Z"}, strings.Fields(lines[1]))
	require.Equal(t, []string{"globex", "ten_2", "-", "suspended", "2025-01-02T03:04:05Z"}, strings.Fields(lines[2]))
	require.Len(t, b.f.callsTo("TenantService/List"), 2, "follows next_page_token")

	var js struct {
		Tenants []struct{ Name, DisplayName string } `json:"tenants"`
	}
	out := b.ok(t, "tenants", "list", "-o", "json")
	require.Contains(t, out, "\n  ", "json is multiline")
	require.NoError(t, json.Unmarshal([]byte(out), &js))
	require.Len(t, js.Tenants, 3)
	require.Equal(t, "Acme Corp", js.Tenants[0].DisplayName)

	var ys struct {
		Tenants []struct {
			Name       string `yaml:"name"`
			CreateTime string `yaml:"createTime"`
		} `yaml:"tenants"`
	}
	out = b.ok(t, "tenants", "list", "-o", "yaml")
	require.NotContains(t, out, "{", "yaml is block style")
	require.NoError(t, yaml.Unmarshal([]byte(out), &ys))
	require.Len(t, ys.Tenants, 3)
	require.Equal(t, "initech", ys.Tenants[2].Name)
	require.Equal(t, "2025-01-02T03:04:05Z", ys.Tenants[2].CreateTime)

	out = b.ok(t, "tenants", "get", "globex", "-o", "json")
	var one struct {
		Tenant struct{ ID, Name string } `json:"tenant"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &one))
	require.Equal(t, "ten_2", one.Tenant.ID)

	require.Len(t, strings.Split(strings.TrimSpace(b.ok(t, "tenants", "list", "--limit", "1")), "\n"), 2)
}

func TestBadOutputFormat(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "", "tenants", "list", "-o", "xml")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "Error: INVALID_ARGUMENT: invalid --output")
}

func TestCreateSendsIdempotencyKeyAndRetriesWithIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.f.failCreates = 1
	out := b.ok(t, "tenants", "create", "umbrella", "--display-name", "Umbrella")
	require.Contains(t, out, "umbrella")
	calls := b.f.callsTo("TenantService/Create")
	require.Len(t, calls, 2, "retried once after UNAVAILABLE")
	key := calls[0].header.Get("Idempotency-Key")
	require.NotEmpty(t, key)
	require.Equal(t, key, calls[1].header.Get("Idempotency-Key"), "a retry reuses the key")

	b.ok(t, "tenants", "create", "hooli")
	calls = b.f.callsTo("TenantService/Create")
	require.NotEqual(t, key, calls[2].header.Get("Idempotency-Key"), "each invocation gets a fresh key")
}

func TestErrorPrinting(t *testing.T) {
	t.Parallel()
	b := setup(t)

	r := b.run(t, "", "tenants", "create", "Bad Name")
	require.Equal(t, 1, r.code)
	require.Equal(t, "Error: INVALID_ARGUMENT: invalid NAME: must match [a-z0-9-]{1,63}\n", r.stderr, "printed once, naming the argument")
	require.Empty(t, r.stdout)

	r = b.run(t, "", "tenants", "get", "nope")
	require.Equal(t, 1, r.code)
	require.Equal(t, "Error: NOT_FOUND: tenant \"nope\" not found\n", r.stderr)

	b.env[envToken] = "" // no token anywhere: the server refuses
	r = b.run(t, "", "whoami")
	require.Equal(t, 1, r.code)
	require.True(t, strings.HasPrefix(r.stderr, "Error: UNAUTHENTICATED: "), r.stderr)
}

func TestConfirmationFlow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.ok(t, "projects", "create", "prod", "--tenant", "acme")
	b.f.protected["prod"] = "cfm_42"
	b.f.confirmations = []*apiv1.Confirmation{{Id: "cfm_42", TenantId: "ten_1", Action: "projects.delete", ResourceType: "Project", ResourceId: "prj_1", PrincipalId: "svc_1", State: "pending", ExpireTime: created}}

	r := b.run(t, "", "projects", "delete", "prod", "--tenant", "acme")
	require.Equal(t, 1, r.code)
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	require.Len(t, lines, 3)
	require.Equal(t, "Error: CONFIRMATION_REQUIRED: deleting a production project needs a human's approval", lines[0])
	require.Equal(t, "  project: labelled production", lines[1])
	require.Contains(t, lines[2], "hint:")
	require.Contains(t, lines[2], "--confirmation-id cfm_42")

	out := b.ok(t, "confirmations", "list", "--tenant", "acme", "--state", "pending")
	require.Contains(t, out, "cfm_42")
	require.Contains(t, out, "Project/prj_1")
	require.Contains(t, b.ok(t, "confirmations", "approve", "cfm_42", "--tenant", "acme"), "approved")

	require.Contains(t, b.ok(t, "projects", "delete", "prod", "--tenant", "acme", "--confirmation-id", "cfm_42"), "deleted")
	calls := b.f.callsTo("ProjectService/Delete")
	require.Equal(t, "cfm_42", calls[len(calls)-1].header.Get("Bc-Confirmation-Id"))
}

func TestPrecedence(t *testing.T) {
	t.Parallel()
	// Nothing listens on dead: a command that picked it would fail. The
	// bundle's env points at the live server unless a case overrides it.
	dead := "http://127.0.0.1:1"

	tests := []struct {
		name       string
		env        map[string]string
		flags      []string
		ctxServer  string
		wantBearer string
	}{
		{"context only", map[string]string{envServer: "", envToken: ""}, nil, "", "Bearer ctx-token"},
		{"env beats context", map[string]string{envToken: "env-token"}, nil, dead, "Bearer env-token"},
		{"flag beats env", map[string]string{envServer: dead, envToken: "env-token"}, []string{"--server", "SRV", "--token", "flag-token"}, dead, "Bearer flag-token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := &Config{}
			cfg.Upsert(Context{Name: "main", Server: cmpOr(tt.ctxServer, b.srv.URL), Token: "ctx-token"}, true)
			require.NoError(t, cfg.Save(b.cfgPath))
			for k, v := range tt.env {
				b.env[k] = v
			}
			var flags []string
			for _, f := range tt.flags {
				flags = append(flags, strings.ReplaceAll(f, "SRV", b.srv.URL))
			}
			b.ok(t, append([]string{"whoami"}, flags...)...)
			calls := b.f.callsTo("WhoAmI")
			require.Equal(t, tt.wantBearer, calls[len(calls)-1].header.Get("Authorization"))
		})
	}
}

func TestNamedContextAndTenantDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env[envServer], b.env[envToken] = "", ""
	cfg := &Config{}
	cfg.Upsert(Context{Name: "default", Server: "http://127.0.0.1:1", Token: "x"}, true)
	cfg.Upsert(Context{Name: "acme", Server: b.srv.URL, Token: "acme-token", Tenant: "acme"}, false)
	require.NoError(t, cfg.Save(b.cfgPath))

	b.ok(t, "projects", "create", "web", "--context", "acme")
	require.Contains(t, b.ok(t, "projects", "list", "--context", "acme"), "web")
	require.Empty(t, b.f.callsTo("WhoAmI"), "a context tenant needs no WhoAmI")

	r := b.run(t, "", "whoami", "--context", "nope")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "Error: INVALID_ARGUMENT: invalid --context: no context")
}

func TestTenantFromWhoAmI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.f.me = &apiv1.WhoAmIResponse{PrincipalId: "svc_1", Kind: "service", Role: "admin", TenantId: "ten_1", TenantName: "acme"}
	b.ok(t, "projects", "create", "api")
	out := b.ok(t, "projects", "get", "api", "-o", "json")
	require.Contains(t, out, `"tenantId": "acme"`)
	require.Len(t, b.f.callsTo("WhoAmI"), 2, "one lazy WhoAmI per invocation")

	// A platform token has no tenant: a tenant-scoped verb asks for --tenant.
	b.f.me = &apiv1.WhoAmIResponse{PrincipalId: "usr_root", Role: "platform-admin"}
	r := b.run(t, "", "projects", "list")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "Error: INVALID_ARGUMENT: invalid --tenant: required")
}

func TestApiKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)

	out := b.ok(t, "api-keys", "create", "--tenant", "acme", "--role", "agent", "--name", "bot", "--ttl", "24h")
	require.Contains(t, out, "secret: bc_abcdSECRETSECRET  (shown once; store it now)")
	require.Contains(t, out, "key_1")
	calls := b.f.callsTo("ApiKeyService/Create")
	require.NotEmpty(t, calls[0].header.Get("Idempotency-Key"))

	out = b.ok(t, "api-keys", "create", "-o", "json")
	var created struct {
		ApiKey struct{ Role, TenantId string } `json:"apiKey"`
		Secret string                          `json:"secret"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &created))
	require.Equal(t, "platform-admin", created.ApiKey.Role, "no tenant = platform key")
	require.Empty(t, created.ApiKey.TenantId)
	require.Equal(t, "bc_abcdSECRETSECRET", created.Secret)

	r := b.run(t, "", "api-keys", "create", "--tenant", "acme")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "Error: INVALID_ARGUMENT: invalid --role: required")

	require.Contains(t, b.ok(t, "api-keys", "revoke", "key_1", "--tenant", "acme"), "key_1")
	require.NotContains(t, b.ok(t, "api-keys", "list", "--tenant", "acme"), "key_1")
	list := b.ok(t, "api-keys", "list", "--tenant", "acme", "--include-revoked")
	require.Contains(t, list, "key_1")
	require.NotContains(t, list, "SECRET")
}

func TestPolicies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	text := "permit (principal, action, resource);\n"
	file := filepath.Join(t.TempDir(), "p.cedar")
	require.NoError(t, os.WriteFile(file, []byte(text), 0o600))

	require.Contains(t, b.ok(t, "iam", "policies", "put", "allow-all", "--tenant", "acme", "--file", file), text)
	r := b.run(t, "forbid (principal, action, resource);", "iam", "policies", "put", "deny", "--tenant", "acme", "-f", "-", "-o", "json")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `"text": "forbid (principal, action, resource);"`)
	b.ok(t, "iam", "policies", "put", "inline", "--tenant", "acme", "--text", text)

	require.Contains(t, b.ok(t, "iam", "policies", "get", "deny", "--tenant", "acme"), "forbid")
	list := b.ok(t, "iam", "policies", "list", "--tenant", "acme")
	require.Len(t, strings.Split(strings.TrimSpace(list), "\n"), 4)

	r = b.run(t, "", "iam", "policies", "put", "x", "--tenant", "acme")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "Error: INVALID_ARGUMENT")
}

func TestAudit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 5 {
		b.f.audit = append(b.f.audit, &apiv1.AuditEntry{Id: "aud_" + string(rune('a'+i)), Time: created, TenantId: "ten_1", Action: "projects.create", Decision: "allow", Result: "OK", PrincipalId: "svc_1", ResourceType: "Project", ResourceId: "prj_1"})
	}
	b.f.audit = append(b.f.audit, &apiv1.AuditEntry{Id: "aud_z", Action: "tenants.create", Decision: "deny", Result: "PERMISSION_DENIED"})

	all := b.ok(t, "audit", "list")
	require.Len(t, strings.Split(strings.TrimSpace(all), "\n"), 7)
	require.Len(t, strings.Split(strings.TrimSpace(b.ok(t, "audit", "list", "--limit", "3")), "\n"), 4)
	only := b.ok(t, "audit", "list", "--action", "tenants.create", "-o", "json")
	require.Contains(t, only, "PERMISSION_DENIED")
	require.NotContains(t, only, "projects.create")
	b.ok(t, "audit", "list", "--tenant", "ten_1")
	calls := b.f.callsTo("AuditService/List")
	require.Len(t, calls, 3+2+1+3)
}

func TestEventsWatch(t *testing.T) {
	t.Parallel()
	b := setup(t)

	out := b.watchEnds(t, "Error: UNAVAILABLE: the server ended the event stream; resume with --after 2", "events", "watch", "--tenant", "acme")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	require.Equal(t, []string{"ID", "TIME", "TYPE", "RESOURCE", "TENANT"}, strings.Fields(lines[0]), "a header first")
	require.Equal(t, []string{"1", "2025-01-02T03:04:05Z", "tenant.created", "Tenant/ten_1", "ten_1"}, strings.Fields(lines[1]))

	out = b.watchEnds(t, "resume with --after 2", "events", "watch", "--after", "1", "--type", "project.", "-o", "json")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 1, "one JSON object per line")
	var ev struct{ ID, Type string }
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &ev))
	require.Equal(t, "project.created", ev.Type)
	require.Len(t, b.f.callsTo("EventService/Watch"), 2)
	require.Equal(t, "Bearer "+token, b.f.callsTo("EventService/Watch")[0].header.Get("Authorization"))
}

func TestEventsWatchInterruptIsClean(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	a := newApp("dev", func(k string) (string, bool) {
		v := map[string]string{envServer: b.srv.URL, envToken: token, envConfig: b.cfgPath}[k]
		return v, v != ""
	})
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(ctx, a, []string{"events", "watch", "--tenant", "acme"}, nil, &out, &errb), errb.String())
}

func TestWhoAmI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out := b.ok(t, "whoami")
	require.Contains(t, out, "PRINCIPAL:")
	require.Contains(t, out, "usr_root")
	var me struct{ PrincipalId, Role string }
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "whoami", "-o", "json")), &me))
	require.Equal(t, "platform-admin", me.Role)
	require.Equal(t, "better-compute-cli/v1.2.3", b.f.callsTo("WhoAmI")[0].header.Get("User-Agent"))
}

func TestConfigCommandsAndFileMode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env[envServer], b.env[envToken] = "", ""

	b.ok(t, "config", "set-context", "local", "--server", b.srv.URL, "--token", token, "--tenant", "acme")
	st, err := os.Stat(b.cfgPath)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	dst, err := os.Stat(filepath.Dir(b.cfgPath))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), dst.Mode().Perm())

	cfg, err := LoadConfig(b.cfgPath)
	require.NoError(t, err)
	require.Equal(t, "local", cfg.CurrentContext, "the first context becomes current")
	require.Equal(t, Context{Name: "local", Server: b.srv.URL, Token: token, Tenant: "acme"}, cfg.Contexts[0])

	// The saved context now drives commands, tenant included.
	require.Contains(t, b.ok(t, "projects", "list"), "NAME")

	b.ok(t, "config", "set-context", "other", "--server", "http://example.invalid", "--token", "t2")
	out := b.ok(t, "config", "get-contexts")
	require.Contains(t, out, "*")
	require.NotContains(t, out, "t2")
	b.ok(t, "config", "use-context", "other")
	cfg, err = LoadConfig(b.cfgPath)
	require.NoError(t, err)
	require.Equal(t, "other", cfg.CurrentContext)
	require.Len(t, cfg.Contexts, 2)

	r := b.run(t, "", "config", "use-context", "missing")
	require.Equal(t, 1, r.code)
}

func TestLoadConfigMissingIsEmpty(t *testing.T) {
	t.Parallel()
	cfg, err := LoadConfig(filepath.Join(t.TempDir(), "nope.yaml"))
	require.NoError(t, err)
	require.Equal(t, &Config{}, cfg)
}

func TestConfigUpsertAndYAMLShape(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "c.yaml")
	cfg := &Config{}
	cfg.Upsert(Context{Name: "a", Server: "s1", Token: "t1"}, false)
	cfg.Upsert(Context{Name: "b", Server: "s2", Token: "t2"}, true)
	cfg.Upsert(Context{Name: "a", Server: "s3", Token: "t3"}, false)
	require.NoError(t, cfg.Save(path))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "current-context: b\ncontexts:\n  - name: a\n    server: s3\n    token: t3\n  - name: b\n    server: s2\n    token: t2\n", string(b))
}

func TestConfigPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"env wins", map[string]string{envConfig: "/x/c.yaml", "HOME": "/home/u"}, "/x/c.yaml"},
		{"home default", map[string]string{"HOME": "/home/u"}, "/home/u/.config/better-compute/config.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := configPath(func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok })
			require.Equal(t, tt.want, got)
		})
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tests := []struct {
		name string
		argv []string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, "Error: unknown command \"frobnicate\" for \"better-compute\"\nRun 'better-compute --help' for usage.\n"},
		{"misspelt command", []string{"tenant", "lst"}, "Error: unknown command \"lst\" for \"better-compute tenants\"; did you mean \"list\"?\nRun 'better-compute tenants --help' for usage.\n"},
		{"misspelt top command", []string{"tenats", "list"}, "Error: unknown command \"tenats\" for \"better-compute\"; did you mean \"tenants\"?\n"},
		{"unknown flag", []string{"tenants", "list", "--bogus"}, "Error: unknown flag --bogus\nRun 'better-compute tenants list --help' for usage.\n"},
		{"misspelt flag", []string{"tenants", "list", "--limt", "1"}, "Error: unknown flag --limt; did you mean --limit?\n"},
		{"flag prefix", []string{"api-keys", "list", "--include-revoke"}, "Error: unknown flag --include-revoke; did you mean --include-revoked?\n"},
		{"inherited flag", []string{"tenants", "list", "--outptu", "json"}, "Error: unknown flag --outptu; did you mean --output?\n"},
		{"bad flag value", []string{"tenants", "list", "--limit", "many"}, "Error: invalid argument \"many\" for \"--limit\" flag"},
		{"missing argument", []string{"tenants", "get"}, "Error: invalid NAME: required\n"},
		{"extra argument", []string{"tenants", "list", "x"}, "Error: unexpected argument \"x\"\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := b.run(t, "", tt.argv...)
			require.Equal(t, 1, r.code, "a usage mistake exits non-zero")
			require.True(t, strings.HasPrefix(r.stderr, tt.want), r.stderr)
			require.NotContains(t, r.stderr, "INVALID_ARGUMENT", "a usage mistake never reached a server")
			require.Empty(t, r.stdout, "no help on a mistake")
		})
	}
	require.Empty(t, b.f.calls, "a usage mistake calls nothing")

	// A group given nothing prints its help and succeeds.
	r := b.run(t, "", "tenants")
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stdout, "Available Commands:")
}

func TestNoServer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env[envServer] = ""
	r := b.run(t, "", "tenants", "list")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "Error: INVALID_ARGUMENT: invalid --server: not set")
}

func TestRegisteredAndCompletionCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, "hooked ran\n", b.ok(t, "hooked"))
	require.Contains(t, b.ok(t, "completion", "bash"), "bash completion")
	root := NewRootCommand("x")
	found, _, err := root.Find([]string{"hooked"})
	require.NoError(t, err)
	require.Equal(t, "hooked", found.Name())
}

// The context's tenant goes with the context's token: a key passed with
// --token or the environment works in its own tenant (the dev context's
// tenant sim would otherwise send a member of acme to sim).
func TestTokenOverrideTakesTheTokensTenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env[envServer], b.env[envToken] = "", ""
	cfg := &Config{}
	cfg.Upsert(Context{Name: "dev", Server: b.srv.URL, Token: "admin-token", Tenant: "sim"}, true)
	require.NoError(t, cfg.Save(b.cfgPath))
	b.f.me = &apiv1.WhoAmIResponse{PrincipalId: "key_m", Kind: "service", Role: "member", TenantId: "ten_1", TenantName: "acme"}

	tenantOf := func(out string) string {
		var p struct{ Project struct{ TenantId string } }
		require.NoError(t, json.Unmarshal([]byte(out), &p))
		return p.Project.TenantId
	}
	require.Equal(t, "acme", tenantOf(b.ok(t, "projects", "create", "a", "--token", "member-token", "-o", "json")))
	b.env[envToken] = "member-token"
	require.Equal(t, "acme", tenantOf(b.ok(t, "projects", "create", "b", "-o", "json")))
	// The context's own token keeps the context's tenant, without asking.
	b.env[envToken] = ""
	calls := len(b.f.callsTo("WhoAmI"))
	require.Equal(t, "sim", tenantOf(b.ok(t, "projects", "create", "c", "-o", "json")))
	require.Equal(t, "sim", tenantOf(b.ok(t, "projects", "create", "d", "--token", "admin-token", "-o", "json")))
	require.Len(t, b.f.callsTo("WhoAmI"), calls)
	// --tenant still wins.
	require.Equal(t, "globex", tenantOf(b.ok(t, "projects", "create", "e", "--token", "member-token", "--tenant", "globex", "-o", "json")))

	// A platform key passed with --token has no tenant to default to.
	b.f.me = &apiv1.WhoAmIResponse{PrincipalId: "key_p", Role: "platform-admin"}
	r := b.run(t, "", "projects", "list", "--token", "platform-token")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "pass --tenant")
}

// A server's INVALID_ARGUMENT is printed once per violation, naming the flag
// (or argument) the user gave rather than the API field.
func TestViolationsNameTheFlag(t *testing.T) {
	t.Parallel()
	root := newApp("v", func(string) (string, bool) { return "", false }).command()
	find := func(args ...string) *cobra.Command {
		cmd, _, err := root.Find(args)
		require.NoError(t, err)
		return cmd
	}
	keys, reserve := find("api-keys", "create"), find("reserve")
	for _, tt := range []struct {
		cmd         *cobra.Command
		field, want string
	}{
		{keys, "ttl_seconds", "--ttl"},
		{keys, "role", "--role"},
		{reserve, "duration_seconds", "--for"},
		{reserve, "start_time", "--start"},
		{reserve, "gpus", "--gpus"},
		{find("tenants", "create"), "display_name", "--display-name"},
		{find("tenants", "create"), "name", "NAME"},
		{keys, "selector.gpu.model", "selector.gpu.model"},
	} {
		require.Equal(t, tt.want, fieldLabel(tt.cmd, tt.field), "%s %s", tt.cmd.CommandPath(), tt.field)
	}

	var w strings.Builder
	printError(&w, keys, apiError(connect.CodeInvalidArgument, "INVALID_ARGUMENT", "invalid ttl_seconds: must be at most 31536000", "",
		&apiv1.FieldViolation{Field: "ttl_seconds", Reason: "must be at most 31536000"}))
	require.Equal(t, "Error: INVALID_ARGUMENT: invalid --ttl: must be at most 31536000\n", w.String())

	w.Reset()
	printError(&w, reserve, apiError(connect.CodeInvalidArgument, "INVALID_ARGUMENT", "invalid gpus: must be at least 1 (and 1 more)", "",
		&apiv1.FieldViolation{Field: "gpus", Reason: "must be at least 1"},
		&apiv1.FieldViolation{Field: "duration_seconds", Reason: "must be positive"}))
	require.Equal(t, "Error: INVALID_ARGUMENT: invalid request\n  --gpus: must be at least 1\n  --for: must be positive\n", w.String())
}

// watchEnds runs a watch against the fake, whose streams end after the
// backlog: the watch exits non-zero saying so and how to resume, and
// returns what it printed.
func (b *bundle) watchEnds(t *testing.T, want string, argv ...string) string {
	t.Helper()
	r := b.run(t, "", argv...)
	require.Equal(t, 1, r.code, "a stream the user did not stop is a failure; stderr: %s", r.stderr)
	require.Contains(t, r.stderr, want)
	return r.stdout
}

// A stream that fails keeps its code and says how to follow on.
func TestEventsWatchFailureSaysHowToResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env[envServer] = "http://127.0.0.1:1"
	r := b.run(t, "", "events", "watch", "--tenant", "acme", "--after", "7")
	require.Equal(t, 1, r.code)
	require.True(t, strings.HasPrefix(r.stderr, "Error: UNAVAILABLE: the event stream failed: "), r.stderr)
	require.Contains(t, r.stderr, "; resume with --after 7")
}

// api-keys revoke finds the key by id: it sends no tenant unless --tenant
// is given, not even the context's.
func TestApiKeysRevokeByID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env[envServer], b.env[envToken] = "", ""
	cfg := &Config{}
	cfg.Upsert(Context{Name: "dev", Server: b.srv.URL, Token: "admin-token", Tenant: "sim"}, true)
	require.NoError(t, cfg.Save(b.cfgPath))
	b.ok(t, "api-keys", "create", "--tenant", "acme", "--role", "member")
	require.Contains(t, b.ok(t, "api-keys", "revoke", "key_1"), "key_1")
	b.ok(t, "api-keys", "revoke", "key_1", "--tenant", "acme")
	require.Empty(t, b.f.callsTo("WhoAmI"))
	b.f.mu.Lock()
	defer b.f.mu.Unlock()
	require.Len(t, b.f.revokes, 2)
	require.Empty(t, b.f.revokes[0].GetTenant(), "no tenant: the id finds the key")
	require.Equal(t, "acme", b.f.revokes[1].GetTenant())
}

// A refusal on a tenant the context chose says where the tenant came from.
func TestRefusalHintsAtTheContextTenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env[envServer], b.env[envToken] = "", ""
	cfg := &Config{}
	cfg.Upsert(Context{Name: "dev", Server: b.srv.URL, Token: "ctx-token", Tenant: "sim"}, true)
	require.NoError(t, cfg.Save(b.cfgPath))
	b.f.denyTenant = "sim"
	r := b.run(t, "", "projects", "list")
	require.Equal(t, 1, r.code)
	require.Equal(t, "Error: PERMISSION_DENIED: key key_m (member of acme) may not projects.list on tenant sim\n"+
		"hint: the tenant came from context \"dev\" (tenant sim); pass --tenant to choose another\n", r.stderr)
	r = b.run(t, "", "projects", "list", "--tenant", "sim")
	require.Equal(t, 1, r.code)
	require.NotContains(t, r.stderr, "hint:", "the user chose this tenant")
}
