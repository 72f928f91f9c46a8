package mcp

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"net/http"

	"connectrpc.com/connect"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// Connector returns the API client one request runs with. header is the
// HTTP request's header on the streamable HTTP transport (it carries the
// agent's bearer key) and nil on stdio.
type Connector func(ctx context.Context, header http.Header) (*client.Client, error)

// Config configures a Server.
type Config struct {
	// Version is reported to clients as the server's version.
	Version string
	// Connect returns the API client of a request; required.
	Connect Connector
	// Tenant is the tenant a call without one works in (the CLI context's
	// tenant); empty asks the API whose key this is.
	Tenant string
	// APIURL is the API's address as exec_sandbox's SSH tunnel dials it,
	// and TLS its client configuration; nil: exec_sandbox is refused.
	APIURL func() string
	TLS    *tls.Config
}

// Server is the tool and resource set, bound to how it reaches the API.
type Server struct {
	cfg Config
}

// New returns the MCP server: every tool and resource template registered.
func New(cfg Config) (*sdk.Server, error) {
	if cfg.Connect == nil {
		return nil, errors.New("mcp: Config.Connect is required")
	}
	s := &Server{cfg: cfg}
	srv := sdk.NewServer(&sdk.Implementation{Name: "better-compute", Title: "Better Compute", Version: cmp.Or(cfg.Version, "dev")},
		&sdk.ServerOptions{Instructions: instructions})
	s.addTools(srv)
	s.addWorkloadTools(srv)
	s.addResources(srv)
	return srv, nil
}

const instructions = `Better Compute reserves GPUs on a fleet. Look with list_pools and
capacity_summary, ask preview_reservation why a request would or would not
fit, then reserve_gpus. Every call acts as this agent's API key, in its
tenant unless a tenant is given. A call that policy holds for a human
returns error.code CONFIRMATION_REQUIRED with a confirmation_id: ask a human
to run the approve command it names, then call the same tool again with the
same arguments and that confirmation_id.`

// call is one tool call's API client and tenant.
type call struct {
	api    *client.Client
	tenant string
}

// begin resolves the client and tenant of a request: the tenant argument,
// else the configured one, else the key's own (WhoAmI).
func (s *Server) begin(ctx context.Context, extra *sdk.RequestExtra, tenant string) (call, error) {
	var h http.Header
	if extra != nil {
		h = extra.Header
	}
	api, err := s.cfg.Connect(ctx, h)
	if err != nil {
		return call{}, err
	}
	c := call{api: api, tenant: cmp.Or(tenant, s.cfg.Tenant)}
	if c.tenant == "" {
		me, err := api.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
		if err != nil {
			return call{}, err
		}
		c.tenant = cmp.Or(me.Msg.GetTenantName(), me.Msg.GetTenantId())
		if c.tenant == "" {
			return call{}, invalid("tenant", "required: this key belongs to no tenant (a platform key); pass tenant")
		}
	}
	return c, nil
}

// addTool registers a typed tool whose handler either answers or refuses;
// a refusal becomes an isError result whose structured output carries the
// Refusal under "error" and whose text says the same for a model to read.
func addTool[In any, Out any, PO interface {
	*Out
	outcome
}](s *Server, srv *sdk.Server, t *sdk.Tool, tenantOf func(In) string, fields map[string]string,
	h func(ctx context.Context, c call, in In) (*Out, error)) {
	sdk.AddTool(srv, t, func(ctx context.Context, req *sdk.CallToolRequest, in In) (*sdk.CallToolResult, *Out, error) {
		c, err := s.begin(ctx, req.Extra, tenantOf(in))
		var out *Out
		if err == nil {
			out, err = h(ctx, c, in)
		}
		if err != nil {
			r := refusal(err, t.Name, c.tenant, fields)
			out = new(Out)
			PO(out).setError(r)
			return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: r.Error()}}}, out, nil
		}
		return nil, out, nil
	})
}
