package metal

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/metal/bmc"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Driver kinds as the API shows them.
const (
	DriverBuiltIn  = "builtin"
	DriverExternal = "external"
)

// SiteDrivers records the BMC drivers a site agent's Hello reported, for
// the gateway's site hooks. They replace the agent's earlier report.
func (s *SiteCommands) SiteDrivers(ctx context.Context, nodeID string, ds []SiteDriver) error {
	return s.r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		siteID, err := fleet.NodeSiteID(ctx, tx, nodeID)
		if err != nil {
			return err
		}
		if siteID == "" {
			return fmt.Errorf("node %s joined with a token bound to no site: its drivers belong to none", nodeID)
		}
		return SiteDriversReplace(ctx, tx, &SiteDriversReplaceParams{NodeID: nodeID, SiteID: siteID, Drivers: ds,
			ReportTime: s.r.clock.Now()})
	})
}

// agentDriverNames are the driver names one agent can build: what it
// reported, or the built-ins for an agent that reported none (it predates
// the report, and every site agent has them).
func agentDriverNames(ds []SiteDriver) []string {
	if len(ds) == 0 {
		return bmc.Drivers()
	}
	names := make([]string, 0, len(ds))
	for _, d := range ds {
		names = append(names, d.Name)
	}
	return names
}

// siteDriverNames are the driver names any agent of a site reported,
// built-ins first: what a machine of the site may name.
func siteDriverNames(ds []SiteDriver) []string {
	names := bmc.Drivers()
	for _, d := range ds {
		if !slices.Contains(names, d.Name) {
			names = append(names, d.Name)
		}
	}
	return names
}

// validBMCDriverName checks a machine's bmc_driver by shape: a built-in's
// name or one an external driver can be registered under. Whether the
// site has it is checked against its agents' reports (checkSiteDriver).
func validBMCDriverName(vs *envelope.Violations, field, name string) bool {
	if name == "" {
		vs.Add(field, "is required: one of %v or an external driver the site's agents report (drivers list)", bmc.Drivers())
		return false
	}
	if err := bmc.ValidDriverName(name); err != nil {
		vs.Add(field, "must be one of %v or an external driver's name: %v", bmc.Drivers(), err)
		return false
	}
	return true
}

// checkSiteDriver refuses an external driver no agent of the site
// reported: the machine could never be driven until one does. A built-in
// is always accepted, as every site agent has it.
func checkSiteDriver(ctx context.Context, q store.Querier, site Site, name string) error {
	if slices.Contains(bmc.Drivers(), name) {
		return nil
	}
	ds, err := SiteDriverList(ctx, q, site.ID)
	if err != nil {
		return err
	}
	names := siteDriverNames(ds)
	if slices.Contains(names, name) {
		return nil
	}
	return envelope.Invalid(envelope.Violation{Field: "bmc_driver", Reason: fmt.Sprintf(
		"site %s has no driver %q: its agents report %s (install the driver in a site agent's drivers directory and restart it)",
		site.Name, truncate(name), strings.Join(names, ", "))})
}

// parseBMCEndpoint checks a machine's BMC address for its driver. A
// built-in parses it its own way. An external driver's syntax is its own,
// so the control plane takes an http(s) URL or a plain host[:port] — the
// host is what it checks against the site's networks — and keeps the
// address as given (it cannot know the driver's default port).
func parseBMCEndpoint(driver, address string) (bmc.Endpoint, string, error) {
	if slices.Contains(bmc.Drivers(), driver) {
		ep, err := bmc.ParseAddress(driver, address)
		return ep, ep.String(), err
	}
	if strings.Contains(address, "://") {
		ep, err := bmc.ParseAddress("redfish", address)
		return ep, ep.String(), err
	}
	ep, err := bmc.ParseAddress("ipmi", address)
	return ep, address, err
}

// ListDrivers lists the BMC drivers a site's agents reported.
func (s *SiteService) ListDrivers(ctx context.Context, req *connect.Request[apiv1.ListSiteDriversRequest]) (*connect.Response[apiv1.ListSiteDriversResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	vs.Ref("site", msg.GetSite(), SiteIDPrefix)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		r  siteRef
		ds []SiteDriver
	)
	if err := s.env.Resolve(ctx, "site", func(ctx context.Context, q store.Querier) (err error) {
		if r, err = lookupSite(ctx, q, msg.GetTenant(), msg.GetSite()); err != nil || !r.found {
			return err
		}
		ds, err = SiteDriverList(ctx, q, r.obj.ID)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return nil, err
	}
	if err := r.notFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListSiteDriversResponse{}
	for _, d := range ds {
		out.Drivers = append(out.Drivers, SiteDriverProto(d))
	}
	return connect.NewResponse(out), nil
}

// SiteDriverProto converts a site agent's driver for the API.
func SiteDriverProto(d SiteDriver) *apiv1.SiteDriver {
	kind := DriverExternal
	if d.BuiltIn {
		kind = DriverBuiltIn
	}
	return &apiv1.SiteDriver{SiteId: d.SiteID, NodeId: d.NodeID, Name: d.Name, Reports: d.Reports, Version: d.Version, Kind: kind,
		Path: d.Path, Capabilities: d.Capabilities, ReportTime: timestamppb.New(d.ReportTime)}
}

// holderLacksDriver explains why the lease holder cannot drive m: it did
// not report m's driver. "" when it did (or reported none and m's driver
// is a built-in).
func holderLacksDriver(ctx context.Context, q store.Querier, l BootLease, m Machine) (string, error) {
	ds, err := SiteDriversOfNode(ctx, q, l.HolderNodeID)
	if err != nil {
		return "", err
	}
	names := agentDriverNames(ds)
	if slices.Contains(names, m.BMCDriver) {
		return "", nil
	}
	return fmt.Sprintf("machine %s names BMC driver %q, but site %s's agent %s reports only %s: install the driver in its drivers directory and restart it",
		m.Name, m.BMCDriver, l.SiteID, l.HolderNodeID, strings.Join(names, ", ")), nil
}
