package cli

import (
	"io"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/structpb"
)

// configCommand edits the config file's contexts. It never prints a token:
// listing shows only whether a context has one.
func (a *app) configCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Manage named contexts in the config file"}

	var tenant, project string
	var use bool
	set := &cobra.Command{
		Use:   "set-context NAME",
		Short: "Create or update a context from --server, --token (or their env vars), --tenant and --project",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			cfg, err := a.config()
			if err != nil {
				return err
			}
			c, _ := cfg.Lookup(argv[0])
			c.Name = argv[0]
			c.Server = a.setting("server", envServer, c.Server)
			c.Token = a.setting("token", envToken, c.Token)
			if cmd.Flags().Changed("tenant") {
				c.Tenant = tenant
			}
			if cmd.Flags().Changed("project") {
				c.Project = project
			}
			cfg.Upsert(c, use || cfg.CurrentContext == "")
			return a.saveConfig(cfg)
		},
	}
	set.Flags().StringVar(&tenant, "tenant", "", "default tenant for commands run in this context")
	set.Flags().StringVar(&project, "project", "", "default project for commands run in this context")
	set.Flags().BoolVar(&use, "use", false, "make it the current context")

	useCmd := &cobra.Command{
		Use:   "use-context NAME",
		Short: "Make a context current",
		Args:  positional("NAME"),
		RunE: func(_ *cobra.Command, argv []string) error {
			cfg, err := a.config()
			if err != nil {
				return err
			}
			if _, ok := cfg.Lookup(argv[0]); !ok {
				return invalidArg("context", "no context named "+argv[0])
			}
			cfg.CurrentContext = argv[0]
			return a.saveConfig(cfg)
		},
	}

	get := &cobra.Command{
		Use:   "get-contexts",
		Short: "List contexts (never their tokens)",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := a.config()
			if err != nil {
				return err
			}
			var list []any
			for _, c := range cfg.Contexts {
				list = append(list, map[string]any{
					"name": c.Name, "server": c.Server, "tenant": c.Tenant, "project": c.Project,
					"current": c.Name == cfg.CurrentContext, "hasToken": c.Token != "",
				})
			}
			msg, err := structpb.NewStruct(map[string]any{"currentContext": cfg.CurrentContext, "contexts": list})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
				row(w, "CURRENT", "NAME", "SERVER", "TENANT", "PROJECT", "TOKEN")
				for _, c := range cfg.Contexts {
					cur, tok := "", "none"
					if c.Name == cfg.CurrentContext {
						cur = "*"
					}
					if c.Token != "" {
						tok = "set"
					}
					row(w, cur, c.Name, dash(c.Server), dash(c.Tenant), dash(c.Project), tok)
				}
			})
		},
	}

	cmd.AddCommand(set, useCmd, get)
	return cmd
}

func (a *app) saveConfig(cfg *Config) error {
	if err := cfg.Save(a.configPath()); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return nil
}
