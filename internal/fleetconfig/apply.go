package fleetconfig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/pool"
)

// Refusal is why apply stopped: the change it was making and the API's
// (or, for a replace, fleetconfig's own) refusal.
type Refusal struct {
	Change Change
	// Applied are the changes made before it, in order.
	Applied []Change
	Code    string
	Field   string
	Reason  string
	Err     error
}

func (r *Refusal) Error() string {
	s := fmt.Sprintf("%s %s refused: %s", r.Change.Action, r.Change.Object(), r.Code)
	if r.Field != "" {
		s += " on " + r.Field
	}
	if r.Reason != "" {
		s += ": " + r.Reason
	}
	return s
}

func (r *Refusal) Unwrap() error { return r.Err }

// Apply makes the plan's changes in its order, each one API mutation (a
// pool whose offer changes too takes a second: Offer), printing each as it
// is made. After each create or change it records the object's managed
// mark (FleetConfigService/SetMark, a mutation of its own), after each
// delete it forgets it, and last it marks the objects of p.Marks. It
// stops at the first refusal and returns it as a *Refusal; a refused mark
// names the mark, its change listed as applied.
func Apply(ctx context.Context, c *client.Client, p *Plan, out io.Writer) ([]Change, error) {
	var applied []Change
	for _, ch := range p.Changes {
		if err := applyOne(ctx, c, ch, out); err != nil {
			return applied, refusal(ch, applied, err)
		}
		applied = append(applied, ch)
		fmt.Fprintf(out, "applied: %s %s\n", ch.Action, ch.Object())
		var err error
		switch {
		case ch.Action == ActionDelete && ch.live.mark != nil:
			_, err = c.FleetConfig.DeleteMark(ctx, mutation(&apiv1.DeleteManagedMarkRequest{Tenant: ch.Tenant, Kind: ch.Kind, Name: ch.live.mark.GetName()}, false))
		case ch.Action == ActionCreate || ch.Action == ActionChange:
			err = setMark(ctx, c, ch)
		}
		if err != nil {
			m := ch
			m.Action = ActionMark
			return applied, refusal(m, applied, err)
		}
	}
	for _, ch := range p.Marks {
		if err := setMark(ctx, c, ch); err != nil {
			return applied, refusal(ch, applied, err)
		}
		fmt.Fprintf(out, "marked: %s\n", ch.Object())
	}
	return applied, nil
}

// refusal is the *Refusal for a failed call: the API's code, field and
// reason, or fleetconfig's own.
func refusal(ch Change, applied []Change, err error) *Refusal {
	r := &Refusal{Change: ch, Applied: applied, Err: err}
	var rf *Refusal
	if errors.As(err, &rf) {
		r.Code, r.Field, r.Reason = rf.Code, rf.Field, rf.Reason
		return r
	}
	r.Code = client.Code(err)
	r.Reason = err.Error()
	if d := client.Detail(err); d != nil {
		r.Reason = d.GetMessage()
		if vs := d.GetViolations(); len(vs) > 0 {
			r.Field, r.Reason = vs[0].GetField(), vs[0].GetReason()
		}
	}
	return r
}

// mutation wraps a message as a request; creates carry an idempotency key
// so a retried call does not create twice.
func mutation[T any](msg *T, create bool) *connect.Request[T] {
	r := connect.NewRequest(msg)
	if create {
		r.Header().Set(client.HeaderIdempotencyKey, client.NewIdempotencyKey())
	}
	return r
}

