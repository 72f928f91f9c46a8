package cli

import (
	"context"
	"io"
	"net/http"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/client"
	"github.com/better-compute/better-compute/internal/mcp"
)

// mcpCommand serves MCP over stdio for a desktop agent that starts this
// binary as its tool server. It is a client of the API like every other
// verb: the context's server and token, every call through the envelope.
func (a *app) mcpCommand() *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve MCP tools to an AI agent over stdio, as this context's key",
		Long: `mcp speaks the Model Context Protocol on stdin and stdout, for a desktop
agent that starts it as a tool server. Its tools and resources call the API
with the context's server and token (or --server/--token, or the
environment), so policy treats each call as that key's: use a key of kind
agent (api-keys create --role agent). See docs/mcp.md.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := a.client()
			if err != nil {
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
			srv, err := mcp.New(mcp.Config{Version: a.version, Tenant: tenant,
				Connect: func(context.Context, http.Header) (*client.Client, error) { return api, nil }})
			if err != nil {
				return err
			}
			t := &sdk.IOTransport{Reader: io.NopCloser(cmd.InOrStdin()), Writer: nopWriteCloser{cmd.OutOrStdout()}}
			return srv.Run(cmd.Context(), t)
		},
	}
	addTenantFlag(cmd, &tenant)
	return cmd
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
