package usage_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client/webhook"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/usage"
	"github.com/better-compute/better-compute/internal/store"
)

// TestUsageSink: closed windows reach a webhook subscribed to usage.* as
// signed usage.window_closed events, one per window and idempotency key;
// and a period's jsonl export, summed per pool, equals what capacity
// by-consumer reports for the same period, for the owner's own use and a
// consumer tenant's use of its pool.
func TestUsageSink(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	migrate(t, cp.App.DB)
	ctx := context.Background()
	admin := cp.Admin()
	ids := map[string]string{}
	for _, name := range []string{"acme", "other"} {
		tn, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
		ids[name] = tn.Msg.GetTenant().GetId()
		pr, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: name, Name: "default"}))
		require.NoError(t, err)
		ids[name+"/default"] = pr.Msg.GetProject().GetId()
	}
	pl, err := admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "shared",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	poolID := pl.Msg.GetPool().GetId()
	key := func(tenant, role string) string {
		k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: role}))
		require.NoError(t, err)
		return k.Msg.GetSecret()
	}

	// acme's billing system: a webhook for usage.* that verifies every
	// request and keeps, per idempotency key, the highest revision.
	var (
		mu   sync.Mutex
		bad  []string
		got  = map[string]map[string]any{}
		sent int
	)
	var secret string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		mu.Lock()
		defer mu.Unlock()
		sent++
		if err := webhook.VerifyAt(secret, req.Header, body, cp.Clock.Now()); err != nil {
			bad = append(bad, err.Error())
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var ev struct {
			Type string         `json:"type"`
			Data map[string]any `json:"data"`
		}
		if err := json.Unmarshal(body, &ev); err != nil || ev.Type != usage.EventWindowClosed {
			bad = append(bad, string(body))
		}
		k := ev.Data["idempotency_key"].(string)
		if have, ok := got[k]; !ok || have["revision"].(float64) < ev.Data["revision"].(float64) {
			got[k] = ev.Data
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	wh, err := admin.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: srv.URL, Types: []string{"usage.*"}}))
	require.NoError(t, err)
	mu.Lock()
	secret = wh.Msg.GetSecret()
	mu.Unlock()

	base := cp.Clock.Now().UTC().Truncate(time.Hour).Add(time.Hour)
	h := func(n float64) time.Time { return base.Add(time.Duration(n * float64(time.Hour))) }
	db := cp.App.DB
	insertReservation(t, db, rsv{id: "rsv_acme", tenant: ids["acme"], project: ids["acme/default"], pool: poolID, gpus: 2, vcpu: 4,
		gpuModel: "H100", since: h(0.25), until: ptr(h(2.5))})
	insertReservation(t, db, rsv{id: "rsv_other", tenant: ids["other"], project: ids["other/default"], pool: poolID, gpus: 3,
		gpuModel: "H100", since: h(1.1)})
	// A window on another pool: in the export, not in the pool's row.
	insertReservation(t, db, rsv{id: "rsv_elsewhere", tenant: ids["other"], project: ids["other/default"], gpus: 1,
		gpuModel: "L40S", since: h(0)})
	cp.Clock.Set(h(4).Add(time.Minute))
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := usage.Rollup(ctx, tx, cp.Clock.Now(), cp.App.Recorder())
		return err
	}))

	// acme's windows: gpu and vcpu, hours 0, 1 and 2.
	bctest.WaitFor(t, "acme's six windows delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 6
	})
	mu.Lock()
	require.Empty(t, bad, "every request verifies")
	for k, d := range got {
		require.Equal(t, ids["acme"], d["tenant_id"], "only acme's windows reach acme's webhook")
		require.True(t, strings.HasPrefix(k, "rsv_acme/"), k)
		require.Equal(t, k, d["reservation_id"].(string)+"/"+d["metric"].(string)+"/"+d["window_start"].(string))
	}
	require.InDelta(t, 2*0.75, got["rsv_acme/gpu.H100.hours/"+h(0).Format(time.RFC3339)]["quantity"], 1e-9)
	mu.Unlock()

	// The period [h(0), h(3)): closed windows only, as by-consumer sums.
	from, to := timestamppb.New(h(0)), timestamppb.New(h(3))
	bc, err := cp.Client(key("acme", "viewer")).Capacity.ByConsumer(ctx, connect.NewRequest(&apiv1.CapacityByConsumerRequest{
		Tenant: "acme", Pool: "shared", StartTime: from, EndTime: to}))
	require.NoError(t, err)
	byTenant := map[string]float64{}
	for _, r := range bc.Msg.GetRows() {
		require.Equal(t, poolID, r.GetPoolId())
		byTenant[r.GetTenantId()] = r.GetGpuHours()
	}
	require.Len(t, byTenant, 2)
	for _, tenant := range []string{"acme", "other"} {
		// Each consumer exports its own usage with its own credentials.
		res, err := cp.Client(key(tenant, "viewer")).Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Tenant: tenant,
			StartTime: from, EndTime: to, Format: usage.FormatJSONL}))
		require.NoError(t, err)
		require.Equal(t, usage.ContentTypeJSONL, res.Msg.GetContentType())
		var onPool, all float64
		sc := bufio.NewScanner(bytes.NewReader(res.Msg.GetData()))
		for sc.Scan() {
			var d usage.CloudEventData
			require.NoError(t, json.Unmarshal(sc.Bytes(), &d))
			require.Equal(t, ids[tenant], d.TenantID)
			if strings.HasPrefix(d.Metric, "gpu.") {
				all += d.Quantity
				if d.PoolID == poolID {
					onPool += d.Quantity
				}
			}
		}
		require.InDelta(t, byTenant[ids[tenant]], onPool, 1e-9, tenant)
		// To the cent at any price per GPU-hour up to $1000.
		require.Equal(t, math.Round(byTenant[ids[tenant]]*1000*100), math.Round(onPool*1000*100), tenant)
		if tenant == "other" {
			require.InDelta(t, 3*1.9, onPool, 1e-9, "hours 1 (0.9) and 2 of three GPUs")
			require.InDelta(t, 3*1.9+3, all, 1e-9, "the L40S on another pool: hours 0, 1 and 2")
		}
	}
	// Another tenant's usage is not exported to a tenant's credentials.
	_, err = cp.Client(key("other", "admin")).Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Tenant: "acme",
		StartTime: from, EndTime: to, Format: usage.FormatJSONL}))
	require.Contains(t, []connect.Code{connect.CodePermissionDenied, connect.CodeNotFound}, connect.CodeOf(err))
}