func applyOne(ctx context.Context, c *client.Client, ch Change, out io.Writer) error {
	switch ch.Action {
	case ActionReplace:
		return &Refusal{Code: "REPLACE_REQUIRED", Field: fieldList(ch.Fields),
			Reason: fmt.Sprintf("a %s cannot change %s in place; delete it and let apply create it, or keep the live value", ch.Kind, fieldList(ch.Fields))}
	case ActionDelete:
		return applyDelete(ctx, c, ch)
	}
	if done, err := applyMore(ctx, c, ch, func(format string, args ...any) { fmt.Fprintf(out, format, args...) }); done {
		return err
	}
	switch s := ch.doc.Spec.(type) {
	case *ProjectSpec:
		_, err := c.Projects.Create(ctx, mutation(&apiv1.CreateProjectRequest{Tenant: ch.Tenant, Name: ch.Name, DisplayName: s.DisplayName}, true))
		return err
	case *FlavorSpec:
		_, err := c.Flavors.Create(ctx, mutation(&apiv1.CreateFlavorRequest{Tenant: ch.Tenant, Name: ch.Name, Vcpus: s.VCPUs, MemoryMib: s.MemoryMiB,
			DiskGib: s.DiskGiB, Gpus: s.GPUs, GpuModel: s.GPUModel, NumaAffine: s.NUMAAffine, Pinned: s.Pinned, Hugepages: s.Hugepages,
			Description: s.Description, Balloon: s.Balloon, MinMemoryMib: s.MinMemoryMiB}, true))
		return err
	case *IPPoolSpec:
		_, err := c.IPPools.Create(ctx, mutation(&apiv1.CreateIPPoolRequest{Tenant: ch.Tenant, Name: ch.Name, Cidr: s.CIDR, Gateway: s.Gateway,
			Dns: s.DNS, RangeStart: s.RangeStart, RangeEnd: s.RangeEnd, Network: s.Network, Description: s.Description}, true))
		return err
	case *QuotaSpec:
		// Set replaces the scope's quota whole: a create and a change are
		// the same call.
		_, err := c.Quotas.Set(ctx, mutation(&apiv1.SetQuotaRequest{Tenant: ch.Tenant, Project: s.Project, Model: s.Model, Pool: s.Pool,
			Gpus: s.GPUs, GpuHours: s.GPUHours}, false))
		return err
	case *PoolSpec:
		return applyPool(ctx, c, ch, s)
	}
	return fmt.Errorf("%s: unknown kind %s", ch.Where, ch.Kind)
}

func applyPool(ctx context.Context, c *client.Client, ch Change, s *PoolSpec) error {
	sel, err := pool.ParseSelector(s.Selector)
	if err != nil {
		return &Refusal{Code: "INVALID_ARGUMENT", Field: "spec.selector", Reason: err.Error()}
	}
	want := normalize(KindPool, s).(*PoolSpec)
	offerChanged := len(want.OfferTo) > 0 || want.Policy.SingleTenant
	if ch.Action == ActionCreate {
		if _, err := c.Pools.Create(ctx, mutation(&apiv1.CreatePoolRequest{Tenant: ch.Tenant, Name: ch.Name, Selector: sel, Policy: policyProto(s.Policy)}, true)); err != nil {
			return err
		}
	} else {
		live := ch.live.spec.(*PoolSpec)
		req := &apiv1.UpdatePoolRequest{Tenant: ch.Tenant, Pool: ch.Name}
		if live.Selector != want.Selector {
			req.Selector = &apiv1.PoolSelector{Requirements: sel}
		}
		if !reflect.DeepEqual(flatten(live.Policy), flatten(want.Policy)) {
			req.Policy = policyProto(s.Policy)
		}
		if req.Selector != nil || req.Policy != nil {
			if _, err := c.Pools.Update(ctx, mutation(req, false)); err != nil {
				return err
			}
		}
		offerChanged = !slices.Equal(live.OfferTo, want.OfferTo) || live.Policy.SingleTenant != want.Policy.SingleTenant
	}
	if !offerChanged {
		return nil
	}
	_, err = c.Pools.Offer(ctx, mutation(&apiv1.OfferPoolRequest{Tenant: ch.Tenant, Pool: ch.Name, To: want.OfferTo, SingleTenant: want.Policy.SingleTenant}, false))
	return err
}

func applyDelete(ctx context.Context, c *client.Client, ch Change) error {
	if done, err := deleteMore(ctx, c, ch); done {
		return err
	}
	switch ch.Kind {
	case KindFlavor:
		_, err := c.Flavors.Delete(ctx, mutation(&apiv1.DeleteFlavorRequest{Tenant: ch.Tenant, Flavor: ch.live.id}, false))
		return err
	case KindIPPool:
		_, err := c.IPPools.Delete(ctx, mutation(&apiv1.DeleteIPPoolRequest{Tenant: ch.Tenant, IpPool: ch.live.id}, false))
		return err
	case KindPool:
		// Archiving does not end a pool's reservations: with if_idle the
		// server refuses a pool that still holds or queues some, checked in
		// the archive's own transaction.
		_, err := c.Pools.Archive(ctx, mutation(&apiv1.ArchivePoolRequest{Tenant: ch.Tenant, Pool: ch.live.id, IfIdle: true}, false))
		return err
	}
	return fmt.Errorf("%s cannot be deleted", ch.Object())
}
