package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"connectrpc.com/connect"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/mcp"
)

// mcpCommand serves MCP over stdio for a desktop agent that starts this
// binary as its tool server. It is a client of the API like every other
// verb: the context's server and token, every call through the envelope.
func (a *app) mcpCommand() *cobra.Command {
	var (
		tenant        string
		allowNonAgent bool
	)
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve MCP tools to an AI agent over stdio, as this context's key",
		Long: `mcp speaks the Model Context Protocol on stdin and stdout, for a desktop
agent that starts it as a tool server. Its tools and resources call the API
with the context's server and token (or --server/--token, or the
environment), so policy treats each call as that key's. It takes a key of
kind agent (api-keys create --role agent): policy's agent rules, such as a
human's confirmation before a delete, apply only to agents. Another key is
refused unless --allow-non-agent-key is given, and then a warning says the
agent acts with that key's full rights. See docs/mcp.md.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := a.client()
			if err != nil {
				return err
			}
			me, err := a.whoami(cmd.Context())
			if err != nil {
				return err
			}
			if err := checkAgentKey(me, allowNonAgent, cmd.ErrOrStderr()); err != nil {
				return err
			}
			// The context's tenant goes with the context's token only (as
			// in tenant()); otherwise each call asks whose key it is.
			if tenant == "" {
				c, err := a.context()
				if err != nil {
					return err
				}
				if !a.tokenOverridden(c) {
					tenant = c.Tenant
				}
			}
			c, err := a.context()
			if err != nil {
				return err
			}
			server := a.setting("server", envServer, c.Server)
			srv, err := mcp.New(mcp.Config{Version: a.version, Tenant: tenant, TLS: a.tlsConfig(),
				APIURL:  func() string { return server },
				Connect: func(context.Context, http.Header) (*client.Client, error) { return api, nil }})
			if err != nil {
				return err
			}
			t := &sdk.IOTransport{Reader: io.NopCloser(cmd.InOrStdin()), Writer: nopWriteCloser{cmd.OutOrStdout()}}
			return srv.Run(cmd.Context(), t)
		},
	}
	addTenantFlag(cmd, &tenant)
	cmd.Flags().BoolVar(&allowNonAgent, "allow-non-agent-key", false,
		"serve with a key that is not of kind agent (the agent then acts with its full rights, unconfirmed)")
	return cmd
}

// checkAgentKey refuses a key that is not an agent's, as /mcp does: policy's
// agent rules (a human confirms an agent's deletes and long extensions)
// apply to agent principals only, so an agent holding a person's or a
// service's key acts unchecked. With allow, it warns on stderr instead
// (stdout carries the protocol).
func checkAgentKey(me *apiv1.WhoAmIResponse, allow bool, stderr io.Writer) error {
	if me.GetKind() == string(iam.KindAgent) {
		return nil
	}
	who := fmt.Sprintf("%s is a %s key (role %s)", me.GetPrincipalId(), cmp.Or(me.GetKind(), "non-agent"), me.GetRole())
	if !allow {
		msg := "mcp takes an API key of kind agent; " + who + ": policy's agent rules, such as a human's confirmation " +
			"before a delete, would not apply. Create one with: better-compute api-keys create --role agent, and use it " +
			"(better-compute config set-context … --token bc_…), or pass --allow-non-agent-key to serve with this key anyway"
		cerr := connect.NewError(connect.CodePermissionDenied, errors.New(msg))
		if d, err := connect.NewErrorDetail(&apiv1.ErrorDetail{Code: "PERMISSION_DENIED", Message: msg}); err == nil {
			cerr.AddDetail(d)
		}
		return cerr
	}
	_, err := fmt.Fprintf(stderr, "WARNING: --allow-non-agent-key: %s, not an agent key. The AI agent acts with this key's "+
		"full rights and policy's agent rules do not apply: no human confirms its deletes or long extensions.\n", who)
	return err
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
