package metal_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// TestSites: create, list, get, update and delete, with the checks that
// keep every enrolled BMC inside its site's networks.
func TestSites(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	create := func(name string, nets []string, mode string) (*apiv1.Site, error) {
		res, err := f.admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: name, Networks: nets, DhcpMode: mode}))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetSite(), nil
	}
	_, err := create("bad", []string{"10.0.0.1/24"}, "")
	refused(t, err, "INVALID_ARGUMENT", "networks[0]", "did you mean 10.0.0.0/24")
	_, err = create("bad", []string{"10.0.0.0/24", "nonsense"}, "relay")
	refused(t, err, "INVALID_ARGUMENT", "networks[1]", "must be a CIDR")
	refused(t, err, "INVALID_ARGUMENT", "dhcp_mode", `must be "full" or "proxy"`)
	_, err = create("bad", nil, "")
	refused(t, err, "INVALID_ARGUMENT", "networks", "at least one")
	_, err = create("dc1", []string{"10.1.0.0/16"}, "")
	refused(t, err, "ALREADY_EXISTS", "", `a site named "dc1" already exists`)

	s, err := create("dc2", []string{"fd00::/64", "10.2.0.0/16"}, "proxy")
	require.NoError(t, err)
	require.Equal(t, []string{"10.2.0.0/16", "fd00::/64"}, s.GetNetworks())
	require.Equal(t, "proxy", s.GetDhcpMode())
	list, err := f.admin.Sites.List(ctx, connect.NewRequest(&apiv1.ListSitesRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetSites(), 2)
	got, err := f.admin.Sites.Get(ctx, connect.NewRequest(&apiv1.GetSiteRequest{Tenant: "acme", Site: s.GetId()}))
	require.NoError(t, err)
	require.Equal(t, "dc2", got.Msg.GetSite().GetName())

	// dc1 holds an enrolled machine on loopback: its network stays.
	sm := f.sim.AddMachine(t, "m1")
	f.enroll(t, sm)
	_, err = f.admin.Sites.Update(ctx, connect.NewRequest(&apiv1.UpdateSiteRequest{Tenant: "acme", Site: "dc1", UpdateNetworks: true,
		Networks: []string{"10.0.0.0/8"}}))
	refused(t, err, "INVALID_ARGUMENT", "networks", "must keep the BMC address 127.0.0.1 of machine m1")
	desc := "row 7"
	up, err := f.admin.Sites.Update(ctx, connect.NewRequest(&apiv1.UpdateSiteRequest{Tenant: "acme", Site: "dc1", UpdateNetworks: true,
		Networks: []string{"127.0.0.0/24", "10.0.0.0/8"}, Description: &desc}))
	require.NoError(t, err)
	require.Equal(t, []string{"10.0.0.0/8", "127.0.0.0/24"}, up.Msg.GetSite().GetNetworks())
	require.Equal(t, "row 7", up.Msg.GetSite().GetDescription())

	// A site with machines is not deleted; once they are retired it is.
	_, err = f.admin.Sites.Delete(ctx, connect.NewRequest(&apiv1.DeleteSiteRequest{Tenant: "acme", Site: "dc1"}))
	refused(t, err, "FAILED_PRECONDITION", "", "still has 1 machine(s)")
	_, err = f.admin.Machines.Retire(ctx, connect.NewRequest(&apiv1.RetireMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	_, err = f.admin.Sites.Delete(ctx, connect.NewRequest(&apiv1.DeleteSiteRequest{Tenant: "acme", Site: "dc1"}))
	require.NoError(t, err)
	_, err = f.admin.Sites.Get(ctx, connect.NewRequest(&apiv1.GetSiteRequest{Tenant: "acme", Site: "dc1"}))
	refused(t, err, "NOT_FOUND", "", "site")
}
