package console_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"html"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/console"
)

// opsIDs are the ids the operator pages' tests open: each tenant's node
// and pool.
type opsIDs struct {
	acmeNode, rivalNode, acmePool, rivalPool string
}

func (f *fixture) opsIDs(t *testing.T) opsIDs {
	t.Helper()
	ctx := context.Background()
	var ids opsIDs
	for _, tenant := range []string{"acme", "rival"} {
		nodes, err := f.cp.Admin().Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: tenant}))
		require.NoError(t, err)
		require.Len(t, nodes.Msg.GetNodes(), 1)
		pool, err := f.cp.Admin().Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: tenant, Pool: "gpu"}))
		require.NoError(t, err)
		if tenant == "acme" {
			ids.acmeNode, ids.acmePool = nodes.Msg.GetNodes()[0].GetId(), pool.Msg.GetPool().GetId()
		} else {
			ids.rivalNode, ids.rivalPool = nodes.Msg.GetNodes()[0].GetId(), pool.Msg.GetPool().GetId()
		}
	}
	return ids
}

// platformTenantID is the id of tenant, for the platform's links.
func (f *fixture) tenantID(t *testing.T, name string) string {
	t.Helper()
	res, err := f.cp.Admin().Tenants.Get(context.Background(), connect.NewRequest(&apiv1.GetTenantRequest{Tenant: name}))
	require.NoError(t, err)
	return res.Msg.GetTenant().GetId()
}

var gpuItemRE = regexp.MustCompile(`<li class="gpu gpu-(\w+)" id="gpu-(\d+)">`)

