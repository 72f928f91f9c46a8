package hcloudemu

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
	"github.com/stretchr/testify/require"
)

func setup(t *testing.T) (*Server, *hcloud.Client, context.Context) {
	t.Helper()
	emu := New(t)
	client := hcloud.NewClient(
		hcloud.WithToken(emu.Token()),
		hcloud.WithEndpoint(emu.Endpoint()),
		hcloud.WithRetryOpts(hcloud.RetryOpts{MaxRetries: 0}),
		hcloud.WithPollOpts(hcloud.PollOpts{BackoffFunc: hcloud.ConstantBackoff(time.Millisecond)}),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return emu, client, ctx
}

func create(t *testing.T, ctx context.Context, c *hcloud.Client, name string, labels map[string]string) *hcloud.Server {
	t.Helper()
	res, _, err := c.Server.Create(ctx, hcloud.ServerCreateOpts{
		Name: name, ServerType: &hcloud.ServerType{Name: "cpx11"}, Image: &hcloud.Image{Name: "debian-12"},
		Location: &hcloud.Location{Name: "ash"}, Labels: labels, UserData: "#cloud-config\n",
	})
	require.NoError(t, err)
	require.NoError(t, c.Action.WaitFor(ctx, append([]*hcloud.Action{res.Action}, res.NextActions...)...))
	return res.Server
}

func TestServerLifecycle(t *testing.T) {
	t.Parallel()
	emu, c, ctx := setup(t)
	s := create(t, ctx, c, "web-1", map[string]string{"role": "web"})
	require.Equal(t, hcloud.ServerStatusInitializing, s.Status)
	got, _, err := c.Server.GetByID(ctx, s.ID)
	require.NoError(t, err)
	require.Equal(t, hcloud.ServerStatusRunning, got.Status, "the create's actions are done")
	require.Equal(t, "debian-12", got.Image.Name)
	require.Equal(t, "x86", string(got.ServerType.Architecture))

	a, _, err := c.Server.Poweroff(ctx, got)
	require.NoError(t, err)
	require.Equal(t, hcloud.ActionStatusRunning, a.Status)
	require.NoError(t, c.Action.WaitFor(ctx, a))
	got, _, err = c.Server.GetByID(ctx, s.ID)
	require.NoError(t, err)
	require.Equal(t, hcloud.ServerStatusOff, got.Status)

	res, _, err := c.Server.DeleteWithResult(ctx, got)
	require.NoError(t, err)
	require.NoError(t, c.Action.WaitFor(ctx, res.Action))
	require.Zero(t, emu.Servers())
	gone, _, err := c.Server.GetByID(ctx, s.ID)
	require.NoError(t, err)
	require.Nil(t, gone)
}

func TestListingsPageAndFilter(t *testing.T) {
	t.Parallel()
	_, c, ctx := setup(t)
	for i := range 7 {
		role := "web"
		if i%2 == 1 {
			role = "db"
		}
		create(t, ctx, c, "srv-"+strconv.Itoa(i), map[string]string{"role": role, "bettercompute.io/instance": "ins_" + strconv.Itoa(i)})
	}
	all, err := c.Server.All(ctx)
	require.NoError(t, err)
	require.Len(t, all, 7)

	_, resp, err := c.Server.List(ctx, hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{PerPage: 50}})
	require.NoError(t, err)
	require.Equal(t, DefaultPageSize, resp.Meta.Pagination.PerPage)
	require.Equal(t, 2, resp.Meta.Pagination.NextPage)
	require.Equal(t, 2, resp.Meta.Pagination.LastPage)
	require.Equal(t, 7, resp.Meta.Pagination.TotalEntries)

	for _, c2 := range []struct {
		selector string
		want     int
	}{
		{"role=web", 4},
		{"role==db", 3},
		{"role!=web", 3},
		{"role in (web,db)", 7},
		{"role notin (web)", 3},
		{"role", 7},
		{"!role", 0},
		{"role=web,bettercompute.io/instance=ins_2", 1},
		{"bettercompute.io/instance=ins_1", 1},
	} {
		got, err := c.Server.AllWithOpts(ctx, hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{LabelSelector: c2.selector}})
		require.NoError(t, err, c2.selector)
		require.Len(t, got, c2.want, c2.selector)
	}
	byName, err := c.Server.AllWithOpts(ctx, hcloud.ServerListOpts{Name: "srv-3"})
	require.NoError(t, err)
	require.Len(t, byName, 1)

	types, err := c.ServerType.All(ctx)
	require.NoError(t, err)
	require.Len(t, types, len(catalogServerTypes))
}

