package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/internal/fleetconfig"
)

// exitPlanChanges is fleet plan's exit code when applying would change
// something (as terraform plan -detailed-exitcode).
const exitPlanChanges = 2

// fleetConfigCommand is fleet configuration as code (docs/fleet-as-code.md):
// plan, apply and export of flavors, IP pools, pools and quotas.
func (a *app) fleetConfigCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "fleet", Short: "Fleet configuration as code: plan, apply and export YAML documents (docs/fleet-as-code.md)"}
	var (
		tenant string
		from   []string
		prune  bool
	)
	load := func(cmd *cobra.Command) (*fleetconfig.Plan, error) {
		if len(from) == 0 {
			return nil, invalidArg("f", "is required: a directory or file of documents")
		}
		docs, err := fleetconfig.Load(from...)
		if err != nil {
			return nil, docErrors(cmd, err)
		}
		c, err := a.client()
		if err != nil {
			return nil, err
		}
		def, err := a.tenant(cmd.Context(), tenant, false)
		if err != nil {
			return nil, err
		}
		p, err := fleetconfig.MakePlan(cmd.Context(), c, docs, fleetconfig.Options{DefaultTenant: def, Prune: prune})
		if err != nil {
			return nil, docErrors(cmd, err)
		}
		return p, nil
	}
	addFlags := func(c *cobra.Command) {
		c.Flags().StringArrayVarP(&from, "file", "f", nil, "a directory of .yaml/.yml files, or one file (repeatable)")
		c.Flags().BoolVar(&prune, "prune", false, "also delete objects of the covered kinds that the documents leave out (in the tenants they name)")
		addTenantFlag(c, &tenant)
	}

	plan := &cobra.Command{
		Use:   "plan -f DIR [--prune]",
		Short: "Show what apply would change; exits 2 when there are changes, 0 when none, 1 on error",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := load(cmd)
			if err != nil {
				return err
			}
			p.Write(cmd.OutOrStdout())
			if p.HasChanges() {
				return &exitCodeError{code: exitPlanChanges}
			}
			return nil
		},
	}
	addFlags(plan)

	apply := &cobra.Command{
		Use:   "apply -f DIR [--prune]",
		Short: "Apply the plan, one API call per change, stopping at the first refusal",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := load(cmd)
			if err != nil {
				return err
			}
			if !p.HasChanges() && len(p.Marks) == 0 {
				p.Write(cmd.OutOrStdout())
				return nil
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			applied, err := fleetconfig.Apply(cmd.Context(), c, p, cmd.OutOrStdout())
			var r *fleetconfig.Refusal
			if errors.As(err, &r) {
				w := cmd.ErrOrStderr()
				fmt.Fprintf(w, "Error: %s\n", r.Error())
				fmt.Fprintf(w, "applied before it: %d of %d changes\n", len(applied), len(p.Changes))
				for _, ch := range applied {
					fmt.Fprintf(w, "  %s %s\n", ch.Action, ch.Object())
				}
				return &exitCodeError{code: 1}
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Applied %d changes.\n", len(applied))
			if len(p.Marks) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "Marked %d objects that already matched their documents as managed.\n", len(p.Marks))
			}
			return nil
		},
	}
	addFlags(apply)

	var (
		out      string
		platform bool
	)
	export := &cobra.Command{
		Use:   "export [--tenant T | --platform] -o DIR|-",
		Short: "Write a tenant's objects (or, with --platform, the platform's tenants, flavors, IP pools and images) as documents",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return invalidArg("output", "is required: a directory, or - for standard output")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if platform && tenant != "" {
				return invalidArg("platform", "is the platform's scope: pass --tenant or --platform, not both")
			}
			t := ""
			if !platform {
				if t, err = a.tenant(cmd.Context(), tenant, false); err != nil {
					return err
				}
			}
			files, err := fleetconfig.Export(cmd.Context(), c, t)
			if err != nil {
				return err
			}
			return fleetconfig.WriteExport(files, out, cmd.OutOrStdout())
		},
	}
	addTenantFlag(export, &tenant)
	export.Flags().BoolVar(&platform, "platform", false, "export the platform's tenants, flavors, IP pools and images (a platform key), whatever the context's tenant")
	// This -o shadows the global output format: an export is YAML files.
	export.Flags().StringVarP(&out, "output", "o", "", "the directory to write (one file per kind), or - for standard output")

	var driftPlatform bool
	drift := &cobra.Command{
		Use:   "drift [-f DIR] [--tenant T] [--platform]",
		Short: "List managed objects changed by hand since apply last applied them; exits 2 when there is drift, 0 when none, 1 on error",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			def, err := a.tenant(cmd.Context(), tenant, false)
			if err != nil {
				return err
			}
			var scopes []string
			if len(from) > 0 {
				docs, err := fleetconfig.Load(from...)
				if err != nil {
					return docErrors(cmd, err)
				}
				scopes = fleetconfig.Scopes(docs, def)
			} else {
				if def != "" {
					scopes = append(scopes, def)
				}
				if driftPlatform {
					scopes = append(scopes, "")
				}
				if len(scopes) == 0 {
					return invalidArg("tenant", "is required: pass --tenant, --platform or -f")
				}
			}
			d, err := fleetconfig.DetectDrift(cmd.Context(), c, scopes)
			if err != nil {
				return err
			}
			fleetconfig.WriteDrift(cmd.OutOrStdout(), d)
			if len(d) > 0 {
				return &exitCodeError{code: exitPlanChanges}
			}
			return nil
		},
	}
	drift.Flags().StringArrayVarP(&from, "file", "f", nil, "take the tenants (and the platform) to check from these documents (repeatable)")
	drift.Flags().BoolVar(&driftPlatform, "platform", false, "also check the platform's managed flavors and IP pools (a platform key)")
	addTenantFlag(drift, &tenant)

	cmd.AddCommand(plan, apply, export, drift)
	return cmd
}

// docErrors prints every refused document, one a line, and ends with exit
// code 1; other errors pass through.
func docErrors(cmd *cobra.Command, err error) error {
	var des fleetconfig.DocErrors
	if !errors.As(err, &des) {
		return err
	}
	for _, d := range des {
		fmt.Fprintf(cmd.ErrOrStderr(), "Error: INVALID_ARGUMENT: %s\n", d.Error())
	}
	return &exitCodeError{code: 1}
}
