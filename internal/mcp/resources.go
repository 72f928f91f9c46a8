package mcp

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// Resource URIs: scheme://tenants/{tenant}/pools, .../reservations and
// .../reservations/{id}.
const (
	scheme               = "bettercompute"
	poolsTemplate        = scheme + "://tenants/{tenant}/pools"
	reservationsTemplate = scheme + "://tenants/{tenant}/reservations"
	reservationTemplate  = scheme + "://tenants/{tenant}/reservations/{id}"
	// resourceListMax bounds a list resource; the tools page further.
	resourceListMax = 500
)

func (s *Server) addResources(srv *sdk.Server) {
	srv.AddResourceTemplate(&sdk.ResourceTemplate{URITemplate: poolsTemplate, Name: "pools", MIMEType: "application/json",
		Description: "The pools a tenant may reserve from (its own and those offered to it), as list_pools answers them."}, s.readResource)
	srv.AddResourceTemplate(&sdk.ResourceTemplate{URITemplate: reservationsTemplate, Name: "reservations", MIMEType: "application/json",
		Description: "A tenant's reservations, newest first (up to 500; list_reservations pages further)."}, s.readResource)
	srv.AddResourceTemplate(&sdk.ResourceTemplate{URITemplate: reservationTemplate, Name: "reservation", MIMEType: "application/json",
		Description: "One reservation: its state, window, placement and, while pending, why."}, s.readResource)
}

// readResource reads every template: the URI names what to ask the API.
func (s *Server) readResource(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
	uri := req.Params.URI
	tenant, rest, ok := parseResourceURI(uri)
	if !ok {
		return nil, sdk.ResourceNotFoundError(uri)
	}
	c, err := s.begin(ctx, req.Extra, tenant)
	if err != nil {
		return nil, resourceError(err, uri)
	}
	var v any
	switch {
	case rest == "pools":
		res, err := c.api.Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: c.tenant, PageSize: resourceListMax}))
		if err != nil {
			return nil, resourceError(err, uri)
		}
		v = map[string]any{"pools": mapAll(res.Msg.GetPools(), poolOf)}
	case rest == "reservations":
		res, err := c.api.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: c.tenant, PageSize: resourceListMax}))
		if err != nil {
			return nil, resourceError(err, uri)
		}
		v = map[string]any{"reservations": mapAll(res.Msg.GetReservations(), reservationValue)}
	case strings.HasPrefix(rest, "reservations/") && !strings.Contains(rest[len("reservations/"):], "/"):
		id := rest[len("reservations/"):]
		res, err := c.api.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: c.tenant, Reservation: id}))
		if err != nil {
			return nil, resourceError(err, uri)
		}
		v = reservationOf(res.Msg.GetReservation())
	default:
		return nil, sdk.ResourceNotFoundError(uri)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(b)}}}, nil
}

// parseResourceURI splits bettercompute://tenants/{tenant}/{rest}.
func parseResourceURI(uri string) (tenant, rest string, ok bool) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != scheme || u.Host != "tenants" || u.RawQuery != "" || u.Fragment != "" {
		return "", "", false
	}
	tenant, rest, ok = strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	return tenant, rest, ok && tenant != "" && rest != ""
}

// resourceError answers a refused read: NOT_FOUND as the protocol's
// resource-not-found, anything else as an error carrying the API's code.
func resourceError(err error, uri string) error {
	if client.Code(err) == "NOT_FOUND" {
		return sdk.ResourceNotFoundError(uri)
	}
	r := refusal(err, "", "", nil)
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: r.Code + ": " + r.Message}
}
