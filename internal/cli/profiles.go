package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// Profiles are documents (docs/profiles.md): they go in from a file (or
// standard input), and the server checks them; validate is the dry run.
func (a *app) profilesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "profiles", Aliases: []string{"profile"},
		Short: "Manage deploy and hardware profiles (documents of steps a machine workflow runs)"}
	var (
		tenant, confirmationID, file, format string
		limit                                int
	)
	// read takes the document from --file (- for standard input) and its
	// format from the flag or the file's extension.
	read := func(cmd *cobra.Command) (string, string, error) {
		if file == "" {
			return "", "", invalidArg("file", "is required: -f FILE (YAML or JSON; - for standard input)")
		}
		var b []byte
		var err error
		if file == "-" {
			b, err = io.ReadAll(cmd.InOrStdin())
		} else {
			b, err = os.ReadFile(file)
		}
		if err != nil {
			return "", "", invalidArg("file", err.Error())
		}
		f := format
		if f == "" && strings.EqualFold(filepath.Ext(file), ".json") {
			f = "json"
		}
		return string(b), f, nil
	}
	fileFlags := func(c *cobra.Command) {
		c.Flags().StringVarP(&file, "file", "f", "", "the document (YAML or JSON; - for standard input)")
		c.Flags().StringVar(&format, "format", "", "yaml or json (default: by the file's extension, else yaml)")
		c.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	}

	create := &cobra.Command{
		Use:   "create -f FILE",
		Short: "Store a profile document; every bad field is named",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			doc, f, err := read(cmd)
			if err != nil {
				return err
			}
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			msg := &apiv1.CreateProfileRequest{Tenant: t, Document: doc, Format: f}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateProfileResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Profiles.Create(cmd.Context(), request(msg, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printProfiles(cmd, resp.Msg, resp.Msg.GetProfile())
		},
	}
	fileFlags(create)
	addConfirmationFlag(create, &confirmationID)

	update := &cobra.Command{
		Use:   "update PROFILE -f FILE",
		Short: "Replace a profile with a new version (started workflows keep their steps)",
		Args:  positional("PROFILE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			doc, f, err := read(cmd)
			if err != nil {
				return err
			}
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Profiles.Update(cmd.Context(), request(&apiv1.UpdateProfileRequest{Tenant: t, Profile: argv[0], Document: doc, Format: f},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printProfiles(cmd, resp.Msg, resp.Msg.GetProfile())
		},
	}
	fileFlags(update)
	addConfirmationFlag(update, &confirmationID)

	validate := &cobra.Command{
		Use:   "validate -f FILE",
		Short: "Check a document and show the steps it expands to; nothing is stored",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			doc, f, err := read(cmd)
			if err != nil {
				return err
			}
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Profiles.Validate(cmd.Context(), connect.NewRequest(&apiv1.ValidateProfileRequest{Tenant: t, Document: doc, Format: f}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { printProfileSteps(w, resp.Msg.GetProfile()) })
		},
	}
	fileFlags(validate)

	get := &cobra.Command{
		Use:   "get PROFILE",
		Short: "Show a profile (the tenant's or a built-in) and its steps",
		Args:  positional("PROFILE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Profiles.Get(cmd.Context(), connect.NewRequest(&apiv1.GetProfileRequest{Tenant: t, Profile: argv[0]}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { printProfileSteps(w, resp.Msg.GetProfile()) })
		},
	}
	get.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)

	list := &cobra.Command{
		Use:   "list",
		Short: "List the built-in profiles and the tenant's",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Profile, string, error) {
				resp, err := c.Profiles.List(ctx, connect.NewRequest(&apiv1.ListProfilesRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetProfiles(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printProfiles(cmd, &apiv1.ListProfilesResponse{Profiles: all}, all...)
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	addLimitFlag(list, &limit)

	del := &cobra.Command{
		Use:   "delete PROFILE",
		Short: "Delete a profile (refused while a machine names it)",
		Args:  positional("PROFILE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Profiles.Delete(cmd.Context(), request(&apiv1.DeleteProfileRequest{Tenant: t, Profile: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "deleted %s\n", argv[0]) })
		},
	}
	del.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	addConfirmationFlag(del, &confirmationID)

	cmd.AddCommand(create, list, get, update, del, validate)
	return cmd
}

func (a *app) printProfiles(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Profile) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "NAME", "KIND", "VERSION", "BUILTIN", "DRIVER", "STEPS", "DESCRIPTION")
		for _, p := range items {
			row(w, p.GetId(), p.GetName(), p.GetKind(), fmt.Sprint(p.GetVersion()), fmt.Sprint(p.GetBuiltin()), dash(p.GetDriver()),
				fmt.Sprint(len(p.GetSteps())), dash(p.GetDescription()))
		}
	})
}

// printProfileSteps shows a profile's expansion, a row per step.
func printProfileSteps(w io.Writer, p *apiv1.Profile) {
	fmt.Fprintf(w, "%s (%s, version %d)\n", p.GetName(), p.GetKind(), p.GetVersion())
	if p.GetDriver() != "" {
		fmt.Fprintf(w, "driver: %s\n", p.GetDriver())
	}
	row(w, "PHASE", "STEP", "KIND", "DESTRUCTIVE", "WHEN", "FALLBACK FOR", "ON FAILURE", "PARAMS")
	for _, s := range p.GetSteps() {
		row(w, "main", s.GetName(), s.GetKind(), fmt.Sprint(s.GetDestructive()), dash(s.GetWhen()), dash(s.GetFallbackFor()),
			dash(s.GetOnFailure()), dash(s.GetParamsJson()))
	}
	for _, s := range p.GetCleanup() {
		row(w, "cleanup", s.GetName(), s.GetKind(), fmt.Sprint(s.GetDestructive()), dash(s.GetWhen()), "-", dash(s.GetOnFailure()),
			dash(s.GetParamsJson()))
	}
}
