package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
)

// Environment variables the CLI reads; a flag overrides each.
const (
	envServer = "BETTER_COMPUTE_SERVER"
	envToken  = "BETTER_COMPUTE_TOKEN"
	envConfig = "BETTER_COMPUTE_CONFIG"
)

// extraCommands are subcommands defined outside this file set's verbs (serve,
// dev), added by their files' init through register so the root command does
// not need to know about them.
var extraCommands []func() *cobra.Command

// register adds a subcommand constructor to every root command built after it.
func register(f func() *cobra.Command) {
	extraCommands = append(extraCommands, f)
}

// app is one invocation's state: the global flags and what is resolved from
// them lazily, so that commands that need no server (version, completion,
// config) never load credentials or dial anything.
type app struct {
	version   string
	lookupEnv func(string) (string, bool)
	// httpClient is nil for http.DefaultClient; tests leave it so.
	httpClient *http.Client
	// retryBackoff is the first pause before retrying a create.
	retryBackoff time.Duration

	flagServer, flagToken, flagContext, flagOutput, flagConfig string
	root                                                       *cobra.Command

	cfg    *Config
	cfgCtx *Context
	api    *client.Client
	me     *apiv1.WhoAmIResponse
	// tenantFrom says where a defaulted --tenant came from, for the hint
	// under a refusal.
	tenantFrom string
}

// NewRootCommand returns the better-compute command tree; version is what
// `better-compute version` prints.
func NewRootCommand(version string) *cobra.Command {
	return newApp(version, os.LookupEnv).command()
}

func newApp(version string, lookupEnv func(string) (string, bool)) *app {
	return &app{version: version, lookupEnv: lookupEnv, retryBackoff: 200 * time.Millisecond}
}

func (a *app) command() *cobra.Command {
	root := &cobra.Command{
		Use:   "better-compute",
		Short: "Operate a better-compute platform",
		Long: `better-compute runs a Better Compute control plane and operates it.

  Run it:         serve, dev, pki, daemon, doctor, support-bundle
  Tenancy:        tenants, projects, api-keys, iam, confirmations, whoami
  Observe:        audit, events, webhooks
  Fleet:          nodes, commands, batches, inventory, join-tokens, join-requests, trust-anchors
  Health:         gpus, remediations (and nodes health, pools health)
  Fleet as code:  fleet (plan, apply, export)
  Capacity:       pools, reserve, reservations, quotas, budgets, capacity, usage
  Images:         images, signer-keys
  Releases:       release (sign and verify bcd releases, offline), rollouts
  Bare metal:     sites, site-tokens, drivers, machines, workflows, profiles
  Instances:      instances, volumes, flavors, ip-pools, secrets, provider-accounts
  Sandboxes:      sandboxes, sandbox-templates
  Identity:       workload-token
  Agents:         mcp
  This CLI:       config, version

The server and token come from --server/--token, else the environment
(` + envServer + `, ` + envToken + `), else the current context of the
config file. A token given by flag or environment works in its own tenant.
Every command exits 0 when it did what was asked and 1 otherwise; fleet plan
exits 2 when applying would change something.`,
		SilenceErrors: true, // Main prints errors with their machine code
		SilenceUsage:  true, // a server refusal is not a usage mistake
		PersistentPreRunE: func(*cobra.Command, []string) error {
			switch a.flagOutput {
			case "table", "json", "yaml":
				return nil
			}
			return invalidArg("output", fmt.Sprintf("must be table, json or yaml, not %q", a.flagOutput))
		},
	}
	a.root = root
	pf := root.PersistentFlags()
	pf.StringVar(&a.flagServer, "server", "", "API server URL (env "+envServer+")")
	pf.StringVar(&a.flagToken, "token", "", "API key or OIDC token (env "+envToken+")")
	pf.StringVar(&a.flagContext, "context", "", "named context from the config file (default: its current-context)")
	pf.StringVarP(&a.flagOutput, "output", "o", "table", "output format: table, json or yaml")
	pf.StringVar(&a.flagConfig, "config", "", "config file (default $"+envConfig+" or ~/.config/better-compute/config.yaml)")
	root.SetFlagErrorFunc(flagError)

	root.AddCommand(
		a.versionCommand(),
		a.whoamiCommand(),
		a.configCommand(),
		a.tenantsCommand(),
		a.projectsCommand(),
		a.apiKeysCommand(),
		a.iamCommand(),
		a.confirmationsCommand(),
		a.auditCommand(),
		a.eventsCommand(),
	)
	root.AddCommand(a.fleetCommands()...)
	root.AddCommand(a.poolsCommand(), a.fleetConfigCommand())
	root.AddCommand(a.doctorCommand(), a.supportBundleCommand())
	root.AddCommand(a.imagesCommand(), a.signerKeysCommand())
	root.AddCommand(a.releaseCommand(), a.releasesCommand(), a.rolloutsCommand())
	root.AddCommand(a.sitesCommand(), a.siteTokensCommand(), a.driversCommand(), a.machinesCommand(), a.workflowsCommand())
	root.AddCommand(a.flavorsCommand(), a.ipPoolsCommand(), a.secretsCommand(), a.providerAccountsCommand(),
		a.profilesCommand())
	root.AddCommand(a.instancesCommand(), a.volumesCommand())
	root.AddCommand(a.sandboxTemplatesCommand(), a.sandboxesCommand())
	root.AddCommand(a.capacityCommand(), a.usageCommand(), a.workloadTokenCommand())
	root.AddCommand(a.quotasCommand())
	root.AddCommand(a.budgetsCommand())
	root.AddCommand(a.webhooksCommand())
	root.AddCommand(a.reservationCommands()...)
	root.AddCommand(a.mcpCommand())
	for _, f := range extraCommands {
		root.AddCommand(f())
	}
	refuseUnknownSubcommands(root)
	return root
}

