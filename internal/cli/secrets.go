package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/secrets"
)

// Secrets are write-only: put reads the value from a file or standard input
// (never from the command line, where ps and shell history would keep it),
// and nothing prints it back.
func (a *app) secretsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "secrets", Aliases: []string{"secret"},
		Short: "Manage a tenant's secrets (sealed, write-only values workloads name as secret://NAME)"}
	var (
		tenant, confirmationID, fromFile, description string
		limit                                         int
		nodeReadable                                  bool
	)
	put := &cobra.Command{
		Use:   "put NAME [--from-file PATH]",
		Short: "Store a secret, or a new version of it; the value comes from --from-file or standard input",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			var (
				value []byte
				err   error
			)
			if fromFile != "" {
				value, err = os.ReadFile(fromFile)
			} else {
				value, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), secrets.MaxValueBytes+1))
			}
			if err != nil {
				return fmt.Errorf("read the secret's value: %w", err)
			}
			// A value piped with echo ends in one newline nobody meant.
			if fromFile == "" {
				value = bytes.TrimSuffix(value, []byte("\n"))
			}
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			msg := &apiv1.PutSecretRequest{Tenant: t, Name: argv[0], Value: value, Description: description}
			// Unnamed, the grant stays as it is: a new version does not
			// take the secret away from the tenant's nodes.
			if cmd.Flags().Changed("node-readable") {
				msg.NodeReadable = &nodeReadable
			}
			var resp *connect.Response[apiv1.PutSecretResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Secrets.Put(cmd.Context(), request(msg, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printSecrets(cmd, resp.Msg, resp.Msg.GetSecret())
		},
	}
	put.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	put.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file (default: standard input)")
	put.Flags().StringVar(&description, "description", "", "what the secret is for")
	put.Flags().BoolVar(&nodeReadable, "node-readable", false,
		"let the tenant's nodes fetch it (bcd secret get); --node-readable=false withdraws it; unset keeps what it was")
	addConfirmationFlag(put, &confirmationID)

	get := &cobra.Command{
		Use:   "get SECRET",
		Short: "Show a secret's metadata (its value is never shown)",
		Args:  positional("SECRET"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Secrets.Get(cmd.Context(), connect.NewRequest(&apiv1.GetSecretRequest{Tenant: t, Secret: argv[0]}))
			if err != nil {
				return err
			}
			return a.printSecrets(cmd, resp.Msg, resp.Msg.GetSecret())
		},
	}
	get.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)

	list := &cobra.Command{
		Use:   "list",
		Short: "List a tenant's secrets",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Secret, string, error) {
				resp, err := c.Secrets.List(ctx, connect.NewRequest(&apiv1.ListSecretsRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetSecrets(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printSecrets(cmd, &apiv1.ListSecretsResponse{Secrets: all}, all...)
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	addLimitFlag(list, &limit)

	del := &cobra.Command{
		Use:   "delete SECRET",
		Short: "Delete a secret (workloads already built keep what they were given)",
		Args:  positional("SECRET"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Secrets.Delete(cmd.Context(), request(&apiv1.DeleteSecretRequest{Tenant: t, Secret: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "deleted %s\n", argv[0]) })
		},
	}
	del.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	addConfirmationFlag(del, &confirmationID)

	cmd.AddCommand(put, list, get, del)
	return cmd
}

func (a *app) printSecrets(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Secret) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "NAME", "VERSION", "SIZE", "REF", "NODES", "UPDATED")
		for _, s := range items {
			nodes := "no"
			if s.GetNodeReadable() {
				nodes = "yes"
			}
			row(w, s.GetId(), s.GetName(), strconv.FormatInt(s.GetVersion(), 10), fmt.Sprintf("%d B", s.GetSizeBytes()), s.GetRef(), nodes,
				ts(s.GetUpdateTime()))
		}
	})
}