// TestConsoleOpsNodes: the nodes list with its filters and pages, and a
// node's GPUs by NVLink island and NUMA node, each with its state and the
// reservation holding it.
func TestConsoleOpsNodes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ids := f.opsIDs(t)
	acmeID := f.tenantID(t, "acme")

	t.Run("a platform key lists every tenant's nodes, filters and pages", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.cp.AdminKey)
		res, body := b.get(console.PathNodes)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `id="node-`+ids.acmeNode+`"`)
		require.Contains(t, body, `id="node-`+ids.rivalNode+`"`)
		require.Contains(t, body, `<label for="f-liveness">Liveness</label>`)
		require.Contains(t, body, `<a href="/console/nodes" aria-current="page">Nodes</a>`)
		require.NotContains(t, body, "style=")

		res, body = b.get(console.PathNodes + "?tenant=acme&state=active")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `id="node-`+ids.acmeNode+`"`)
		require.NotContains(t, body, ids.rivalNode)
		require.Contains(t, body, `<option value="active" selected>active</option>`)

		// Liveness moves with heartbeats on a busy machine; a node is
		// never lost here (that takes minutes without one).
		res, body = b.get(console.PathNodes + "?liveness=lost")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "No node matches")
		require.NotContains(t, body, ids.acmeNode)
		require.Contains(t, body, `<option value="lost" selected>lost</option>`)

		res, body = b.get(console.PathNodes + "?liveness=asleep")
		require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
		require.Contains(t, body, "<code>INVALID_ARGUMENT</code>")
		require.Contains(t, body, "liveness")
	})

	t.Run("server pagination follows the API's page token", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.cp.AdminKey)
		res, body := b.get(console.PathNodes + "?size=1&state=active")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Equal(t, 1, strings.Count(body, `<tr id="node-`), "one node a page")
		m := regexp.MustCompile(`<a href="([^"]+)" rel="next">Next page</a>`).FindStringSubmatch(body)
		require.NotNil(t, m, "a next page link: %s", body)
		next := html.UnescapeString(m[1])
		require.Contains(t, next, "size=1")
		require.Contains(t, next, "state=active", "the filters carry over")
		first := ids.acmeNode
		if !strings.Contains(body, first) {
			first = ids.rivalNode
		}
		res, body = b.get(next)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Equal(t, 1, strings.Count(body, `<tr id="node-`))
		require.NotContains(t, body, first, "the second page has the other node")

		res, body = b.get(console.PathNodes + "?size=0")
		require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
		require.Contains(t, body, "size: must be a number from 1 to 200")
		res, body = b.get(console.PathNodes + "?page=not-a-token")
		require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
		require.Contains(t, body, "<code>INVALID_ARGUMENT</code>")
	})

	t.Run("a node's GPUs by island and NUMA node, with the reservation holding one", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.cp.AdminKey)
		res, body := b.get(console.PathNodes + "/" + ids.acmeNode + "?tenant=" + acmeID)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "GPUs by NVLink island and NUMA node")
		require.Contains(t, body, "NVLink island 0")
		require.Contains(t, body, "NUMA node 0")
		states := map[string]int{}
		for _, m := range gpuItemRE.FindAllStringSubmatch(body, -1) {
			states[m[1]]++
		}
		require.Equal(t, map[string]int{"free": 7, "booked": 1}, states, "8 GPUs, one booked")
		require.Contains(t, body, `<span class="gpu-state">booked</span>`, "the state is text, not colour only")
		require.Contains(t, body, `href="/console/reservations/`+f.acmeRsv+`?tenant=`+acmeID+`"`, "the holder is linked")
	})

	t.Run("a quarantined GPU and one marked for RMA say so", func(t *testing.T) {
		ctx := context.Background()
		inv, err := f.cp.Admin().Inventory.Get(ctx, connect.NewRequest(&apiv1.GetInventoryRequest{Tenant: "acme", Node: ids.acmeNode}))
		require.NoError(t, err)
		rsv, err := f.cp.Admin().Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: f.acmeRsv}))
		require.NoError(t, err)
		held := strings.Join(rsv.Msg.GetReservation().GetPlacement().GetAtoms(), " ")
		var free []*apiv1.Gpu
		for _, g := range inv.Msg.GetGpus() {
			if !strings.Contains(held, g.GetUuid()) {
				free = append(free, g)
			}
		}
		require.GreaterOrEqual(t, len(free), 2, "GPUs no reservation holds")
		last, rma := free[len(free)-1], free[0]
		_, err = f.cp.Admin().Health.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme",
			Gpu: last.GetUuid(), Reason: "flaky in burn-in"}))
		require.NoError(t, err)
		_, err = f.cp.Admin().Health.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme",
			Gpu: rma.GetUuid(), Reason: "row remap failed", Rma: true}))
		require.NoError(t, err)
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.member)
		res, body := b.get(console.PathNodes + "/" + ids.acmeNode)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `<li class="gpu gpu-quarantined" id="gpu-`+strconv.Itoa(int(last.GetIndex()))+`">`)
		require.Contains(t, body, "flaky in burn-in")
		require.Contains(t, body, `<li class="gpu gpu-unhealthy" id="gpu-`+strconv.Itoa(int(rma.GetIndex()))+`">`, "marked for RMA")
		require.Contains(t, body, `<span class="gpu-state">unhealthy</span>`)
		require.Contains(t, body, "row remap failed")
		require.Contains(t, body, `href="/console/reservations/`+f.acmeRsv+`"`, "a tenant's own link names no tenant")
	})

	t.Run("another tenant's node answers 404 and is never listed", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.member)
		res, body := b.get(console.PathNodes + "/" + ids.rivalNode)
		require.Equal(t, http.StatusNotFound, res.StatusCode, body)
		require.Contains(t, body, "<code>NOT_FOUND</code>")
		res, body = b.get(console.PathNodes + "/" + ids.rivalNode + "?tenant=rival")
		require.Equal(t, http.StatusNotFound, res.StatusCode, "a tenant's key cannot name another tenant: %s", body)
		res, body = b.get(console.PathNodes + "?tenant=rival")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, ids.acmeNode)
		require.NotContains(t, body, ids.rivalNode)
		require.NotContains(t, body, `id="f-tenant"`, "a tenant's viewer picks no tenant")

		r := newBrowser(t, f.cp.URL, nil)
		r.signIn(f.rivalMember)
		res, body = r.get(console.PathNodes)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.NotContains(t, body, ids.acmeNode)
		require.NotContains(t, body, f.acmeRsv)
		res, _ = r.get(console.PathNodes + "/" + ids.acmeNode)
		require.Equal(t, http.StatusNotFound, res.StatusCode)
	})
}

