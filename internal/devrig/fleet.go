package devrig

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/tracing"
)

// Tenant is the tenant dev's simulated nodes and machines live in.
const Tenant = "sim"

// StartFleet ensures the sim tenant and project exist, then starts n
// simulated GPU hosts in <stateDir>/sim that join the control plane at api
// through gateway; nodes that joined on an earlier start reuse their
// identity and take no token. No process of a reservation and no guest's
// command reaches stateDir (the admin key, the database).
func StartFleet(ctx context.Context, api, adminKey, gateway, stateDir string, n int, profiles []string, cgroupRoot string, logger *slog.Logger, tp *tracing.Provider) (*bctest.FleetSim, error) {
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, err
	}
	root := filepath.Join(stateDir, "sim")
	// A join token a node: a large --sim-nodes outruns the admin's request
	// rate, so a refused call waits its turn instead of ending dev.
	c := client.New(api, adminKey, client.WithRateLimitRetry(10*time.Minute))
	if err := ensureSimTenant(ctx, c); err != nil {
		return nil, err
	}
	if _, err := c.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "sim", Project: "nodes"})); client.Code(err) == "NOT_FOUND" {
		if _, err := c.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "sim", Name: "nodes"})); err != nil && client.Code(err) != "ALREADY_EXISTS" {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	// The simulated fleet is the operator's: its H100 nodes form pool h100,
	// offered to every tenant, so a tenant the platform creates can reserve
	// from it within the quota it is given.
	if _, err := c.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "sim", Pool: Pool})); client.Code(err) == "NOT_FOUND" {
		_, err := c.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "sim", Name: Pool,
			Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: pool.OpIn, Values: []string{"H100"}}}}))
		if err != nil && client.Code(err) != "ALREADY_EXISTS" {
			return nil, err
		}
		if _, err := c.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "sim", Pool: Pool, To: []string{pool.OfferAll}})); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if err := EnsureInstanceCatalog(ctx, c); err != nil {
		return nil, err
	}
	return bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		// The simulated nodes trace with the control plane's provider, so
		// a dev trace runs into the agent as a real node's would.
		Template: bctest.FakeDaemonConfig{Gateway: gateway, Logger: logger.With("component", "sim"), CgroupRoot: cgroupRoot, Tracing: tp.IfEnabled(),
			Hide: []string{stateDir}},
		Root:     root,
		N:        n,
		Profiles: profiles,
		Token: func(ctx context.Context, _ int) (string, error) {
			res, err := c.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "sim", Project: "nodes", TtlSeconds: 600}))
			if err != nil {
				return "", err
			}
			return res.Msg.GetToken(), nil
		},
	})
}

// Pool is the pool of the simulated fleet's H100 nodes that dev offers
// to every tenant.
const Pool = "h100"

// The platform's flavor and IP pool dev ships, so a newcomer has a size and
// addresses for guests without setting them up first.
const (
	Flavor = "small"
	IPPool = "dev"
)

// EnsureInstanceCatalog ensures the platform's default flavor and IP pool;
// on a restart both exist and nothing is written.
func EnsureInstanceCatalog(ctx context.Context, c *client.Client) error {
	if _, err := c.Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Flavor: Flavor})); client.Code(err) == "NOT_FOUND" {
		_, err := c.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Name: Flavor, Vcpus: 2, MemoryMib: 2048, DiskGib: 10,
			Description: "dev's default: 2 vCPUs, 2 GiB, 10 GiB disk"}))
		if err != nil && client.Code(err) != "ALREADY_EXISTS" {
			return err
		}
	} else if err != nil {
		return err
	}
	if _, err := c.IPPools.Get(ctx, connect.NewRequest(&apiv1.GetIPPoolRequest{IpPool: IPPool})); client.Code(err) == "NOT_FOUND" {
		_, err := c.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: IPPool, Cidr: "10.100.0.0/24",
			Dns: []string{"10.100.0.1"}, Network: "sim", Description: "dev's default: the simulated hosts' guest network"}))
		if err != nil && client.Code(err) != "ALREADY_EXISTS" {
			return err
		}
	} else if err != nil {
		return err
	}
	return nil
}

// SandboxTemplate is the sandbox template dev ships in tenant sim.
const SandboxTemplate = "default"

// EnsureSandboxTemplate ensures tenant sim's default sandbox template
// (dev's flavor, pool and IP pool, one warm instance). A template is
// checked against its pool's hosts, so on a first start it waits for the
// simulated hosts' inventory to arrive; on a restart it exists and
// nothing is written.
func EnsureSandboxTemplate(ctx context.Context, c *client.Client) error {
	_, err := c.SandboxTemplates.Get(ctx, connect.NewRequest(&apiv1.GetSandboxTemplateRequest{Tenant: "sim", Template: SandboxTemplate}))
	if client.Code(err) != "NOT_FOUND" {
		return err
	}
	req := &apiv1.CreateSandboxTemplateRequest{Tenant: "sim", Name: SandboxTemplate, Flavor: Flavor, Pool: Pool, IpPool: IPPool,
		WarmMin: 1, WarmMax: 2}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := c.SandboxTemplates.Create(ctx, connect.NewRequest(req))
		switch code := client.Code(err); {
		case err == nil, code == "ALREADY_EXISTS":
			return nil
		case (code == "NO_CAPACITY" || code == "FAILED_PRECONDITION") && time.Now().Before(deadline):
			// The hosts' inventory is not in yet.
		default:
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