func TestErrorsAndFaults(t *testing.T) {
	t.Parallel()
	emu, c, ctx := setup(t)

	emu.RateLimitNext(1)
	_, resp, err := c.Server.List(ctx, hcloud.ServerListOpts{})
	require.True(t, hcloud.IsError(err, hcloud.ErrorCodeRateLimitExceeded), "%v", err)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, 0, resp.Meta.Ratelimit.Remaining)
	require.True(t, resp.Meta.Ratelimit.Reset.After(time.Now()))

	emu.FailNext(http.StatusServiceUnavailable, "maintenance window")
	_, _, err = c.Location.List(ctx, hcloud.LocationListOpts{})
	require.True(t, hcloud.IsError(err, "unavailable"), "%v", err)
	require.Contains(t, err.Error(), "maintenance window")

	bad := hcloud.NewClient(hcloud.WithToken("wrong"), hcloud.WithEndpoint(emu.Endpoint()), hcloud.WithRetryOpts(hcloud.RetryOpts{MaxRetries: 0}))
	_, _, err = bad.Server.List(ctx, hcloud.ServerListOpts{})
	require.True(t, hcloud.IsError(err, hcloud.ErrorCodeUnauthorized), "%v", err)

	create(t, ctx, c, "dup", nil)
	_, _, err = c.Server.Create(ctx, hcloud.ServerCreateOpts{Name: "dup", ServerType: &hcloud.ServerType{Name: "cx22"}, Image: &hcloud.Image{Name: "debian-12"}})
	require.True(t, hcloud.IsError(err, hcloud.ErrorCodeUniquenessError), "%v", err)
	_, _, err = c.Server.Create(ctx, hcloud.ServerCreateOpts{Name: "far", ServerType: &hcloud.ServerType{Name: "cx22"}, Image: &hcloud.Image{Name: "debian-12"}, Location: &hcloud.Location{Name: "ash"}})
	require.True(t, hcloud.IsError(err, hcloud.ErrorCodeInvalidInput), "cx22 is not offered in ash: %v", err)
	_, _, err = c.Server.Create(ctx, hcloud.ServerCreateOpts{Name: "bad-label", ServerType: &hcloud.ServerType{Name: "cx22"}, Image: &hcloud.Image{Name: "debian-12"}, Labels: map[string]string{"a": "-x"}})
	require.True(t, hcloud.IsError(err, hcloud.ErrorCodeInvalidInput), "%v", err)

	emu.LoseNextCreate()
	_, _, err = c.Server.Create(ctx, hcloud.ServerCreateOpts{Name: "lost", ServerType: &hcloud.ServerType{Name: "cx22"}, Image: &hcloud.Image{Name: "debian-12"}})
	require.Error(t, err)
	_, ok := emu.Find("lost")
	require.True(t, ok, "the lost create took effect")
}

func TestErrorBodyShape(t *testing.T) {
	t.Parallel()
	emu, _, _ := setup(t)
	req, err := http.NewRequest(http.MethodGet, emu.Endpoint()+"/servers/12345", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+emu.Token())
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, "not_found", body.Error.Code)
	require.NotEmpty(t, body.Error.Message)
}

func TestSSHKeys(t *testing.T) {
	t.Parallel()
	_, c, ctx := setup(t)
	pub := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test"
	k, _, err := c.SSHKey.Create(ctx, hcloud.SSHKeyCreateOpts{Name: "ops", PublicKey: pub})
	require.NoError(t, err)
	require.Len(t, k.Fingerprint, 47)
	got, _, err := c.SSHKey.Get(ctx, "ops")
	require.NoError(t, err)
	require.Equal(t, k.ID, got.ID)
	_, _, err = c.SSHKey.Create(ctx, hcloud.SSHKeyCreateOpts{Name: "ops", PublicKey: pub})
	require.True(t, hcloud.IsError(err, hcloud.ErrorCodeUniquenessError), "%v", err)
}

func TestSelectorParsing(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"=v", "k in a,b", "a b"} {
		_, err := parseSelector(bad)
		require.Error(t, err, bad)
	}
}