// Main runs the CLI with args (without the program name) and returns the
// process exit code. Interrupt and SIGTERM cancel the running call.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, newApp(mainVersion(), os.LookupEnv), args, os.Stdin, os.Stdout, os.Stderr)
}

// run executes one invocation and prints any error to stderr.
func run(ctx context.Context, a *app, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := a.command()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if cmd, err := root.ExecuteContextC(ctx); err != nil {
		var ec *exitCodeError
		if errors.As(err, &ec) {
			return ec.code
		}
		printError(stderr, cmd, err)
		if client.Code(err) == "PERMISSION_DENIED" && a.tenantFrom != "" {
			fmt.Fprintf(stderr, "hint: the tenant came from %s; pass --tenant to choose another\n", a.tenantFrom)
		}
		return 1
	}
	return 0
}

// usageError is a mistake in the command line itself (an unknown command or
// flag, a missing argument): it never reached a server, so it is printed
// without a server code and with where to read the usage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// refuseUnknownSubcommands makes every command group refuse an unknown
// subcommand (cobra would print the group's help and exit 0), suggesting
// the nearest one; a group given nothing still prints its help.
func refuseUnknownSubcommands(cmd *cobra.Command) {
	if cmd.HasSubCommands() && !cmd.Runnable() {
		cmd.Args = cobra.ArbitraryArgs
		cmd.SuggestionsMinimumDistance = 2
		cmd.RunE = func(cmd *cobra.Command, argv []string) error {
			if len(argv) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q for %q", argv[0], cmd.CommandPath())
			// cobra lists its suggestions in command order: take the nearest.
			best := ""
			for _, s := range cmd.SuggestionsFor(argv[0]) {
				if best == "" || editDistance(argv[0], s) < editDistance(argv[0], best) {
					best = s
				}
			}
			if best != "" {
				msg += fmt.Sprintf("; did you mean %q?", best)
			}
			return usagef("%s", msg)
		}
	}
	for _, c := range cmd.Commands() {
		refuseUnknownSubcommands(c)
	}
}

