package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
)

// setupPlan is what `iam setup` makes: the operator's tenant, its projects,
// its Cedar policies and its first keys. The interactive questions fill the
// same document a --file brings, so both paths validate and apply alike.
type setupPlan struct {
	Tenant      string        `yaml:"tenant"`
	DisplayName string        `yaml:"display_name,omitempty"`
	Projects    []string      `yaml:"projects,omitempty"`
	Policies    []setupPolicy `yaml:"policies,omitempty"`
	Keys        []setupKey    `yaml:"keys,omitempty"`
}

type setupPolicy struct {
	ID string `yaml:"id"`
	// File is read relative to the plan's own file.
	File string `yaml:"file,omitempty"`
	Text string `yaml:"text,omitempty"`
}

type setupKey struct {
	Name string `yaml:"name,omitempty"`
	Role string `yaml:"role"`
	// TTL is a Go duration (720h); empty means no expiry.
	TTL string `yaml:"ttl,omitempty"`
	// Context, when set, saves the new key as a CLI context of that name.
	Context string `yaml:"context,omitempty"`
}

var setupRoles = []string{"admin", "operator", "member", "viewer", "agent"}

// validate checks the whole plan before anything is written, so a bad
// field never leaves a tenant half set up. base resolves policy files.
func (p *setupPlan) validate(base string) error {
	var vs envelope.Violations
	vs.Name("tenant", p.Tenant)
	seen := map[string]bool{}
	for i, name := range p.Projects {
		f := fmt.Sprintf("projects[%d]", i)
		vs.Name(f, name)
		if seen[name] {
			vs.Add(f, "project %q is named twice", name)
		}
		seen[name] = true
	}
	ids := map[string]bool{}
	for i := range p.Policies {
		pol := &p.Policies[i]
		f := fmt.Sprintf("policies[%d]", i)
		vs.Name(f+".id", pol.ID)
		if ids[pol.ID] {
			vs.Add(f+".id", "policy %q is named twice", pol.ID)
		}
		ids[pol.ID] = true
		switch {
		case pol.File == "" && strings.TrimSpace(pol.Text) == "":
			vs.Add(f, "needs file or text")
		case pol.File != "" && pol.Text != "":
			vs.Add(f, "takes file or text, not both")
		case pol.File != "":
			path := pol.File
			if !filepath.IsAbs(path) {
				path = filepath.Join(base, path)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				vs.Add(f+".file", "cannot be read: %v", err)
				break
			}
			pol.Text, pol.File = string(b), ""
		}
	}
	names, contexts := map[string]bool{}, map[string]bool{}
	for i := range p.Keys {
		k := &p.Keys[i]
		f := fmt.Sprintf("keys[%d]", i)
		if !contains(setupRoles, k.Role) {
			vs.Add(f+".role", "must be one of %s, got %q", strings.Join(setupRoles, ", "), k.Role)
		}
		if k.Name == "" {
			k.Name = k.Role
		}
		vs.Name(f+".name", k.Name)
		if names[k.Name] {
			vs.Add(f+".name", "key %q is named twice: give each key its own name", k.Name)
		}
		names[k.Name] = true
		if k.TTL != "" {
			if d, err := time.ParseDuration(k.TTL); err != nil || d <= 0 {
				vs.Add(f+".ttl", "must be a positive duration such as 720h, got %q", k.TTL)
			}
		}
		if k.Context != "" {
			vs.Name(f+".context", k.Context)
			if contexts[k.Context] {
				vs.Add(f+".context", "context %q is named twice", k.Context)
			}
			contexts[k.Context] = true
		}
	}
	return violationsErr(vs)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// violationsErr turns locally found violations into the same error the
// server sends: INVALID_ARGUMENT with every field and reason.
func violationsErr(vs envelope.Violations) error {
	if len(vs) == 0 {
		return nil
	}
	var msgs []string
	detail := &apiv1.ErrorDetail{Code: "INVALID_ARGUMENT"}
	for _, v := range vs {
		msgs = append(msgs, v.Field+": "+v.Reason)
		detail.Violations = append(detail.Violations, &apiv1.FieldViolation{Field: v.Field, Reason: v.Reason})
	}
	detail.Message = "invalid " + strings.Join(msgs, "; ")
	cerr := connect.NewError(connect.CodeInvalidArgument, errors.New(detail.Message))
	if d, err := connect.NewErrorDetail(detail); err == nil {
		cerr.AddDetail(d)
	}
	return cerr
}

// readSetupPlan decodes a plan file, refusing unknown fields by name.
func readSetupPlan(path string, stdin io.Reader) (*setupPlan, string, error) {
	var (
		b    []byte
		err  error
		base = "."
	)
	if path == "-" {
		b, err = io.ReadAll(stdin)
	} else {
		b, err = os.ReadFile(path)
		base = filepath.Dir(path)
	}
	if err != nil {
		return nil, "", invalidArg("file", err.Error())
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var p setupPlan
	if err := dec.Decode(&p); err != nil {
		return nil, "", invalidArg("file", err.Error())
	}
	return &p, base, nil
}

// prompter asks one question at a time on the command's streams; an empty
// answer (or the end of input) takes the default.
type prompter struct {
	in  *bufio.Reader
	out io.Writer
}

func (p prompter) ask(question, def string) string {
	fmt.Fprintf(p.out, "%s [%s]: ", question, def)
	line, err := p.in.ReadString('\n')
	line = strings.TrimSpace(line)
	if err != nil && line == "" {
		fmt.Fprintln(p.out)
	}
	if line == "" {
		return def
	}
	return line
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" && f != "-" {
			out = append(out, f)
		}
	}
	return out
}

