package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/console"
)

// tenantWorkloads gives setup's fixture what instances and sandboxes need: the
// platform's flavor and IP pool, and acme's sandbox template box.
func (f *fixture) tenantWorkloads(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	admin := f.cp.Admin()
	_, err := admin.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Name: "small", Vcpus: 2, MemoryMib: 2048, DiskGib: 20}))
	require.NoError(t, err)
	_, err = admin.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: "dev", Cidr: "10.100.0.0/24"}))
	require.NoError(t, err)
	_, err = admin.SandboxTemplates.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxTemplateRequest{Tenant: "acme", Name: "box",
		Flavor: "small", Image: "debian-12", Pool: "gpu", IpPool: "dev", DefaultTtl: durationpb.New(10 * time.Minute),
		MaxTtl: durationpb.New(time.Hour)}))
	require.NoError(t, err)
}

func (f *fixture) instanceState(t *testing.T, tenant, id string) string {
	t.Helper()
	res, err := f.cp.Admin().Instances.Get(context.Background(), connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: tenant, Instance: id}))
	require.NoError(t, err)
	return res.Msg.GetInstance().GetState()
}

// TestConsoleWorkloads: a member creates an instance from the form, sees
// it run, stops and deletes it; creates a sandbox and deletes it; each
// through the API. Refusals keep the form; a viewer sees no form or button
// and the API refuses their forged posts; the rival finds none of it.
func TestConsoleWorkloads(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.tenantWorkloads(t)
	b := newBrowser(t, f.cp.URL, nil)
	token := b.signIn(f.member)
	res, body := b.get(console.PathInstances)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "No instances.")
	require.Contains(t, body, `<label for="i-flavor">Flavor</label>`)

	res, body = b.post(console.PathInstances, url.Values{"csrf": {token}, "name": {"vm1"}, "flavor": {"nope"}, "image": {"debian-12"}, "ip_pool": {"dev"}})
	require.Equal(t, http.StatusNotFound, res.StatusCode, body)
	require.Contains(t, body, "<code>NOT_FOUND</code>")
	require.Contains(t, body, `value="nope"`, "the form as typed")

	f.cp.Authz.Reset()
	res, body = b.post(console.PathInstances, url.Values{"csrf": {token}, "name": {"vm1"}, "flavor": {"small"}, "image": {"debian-12"},
		"ip_pool": {"dev"}, "pool": {"gpu"}, "network_policy": {"egress"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	require.EqualValues(t, 1, f.cp.Authz.Calls(), "one decision")
	loc := res.Header.Get("Location")
	id := strings.TrimPrefix(loc, console.PathInstances+"/")
	bctest.WaitFor(t, "the instance runs", func() bool { return f.instanceState(t, "acme", id) == "running" })
	res, body = b.get(loc)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "<dd>running</dd>")
	require.Contains(t, body, "better-compute instances ssh "+id+" -it")
	require.Contains(t, body, `aria-label="Stop vm1"`)
	_, body = b.get(console.PathInstances)
	require.Contains(t, body, `id="inst-`+id+`"`)

	// The viewer: no form, no buttons, forged posts refused by the API.
	v := newBrowser(t, f.cp.URL, nil)
	vtok := v.signIn(f.viewer)
	res, body = v.get(console.PathInstances)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "vm1")
	require.NotContains(t, body, "Create instance")
	require.NotContains(t, body, "Stop")
	for _, action := range []string{"stop", "delete"} {
		res, body = v.post(console.PathInstances+"/"+id+"/"+action, url.Values{"csrf": {vtok}})
		require.Equal(t, http.StatusForbidden, res.StatusCode, body)
		require.Contains(t, body, "<code>PERMISSION_DENIED</code>")
	}
	res, _ = v.post(console.PathInstances, url.Values{"csrf": {vtok}, "name": {"vm2"}, "flavor": {"small"}, "image": {"debian-12"}, "ip_pool": {"dev"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	res, _ = v.post(console.PathInstances+"/"+id+"/stop", url.Values{})
	require.Equal(t, http.StatusForbidden, res.StatusCode, "no CSRF token")
	require.Equal(t, "running", f.instanceState(t, "acme", id))

	// The rival: 404 for acme's instance, and an empty list.
	r := newBrowser(t, f.cp.URL, nil)
	rtok := r.signIn(f.rivalMember)
	res, body = r.get(console.PathInstances + "/" + id)
	require.Equal(t, http.StatusNotFound, res.StatusCode, body)
	res, body = r.post(console.PathInstances+"/"+id+"/delete", url.Values{"csrf": {rtok}, "tenant": {"acme"}})
	require.Equal(t, http.StatusNotFound, res.StatusCode, body)
	_, body = r.get(console.PathInstances)
	require.NotContains(t, body, id)
	require.NotContains(t, body, "vm1")

	res, body = b.post(console.PathInstances+"/"+id+"/stop", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	bctest.WaitFor(t, "the instance stops", func() bool { return f.instanceState(t, "acme", id) == "stopped" })
	_, body = b.get(loc)
	require.Contains(t, body, `aria-label="Start vm1"`)
	res, body = b.post(console.PathInstances+"/"+id+"/delete", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	bctest.WaitFor(t, "the instance goes", func() bool {
		s := f.instanceState(t, "acme", id)
		return s == "deleting" || s == "deleted"
	})

	// A sandbox.
	res, body = b.get(console.PathSandboxes)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "No sandboxes.")
	res, body = b.post(console.PathSandboxes, url.Values{"csrf": {token}, "template": {"box"}, "ttl": {"soon"}})
	require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
	require.Contains(t, body, "ttl: must be a span")
	res, body = b.post(console.PathSandboxes, url.Values{"csrf": {token}, "template": {"box"}, "ttl": {"20m"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	sloc := res.Header.Get("Location")
	sid := strings.TrimPrefix(sloc, console.PathSandboxes+"/")
	res, body = b.get(sloc)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "better-compute sandboxes exec "+sid+" -it")
	res, body = r.get(sloc)
	require.Equal(t, http.StatusNotFound, res.StatusCode, "the rival: %s", body)
	_, body = r.get(console.PathSandboxes)
	require.NotContains(t, body, sid)
	res, body = v.post(console.PathSandboxes+"/"+sid+"/delete", url.Values{"csrf": {vtok}})
	require.Equal(t, http.StatusForbidden, res.StatusCode, body)
	_, body = v.get(console.PathSandboxes)
	require.Contains(t, body, sid)
	require.NotContains(t, body, "Create sandbox")
	res, body = b.post(console.PathSandboxes+"/"+sid+"/delete", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	res, body = b.get(res.Header.Get("Location"))
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Regexp(t, `<dt>State</dt><dd>(deleting|deleted)</dd>`, body)
}