// flagError turns pflag's complaint into a usage error, suggesting the
// nearest flag for an unknown one (--gpu → --gpus).
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "unknown flag: --"); ok {
		msg = "unknown flag --" + name
		if s := nearestFlag(cmd, name); s != "" {
			msg += fmt.Sprintf("; did you mean --%s?", s)
		}
	}
	return usagef("%s", msg)
}

// nearestFlag is the flag of cmd closest to name: one that name is a prefix
// of or that is a prefix of name, else one within two edits.
func nearestFlag(cmd *cobra.Command, name string) string {
	best, bestDist := "", 3
	visit := func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := editDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) || strings.HasPrefix(name, f.Name) {
			d = min(d, 1)
		}
		if d < bestDist || d == bestDist && f.Name < best {
			best, bestDist = f.Name, d
		}
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// printError writes `Error: CODE: message`, the field violations once each
// (named by the flag or argument the user gave, where the command has one)
// and, for CONFIRMATION_REQUIRED, how to proceed. A usage mistake is
// printed without a code, with where to read the usage.
func printError(w io.Writer, cmd *cobra.Command, err error) {
	var ue *usageError
	var ce *connect.Error
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(w, "Error: %s\n", ue.msg)
		if cmd != nil {
			fmt.Fprintf(w, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
		return
	case !errors.As(err, &ce):
		// A local failure that is neither a usage mistake nor a server's
		// answer (a file that cannot be read): no code would be honest.
		fmt.Fprintf(w, "Error: %s\n", err.Error())
		return
	}
	code, msg := client.Code(err), ce.Message()
	d := client.Detail(err)
	if d != nil && d.GetMessage() != "" {
		msg = d.GetMessage()
	}
	vs := d.GetViolations()
	if code == "INVALID_ARGUMENT" && len(vs) > 0 && isViolationSummary(msg, vs[0]) {
		// The message only repeats the first violation: print each once.
		if len(vs) == 1 {
			fmt.Fprintf(w, "Error: %s: invalid %s: %s\n", code, fieldLabel(cmd, vs[0].GetField()), vs[0].GetReason())
			return
		}
		fmt.Fprintf(w, "Error: %s: invalid request\n", code)
		for _, v := range vs {
			fmt.Fprintf(w, "  %s: %s\n", fieldLabel(cmd, v.GetField()), v.GetReason())
		}
		return
	}
	fmt.Fprintf(w, "Error: %s: %s\n", code, msg)
	for _, v := range vs {
		fmt.Fprintf(w, "  %s: %s\n", fieldLabel(cmd, v.GetField()), v.GetReason())
	}
	if id := d.GetConfirmationId(); id != "" {
		fmt.Fprintf(w, "hint: confirmation %s awaits a human's approval (better-compute confirmations approve %s); then rerun this command with --confirmation-id %s\n", id, id, id)
	}
}

// isViolationSummary reports whether msg is the envelope's summary of its
// violations ("invalid FIELD: REASON", maybe "(and N more)").
func isViolationSummary(msg string, first *apiv1.FieldViolation) bool {
	return strings.HasPrefix(msg, fmt.Sprintf("invalid %s: %s", first.GetField(), first.GetReason()))
}

// flagAliases are API fields whose flag is not their name with dashes,
// tried in order; a flag is used only where the command has it.
var flagAliases = map[string][]string{
	"ttl_seconds":      {"ttl"},
	"duration_seconds": {"for"},
	"extend_seconds":   {"for"},
	"start_time":       {"start"},
	"end_time":         {"end", "until"},
	"step_seconds":     {"step"},
	"deadline_seconds": {"deadline"},
	"params":           {"param"},
	"type_prefixes":    {"type"},
	"name_prefix":      {"prefix"},
	"page_size":        {"limit"},
}

// fieldLabel names an API field as the user gave it: --flag where the
// command has a flag for it, the positional argument (NAME) where its
// usage line has one, else the field itself.
func fieldLabel(cmd *cobra.Command, field string) string {
	if cmd == nil || field == "" {
		return field
	}
	candidates := append([]string{strings.ReplaceAll(field, "_", "-")}, flagAliases[field]...)
	for _, name := range candidates {
		if cmd.Flags().Lookup(name) != nil {
			return "--" + name
		}
	}
	for _, arg := range strings.Fields(cmd.Use)[1:] {
		if strings.Trim(arg, "[]") == strings.ToUpper(field) {
			return strings.ToUpper(field)
		}
	}
	return field
}

// invalidArg is a local refusal in the same shape as the server's, so it
// prints the same way.
func invalidArg(field, reason string) error {
	cerr := connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid %s: %s", field, reason))
	if d, err := connect.NewErrorDetail(&apiv1.ErrorDetail{
		Code:       "INVALID_ARGUMENT",
		Message:    fmt.Sprintf("invalid %s: %s", field, reason),
		Violations: []*apiv1.FieldViolation{{Field: field, Reason: reason}},
	}); err == nil {
		cerr.AddDetail(d)
	}
	return cerr
}

// args checks the positional arguments and names them in the error.
func positional(names ...string) cobra.PositionalArgs {
	return func(_ *cobra.Command, got []string) error {
		if len(got) == len(names) {
			return nil
		}
		if len(got) < len(names) {
			return usagef("invalid %s: required", names[len(got)])
		}
		return usagef("unexpected argument %q", got[len(names)])
	}
}

// config loads the config file once.
func (a *app) config() (*Config, error) {
	if a.cfg != nil {
		return a.cfg, nil
	}
	path := a.configPath()
	cfg, err := LoadConfig(path)
	if err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	a.cfg = cfg
	return cfg, nil
}

func (a *app) configPath() string {
	if a.flagConfig != "" {
		return a.flagConfig
	}
	return configPath(a.lookupEnv)
}

// context returns the selected context: --context, else the config's current
// one; the zero Context when neither is set.
func (a *app) context() (Context, error) {
	if a.cfgCtx != nil {
		return *a.cfgCtx, nil
	}
	cfg, err := a.config()
	if err != nil {
		return Context{}, err
	}
	name := a.flagContext
	if name == "" {
		name = cfg.CurrentContext
	}
	var c Context
	if name != "" {
		var ok bool
		if c, ok = cfg.Lookup(name); !ok {
			return Context{}, invalidArg("context", fmt.Sprintf("no context %q in %s", name, a.configPath()))
		}
	}
	a.cfgCtx = &c
	return c, nil
}

// setting resolves one setting by precedence: flag, environment, context.
func (a *app) setting(flag, env, fromContext string) string {
	if a.root.PersistentFlags().Changed(flag) {
		return a.root.PersistentFlags().Lookup(flag).Value.String()
	}
	if v, ok := a.lookupEnv(env); ok && v != "" {
		return v
	}
	return fromContext
}

// client returns the API client for the resolved server and token.
func (a *app) client() (*client.Client, error) {
	if a.api != nil {
		return a.api, nil
	}
	c, err := a.context()
	if err != nil {
		return nil, err
	}
	server := a.setting("server", envServer, c.Server)
	if server == "" {
		return nil, invalidArg("server", "not set: pass --server, set "+envServer+", or use a context with a server")
	}
	token := a.setting("token", envToken, c.Token)
	var opts []client.Option
	if a.httpClient != nil {
		opts = append(opts, client.WithHTTPClient(a.httpClient))
	}
	// A command of many reads (fleet plan, a watch's catch-up) waits out
	// the per-principal rate limit instead of failing halfway.
	opts = append(opts, client.WithHeader("User-Agent", "better-compute-cli/"+a.version), client.WithRateLimitRetry(30*time.Second))
	a.api = client.New(server, token, opts...)
	return a.api, nil
}

// whoami calls IdentityService.WhoAmI once per invocation.
func (a *app) whoami(ctx context.Context) (*apiv1.WhoAmIResponse, error) {
	if a.me != nil {
		return a.me, nil
	}
	c, err := a.client()
	if err != nil {
		return nil, err
	}
	resp, err := c.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	if err != nil {
		return nil, err
	}
	a.me = resp.Msg
	return a.me, nil
}

// tokenOverridden reports whether --token or the environment replaces the
// context's credentials with others.
func (a *app) tokenOverridden(c Context) bool {
	return a.setting("token", envToken, c.Token) != c.Token
}

// tenant resolves --tenant: the flag, else the context's tenant, else the
// tenant of a tenant-scoped token (asking the server only then). A platform
// token has none; required decides whether that is an error. The context's
// tenant goes with the context's credentials: when --token or the
// environment brings another key, the tenant comes from that key, so a
// member of acme is not sent to the context's tenant sim.
func (a *app) tenant(ctx context.Context, flag string, required bool) (string, error) {
	if flag != "" {
		return flag, nil
	}
	c, err := a.context()
	if err != nil {
		return "", err
	}
	if c.Tenant != "" && !a.tokenOverridden(c) {
		a.tenantFrom = fmt.Sprintf("context %q (tenant %s)", c.Name, c.Tenant)
		return c.Tenant, nil
	}
	me, err := a.whoami(ctx)
	if err != nil {
		return "", err
	}
	if t := cmpOr(me.GetTenantName(), me.GetTenantId()); t != "" {
		return t, nil
	}
	if required {
		if c.Tenant != "" {
			return "", invalidArg("tenant", "required: this token is a platform key and the context's tenant belongs to the context's token; pass --tenant")
		}
		return "", invalidArg("tenant", "required: pass --tenant or set a tenant in the context")
	}
	return "", nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// retry runs call again, after a pause, when it fails as UNAVAILABLE (a
// network failure or a server briefly down). Only callers whose request is
// safe to repeat use it: a create with the same Idempotency-Key on every try.
func (a *app) retry(ctx context.Context, call func() error) error {
	const attempts = 3
	pause := a.retryBackoff
	for i := 1; ; i++ {
		err := call()
		if err == nil || i == attempts || connect.CodeOf(err) != connect.CodeUnavailable {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause *= 2
	}
}

// mutation carries the headers of one mutating invocation.
type mutation struct {
	idempotencyKey string
	confirmationID string
}

// newCreate returns the headers of a create: a fresh Idempotency-Key that
// every retry of this invocation reuses.
func newCreate(confirmationID string) mutation {
	return mutation{idempotencyKey: client.NewIdempotencyKey(), confirmationID: confirmationID}
}

func (m mutation) apply(h http.Header) {
	if m.idempotencyKey != "" {
		h.Set(client.HeaderIdempotencyKey, m.idempotencyKey)
	}
	if m.confirmationID != "" {
		h.Set(client.HeaderConfirmationID, m.confirmationID)
	}
}

// request wraps msg with the mutation's headers.
func request[T any](msg *T, m mutation) *connect.Request[T] {
	req := connect.NewRequest(msg)
	m.apply(req.Header())
	return req
}

// addConfirmationFlag adds --confirmation-id, for replaying a request a human
// approved after the server answered CONFIRMATION_REQUIRED.
func addConfirmationFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "confirmation-id", "", "replay with this approved confirmation")
}

func addTenantFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "tenant", "", "tenant name or id (default: the context's tenant, else the token's)")
}

// listAll follows next_page_token until the last page or until limit items
// (0 = no limit), asking for no more than are still wanted.
func listAll[T any](ctx context.Context, limit int, page func(ctx context.Context, token string, size int32) ([]T, string, error)) ([]T, error) {
	var all []T
	token := ""
	for {
		var size int32
		if limit > 0 {
			// Never above the API's cap: a larger page_size is refused
			// INVALID_ARGUMENT, so --limit 600 would fail outright.
			size = int32(min(limit-len(all), envelope.MaxPageSize))
		}
		items, next, err := page(ctx, token, size)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if limit > 0 && len(all) >= limit {
			return all[:limit], nil
		}
		if next == "" {
			return all, nil
		}
		if next == token {
			// A server bug would otherwise loop forever.
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("server repeated page token %q", next))
		}
		token = next
	}
}

func addLimitFlag(cmd *cobra.Command, p *int) {
	cmd.Flags().IntVar(p, "limit", 0, "return at most this many (default: all, following every page)")
}