// askSetupPlan builds a plan from answers to the first-run questions.
func askSetupPlan(p prompter) (*setupPlan, string) {
	plan := &setupPlan{}
	plan.Tenant = p.ask("Tenant for your operators", "ops")
	plan.Projects = splitList(p.ask("Projects (comma-separated, - for none)", "default"))
	keys := splitList(p.ask("Keys to create, as ROLE or ROLE:NAME (comma-separated; roles: "+strings.Join(setupRoles, ", ")+")", "admin,operator"))
	save := strings.ToLower(p.ask("Save each key as a CLI context named TENANT-NAME? (y/n)", "y"))
	for _, k := range keys {
		role, name, _ := strings.Cut(k, ":")
		key := setupKey{Role: role, Name: name}
		if key.Name == "" {
			key.Name = role
		}
		if strings.HasPrefix(save, "y") {
			key.Context = plan.Tenant + "-" + key.Name
		}
		plan.Keys = append(plan.Keys, key)
	}
	base := "."
	if f := p.ask("A Cedar policy file to apply (- for none)", "-"); f != "-" {
		plan.Policies = append(plan.Policies, setupPolicy{ID: strings.TrimSuffix(filepath.Base(f), filepath.Ext(f)), File: f})
		if abs, err := filepath.Abs(f); err == nil {
			plan.Policies[0].File = abs
		}
	}
	return plan, base
}

// setupStep is one line of what `iam setup` did.
type setupStep struct {
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Result string `json:"result"`
	ID     string `json:"id,omitempty"`
	Secret string `json:"secret,omitempty"`
}