// TestConsoleOpsPools: pools with their selectors and offers, and a pool's
// capacity by model.
func TestConsoleOpsPools(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ids := f.opsIDs(t)
	ctx := context.Background()
	_, err := f.cp.Admin().Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "acme", Pool: "gpu", To: []string{"rival"}}))
	require.NoError(t, err)

	t.Run("list and page", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.cp.AdminKey)
		res, body := b.get(console.PathPools)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `id="pool-`+ids.acmePool+`"`)
		require.Contains(t, body, `id="pool-`+ids.rivalPool+`"`)
		require.Contains(t, body, "gpu.model In (H100)")
		require.Contains(t, body, "offered to rival")
		require.Contains(t, body, "not offered (the owner only)")

		res, body = b.get(console.PathPools + "/" + ids.acmePool + "?tenant=" + f.tenantID(t, "acme"))
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "Capacity by model, now")
		require.Regexp(t, `<th scope="row">H100 80GB</th><td>gpu</td><td class="num">8</td><td class="num">7</td><td class="num">1</td>`, body)
	})

	t.Run("another tenant's pool answers 404 and is never listed", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.member)
		res, body := b.get(console.PathPools)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, ids.acmePool)
		require.NotContains(t, body, ids.rivalPool)
		res, body = b.get(console.PathPools + "/" + ids.rivalPool)
		require.Equal(t, http.StatusNotFound, res.StatusCode, body)
		require.Contains(t, body, "<code>NOT_FOUND</code>")
	})

	t.Run("pages follow the API's token", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.cp.AdminKey)
		_, body := b.get(console.PathPools + "?size=1")
		require.Equal(t, 1, strings.Count(body, `<tr id="pool-`))
		m := regexp.MustCompile(`<a href="([^"]+)" rel="next">Next page</a>`).FindStringSubmatch(body)
		require.NotNil(t, m, body)
		first := ids.acmePool
		if !strings.Contains(body, first) {
			first = ids.rivalPool
		}
		res, body := b.get(html.UnescapeString(m[1]))
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Equal(t, 1, strings.Count(body, `<tr id="pool-`))
		require.NotContains(t, body, first)
	})

	t.Run("a consumer's reservation on the owner's node: shown to the owner, linked for the platform only", func(t *testing.T) {
		rsv, err := f.cp.Client(f.rivalMember).Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
			Tenant: "rival", Pool: ids.acmePool, Gpus: 1, DurationSeconds: 3600}))
		require.NoError(t, err)
		theirs := rsv.Msg.GetReservation().GetId()
		require.Equal(t, ids.acmeNode, rsv.Msg.GetReservation().GetPlacement().GetNodeId())

		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.member)
		res, body := b.get(console.PathNodes + "/" + ids.acmeNode)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "<span>"+theirs+"</span>", "the owner sees who holds its GPU")
		require.NotContains(t, body, "/console/reservations/"+theirs, "but cannot open another tenant's reservation")
		require.Equal(t, 2, strings.Count(body, `<li class="gpu gpu-booked"`))

		a := newBrowser(t, f.cp.URL, nil)
		a.signIn(f.cp.AdminKey)
		_, body = a.get(console.PathNodes + "/" + ids.acmeNode)
		require.Contains(t, body, `href="/console/reservations/`+theirs+`?tenant=`+f.tenantID(t, "rival")+`"`)
	})
}

var polylineRE = regexp.MustCompile(`<polyline points="([^"]+)"`)

// TestConsoleOpsChart: the fleet overview draws the last 24 hours of free
// and booked GPUs as an inline SVG with a text alternative, no script and
// no style; a tenant's chart sums only its own pools.
func TestConsoleOpsChart(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for key, total := range map[string]string{f.cp.AdminKey: "16", f.member: "8", f.rivalMember: "8"} {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(key)
		res, body := b.get(console.PathOverview)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `role="img" aria-labelledby="chart-title chart-desc"`)
		require.Contains(t, body, `<title id="chart-title">GPUs free and booked, last 24 hours</title>`)
		require.Contains(t, body, "<caption>GPUs free and booked each hour, last 24 hours</caption>")
		require.NotContains(t, body, "style=")
		require.NotContains(t, body, "<script>")
		lines := polylineRE.FindAllStringSubmatch(body, -1)
		require.Len(t, lines, 2, "free and booked")
		require.Len(t, strings.Fields(lines[0][1]), 25, "25 hourly points")
		rows := regexp.MustCompile(`<tr><th scope="row">[^<]+</th><td class="num">(\d+)</td><td class="num">(\d+)</td><td class="num">(\d+)</td></tr>`).
			FindAllStringSubmatch(body, -1)
		require.Len(t, rows, 25)
		now := rows[len(rows)-1]
		require.Equal(t, total, now[3], "the last hour's total")
		booked, _ := strconv.Atoi(now[2])
		require.Positive(t, booked, "the reservation shows as booked now: %v", now)
	}
}

