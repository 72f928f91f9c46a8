package cli

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/structpb"
)

// buildVersion is set at link time (-ldflags "-X
// github.com/better-compute/better-compute/internal/cli.buildVersion=v1.2.3")
// for Main; without it Main falls back to the module version.
var buildVersion string

func mainVersion() string {
	if buildVersion != "" {
		return buildVersion
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "dev"
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the CLI version",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := structpb.NewStruct(map[string]any{"version": a.version})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(v, func(w io.Writer) {
				fmt.Fprintln(w, a.version)
			})
		},
	}
}

func (a *app) whoamiCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show who the server thinks you are",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			me, err := a.whoami(cmd.Context())
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(me, func(w io.Writer) {
				row(w, "PRINCIPAL:", me.GetPrincipalId())
				row(w, "KIND:", dash(me.GetKind()))
				row(w, "NAME:", dash(me.GetName()))
				row(w, "ROLE:", dash(me.GetRole()))
				tenant := "- (platform)"
				if me.GetTenantId() != "" {
					tenant = cmpOr(me.GetTenantName(), "-") + " (" + me.GetTenantId() + ")"
				}
				row(w, "TENANT:", tenant)
				row(w, "AUTHENTICATED BY:", dash(me.GetAuthenticatedBy()))
			})
		},
	}
}