func (a *app) iamSetupCommand() *cobra.Command {
	var (
		file string
		yes  bool
	)
	cmd := &cobra.Command{
		Use:   "setup [--file FILE] [--yes]",
		Short: "First run: create the operators' tenant, its projects, policies and first keys (asks, or applies a file)",
		Long: `Set up the operators' tenant on a fresh deployment. Without --file it asks
for the tenant, its projects, the keys to create (by role) and a Cedar policy
file, shows the plan and applies it after you agree (--yes skips the
question). With --file it applies a plan document:

  tenant: ops
  projects: [default]
  policies:
    - id: confirm-deletes
      file: confirm-deletes.cedar   # or text: ...
  keys:
    - {role: admin, name: alice, context: ops-alice}
    - {role: operator, ttl: 720h}

Every field is checked before anything is written. It can be run again:
what exists is kept (a key of the same name is not minted twice), policies
are replaced. Each new key's secret is printed once, and saved as a CLI
context when the key names one. Needs a platform key to create the tenant;
a tenant admin may run it for its own tenant.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var (
				plan *setupPlan
				base string
				err  error
			)
			interactive := file == ""
			if interactive {
				pr := prompter{in: bufio.NewReader(cmd.InOrStdin()), out: cmd.ErrOrStderr()}
				plan, base = askSetupPlan(pr)
				if err := plan.validate(base); err != nil {
					return err
				}
				out, _ := marshalYAML(plan)
				fmt.Fprintf(cmd.ErrOrStderr(), "\nThe plan:\n%s\n", out)
				if !yes && !strings.HasPrefix(strings.ToLower(pr.ask("Apply it? (y/n)", "n")), "y") {
					return errors.New("nothing applied")
				}
			} else {
				if plan, base, err = readSetupPlan(file, cmd.InOrStdin()); err != nil {
					return err
				}
				if err := plan.validate(base); err != nil {
					return err
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			steps, err := a.applySetup(cmd.Context(), c, plan)
			// What was done is printed even when a step was refused, so the
			// operator sees where it stopped and can run it again.
			if perr := a.printSetup(cmd, steps); perr != nil && err == nil {
				err = perr
			}
			return err
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "apply this plan document (- for stdin) instead of asking")
	cmd.Flags().BoolVar(&yes, "yes", false, "apply the answers without asking to confirm")
	return cmd
}

// applySetup makes what the plan names in dependency order: the tenant,
// its projects, its policies, then the keys (last, so a key is never
// minted for a tenant whose policies failed to apply).
func (a *app) applySetup(ctx context.Context, c *client.Client, plan *setupPlan) ([]setupStep, error) {
	var steps []setupStep
	tn, err := c.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: plan.Tenant}))
	switch {
	case err == nil:
		steps = append(steps, setupStep{Kind: "tenant", Name: plan.Tenant, Result: "kept", ID: tn.Msg.GetTenant().GetId()})
	case connect.CodeOf(err) == connect.CodeNotFound:
		m := newCreate("")
		var resp *connect.Response[apiv1.CreateTenantResponse]
		if err := a.retry(ctx, func() (err error) {
			resp, err = c.Tenants.Create(ctx, request(&apiv1.CreateTenantRequest{Name: plan.Tenant, DisplayName: plan.DisplayName}, m))
			return err
		}); err != nil {
			return steps, err
		}
		steps = append(steps, setupStep{Kind: "tenant", Name: plan.Tenant, Result: "created", ID: resp.Msg.GetTenant().GetId()})
	default:
		return steps, err
	}
	for _, name := range plan.Projects {
		pr, err := c.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: plan.Tenant, Project: name}))
		if err == nil {
			steps = append(steps, setupStep{Kind: "project", Name: name, Result: "kept", ID: pr.Msg.GetProject().GetId()})
			continue
		}
		if connect.CodeOf(err) != connect.CodeNotFound {
			return steps, err
		}
		m := newCreate("")
		var resp *connect.Response[apiv1.CreateProjectResponse]
		if err := a.retry(ctx, func() (err error) {
			resp, err = c.Projects.Create(ctx, request(&apiv1.CreateProjectRequest{Tenant: plan.Tenant, Name: name}, m))
			return err
		}); err != nil {
			return steps, err
		}
		steps = append(steps, setupStep{Kind: "project", Name: name, Result: "created", ID: resp.Msg.GetProject().GetId()})
	}
	for _, pol := range plan.Policies {
		if err := a.retry(ctx, func() error {
			_, err := c.Policies.Put(ctx, connect.NewRequest(&apiv1.PutPolicyRequest{Tenant: plan.Tenant, Id: pol.ID, Text: pol.Text}))
			return err
		}); err != nil {
			return steps, err
		}
		steps = append(steps, setupStep{Kind: "policy", Name: pol.ID, Result: "applied"})
	}
	if len(plan.Keys) == 0 {
		return steps, nil
	}
	existing := map[string]string{}
	keys, err := listAll(ctx, 0, func(ctx context.Context, token string, size int32) ([]*apiv1.ApiKey, string, error) {
		resp, err := c.ApiKeys.List(ctx, connect.NewRequest(&apiv1.ListApiKeysRequest{Tenant: plan.Tenant, PageToken: token, PageSize: size}))
		if err != nil {
			return nil, "", err
		}
		return resp.Msg.GetApiKeys(), resp.Msg.GetNextPageToken(), nil
	})
	if err != nil {
		return steps, err
	}
	for _, k := range keys {
		existing[k.GetName()] = k.GetId()
	}
	var cfg *Config
	server := ""
	for _, k := range plan.Keys {
		if id, ok := existing[k.Name]; ok {
			steps = append(steps, setupStep{Kind: "api-key", Name: k.Name + " (" + k.Role + ")", Result: "kept (its secret was shown when it was made)", ID: id})
			continue
		}
		var ttl time.Duration
		if k.TTL != "" {
			ttl, _ = time.ParseDuration(k.TTL) // validated
		}
		m := newCreate("")
		var resp *connect.Response[apiv1.CreateApiKeyResponse]
		if err := a.retry(ctx, func() (err error) {
			resp, err = c.ApiKeys.Create(ctx, request(&apiv1.CreateApiKeyRequest{
				Tenant: plan.Tenant, Name: k.Name, Role: k.Role, TtlSeconds: int64(ttl / time.Second),
			}, m))
			return err
		}); err != nil {
			return steps, err
		}
		step := setupStep{Kind: "api-key", Name: k.Name + " (" + k.Role + ")", Result: "created", ID: resp.Msg.GetApiKey().GetId(), Secret: resp.Msg.GetSecret()}
		if k.Context != "" {
			if cfg == nil {
				if cfg, err = a.config(); err != nil {
					return append(steps, step), err
				}
				cur, err := a.context()
				if err != nil {
					return append(steps, step), err
				}
				server = a.setting("server", envServer, cur.Server)
			}
			cfg.Upsert(Context{Name: k.Context, Server: server, Token: step.Secret, Tenant: plan.Tenant}, false)
			if err := a.saveConfig(cfg); err != nil {
				return append(steps, step), err
			}
			step.Result = "created, saved as context " + k.Context
		}
		steps = append(steps, step)
	}
	return steps, nil
}

func (a *app) printSetup(cmd *cobra.Command, steps []setupStep) error {
	rows := make([]any, 0, len(steps))
	for _, s := range steps {
		rows = append(rows, map[string]any{"kind": s.Kind, "name": s.Name, "result": s.Result, "id": s.ID, "secret": s.Secret})
	}
	msg, err := structpb.NewStruct(map[string]any{"steps": rows})
	if err != nil {
		return err
	}
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "KIND", "NAME", "RESULT", "ID")
		for _, s := range steps {
			row(w, s.Kind, s.Name, s.Result, dash(s.ID))
		}
		for _, s := range steps {
			if s.Secret != "" {
				fmt.Fprintf(w, "\nsecret of %s: %s  (shown once; store it now)", s.Name, s.Secret)
			}
		}
		if len(steps) > 0 {
			fmt.Fprintln(w)
		}
	})
}