// TestConsoleOpsLists: sites, images, the audit log and quotas, each as a
// platform key sees every tenant's and as a tenant sees only its own.
func TestConsoleOpsLists(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.cp.Admin()
	for i, tenant := range []string{"acme", "rival"} {
		_, err := admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: tenant, Name: tenant + "-dc",
			Networks: []string{"10.4" + strconv.Itoa(i) + ".0.0/24"}, Description: tenant + "'s hall"}))
		require.NoError(t, err)
		img := []byte(tenant + " disk image")
		sum := sha256.Sum256(img)
		_, err = admin.PushImage(ctx, &apiv1.PushImageHeader{Tenant: tenant, Name: tenant + "-ubuntu", Kind: "raw",
			Sha256: hex.EncodeToString(sum[:]), SizeBytes: int64(len(img))}, bytes.NewReader(img), "")
		require.NoError(t, err)
		_, err = admin.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: tenant, Gpus: proto.Int32(1)}))
		require.NoError(t, err)
	}

	t.Run("a platform key sees every tenant's, filters by tenant and pages", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.cp.AdminKey)
		// Sites, images and the audit log without a tenant are the
		// platform's own; quotas without one are every tenant's.
		for path, want := range map[string][]string{
			console.PathSites + "?tenant=rival":  {"rival-dc", "10.41.0.0/24"},
			console.PathImages + "?tenant=rival": {"rival-ubuntu", "unsigned"},
			console.PathQuotas:                   {"1 of 1", `<span class="quota-full">full</span>`, f.tenantID(t, "rival")},
			console.PathAudit + "?tenant=rival":  {"reservations.create", "sites.create"},
		} {
			res, body := b.get(path)
			require.Equal(t, http.StatusOK, res.StatusCode, "%s: %s", path, body)
			for _, w := range want {
				require.Contains(t, body, w, path)
			}
			require.Contains(t, body, `<label for="f-tenant">Tenant</label>`, path)
			require.NotContains(t, body, "style=", path)
			res, body = b.get(strings.TrimSuffix(path, "?tenant=rival") + "?tenant=acme")
			require.Equal(t, http.StatusOK, res.StatusCode, "%s: %s", path, body)
			require.NotContains(t, body, "rival", path)
		}
		res, body := b.get(console.PathAudit + "?tenant=acme&action=sites.create")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Equal(t, 1, strings.Count(body, `<tr id="audit-`), "one site created in acme")
		res, body = b.get(console.PathAudit + "?tenant=acme&size=1")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Equal(t, 1, strings.Count(body, `<tr id="audit-`))
		require.Contains(t, body, `rel="next">Next page</a>`)
		res, body = b.get(console.PathQuotas + "?size=x")
		require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
		require.Contains(t, body, "size: must be a number")
	})

	t.Run("a tenant sees only its own, whatever the link names", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.member)
		for _, path := range []string{console.PathSites, console.PathImages, console.PathQuotas, console.PathAudit} {
			res, body := b.get(path + "?tenant=rival")
			require.Equal(t, http.StatusOK, res.StatusCode, "%s: %s", path, body)
			require.NotContains(t, body, "rival", path)
			require.NotContains(t, body, `id="f-tenant"`, path)
		}
		r := newBrowser(t, f.cp.URL, nil)
		r.signIn(f.rivalMember)
		_, body := r.get(console.PathSites)
		require.Contains(t, body, "rival-dc")
		require.NotContains(t, body, "acme")
		_, body = r.get(console.PathAudit)
		require.Contains(t, body, "sites.create", "rival's own audit log")
		require.NotContains(t, body, f.acmeRsv)
	})
}
