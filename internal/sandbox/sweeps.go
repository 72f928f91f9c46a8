package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/budget"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

// expirePerTx bounds one TTL sweep transaction.
const expirePerTx = 100

// events collects a sweep's events and writes them in its transaction.
type events struct {
	now time.Time
	evs []envelope.Event
}

func (e *events) emit(ev envelope.Event) {
	if ev.Time.IsZero() {
		ev.Time = e.now
	}
	e.evs = append(e.evs, ev)
}

func (s *Service) flush(ctx context.Context, tx store.Tx, e *events) error {
	if len(e.evs) == 0 {
		return nil
	}
	return s.rec.InsertEvents(ctx, tx, e.evs)
}

// ExpireDue deletes sandboxes past their expiry (sandbox.expired, then
// the instance's ordinary delete), a bounded batch per transaction until
// none is due. It is level-triggered: a second run, or one racing a
// user's delete, finds nothing left to do. It returns how many it
// expired.
func (s *Service) ExpireDue(ctx context.Context) (int, error) {
	total := 0
	for {
		n, full, err := s.expireBatch(ctx)
		total += n
		if err != nil || !full {
			return total, err
		}
	}
}

// expireBatch expires up to expirePerTx sandboxes in one transaction; full
// reports that it found a whole batch due (more may be).
func (s *Service) expireBatch(ctx context.Context) (int, bool, error) {
	n, full := 0, false
	err := s.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		n = 0
		due, err := SandboxesExpired(ctx, tx, expirePerTx)
		if err != nil {
			return err
		}
		full = len(due) == expirePerTx
		e := &events{now: s.env.Clock().Now()}
		for _, d := range due {
			sb, err := SandboxGet(ctx, tx, d.TenantID, d.ID, store.ForUpdate(tx))
			if err != nil {
				return err
			}
			if sb.State != SandboxActive || sb.ExpireTime.After(e.now) {
				continue // deleted or extended meanwhile
			}
			in, err := instanceOf(ctx, tx, sb)
			if err != nil {
				return err
			}
			e.emit(sandboxEvent("sandbox.expired", &sb, map[string]any{"expire_time": sb.ExpireTime}))
			if err := s.deleteIn(ctx, tx, e.emit, &sb, in, e.now); err != nil {
				return fmt.Errorf("expire sandbox %s: %w", sb.ID, err)
			}
			n++
		}
		return s.flush(ctx, tx, e)
	})
	return n, full, err
}

// ReconcileWarm keeps every active template's warm pool between warm_min
// and warm_max paused instances, and drains deleted templates' pools (then
// removes them). Level-triggered: it counts what is there each time.
func (s *Service) ReconcileWarm(ctx context.Context) error {
	var ts []Template
	if err := s.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		ts, err = TemplatesAll(ctx, tx)
		return err
	}); err != nil {
		return err
	}
	var errs []error
	for _, t := range ts {
		if err := s.reconcileTemplate(ctx, t); err != nil {
			errs = append(errs, fmt.Errorf("template %s: %w", t.ID, err))
		}
	}
	return errors.Join(errs...)
}

func (s *Service) reconcileTemplate(ctx context.Context, t Template) error {
	want := -1 // how many to boot
	err := s.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		want = -1
		ws, err := WarmOfTemplate(ctx, tx, t.ID)
		if err != nil {
			return err
		}
		e := &events{now: s.env.Clock().Now()}
		var live []vps.Instance
		for _, w := range ws {
			in, err := vps.InstanceByID(ctx, tx, w.InstanceID, store.ForUpdate(tx))
			if errors.Is(err, store.ErrNotFound) || (err == nil && (!in.Live() || in.State == vps.StateDeleting || s.inst.SSHStale(&in))) {
				// A warm guest that failed or was lost is replaced, and so
				// is one seeded before guests had their own SSH principal
				// (exec could never get into it).
				if err == nil {
					if err := s.inst.DeleteIn(ctx, tx, e.emit, &in, e.now); err != nil {
						return err
					}
				}
				if _, err := WarmRemove(ctx, tx, w.InstanceID); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return err
			}
			live = append(live, in)
		}
		keep := int(t.WarmMax)
		if t.State != TemplateActive {
			keep = 0
		}
		for len(live) > keep {
			in := live[len(live)-1]
			live = live[:len(live)-1]
			if err := s.inst.DeleteIn(ctx, tx, e.emit, &in, e.now); err != nil {
				return err
			}
			if _, err := WarmRemove(ctx, tx, in.ID); err != nil {
				return err
			}
		}
		if t.State != TemplateActive {
			if len(ws) == 0 {
				if err := TemplateDelete(ctx, tx, t.ID); err != nil {
					return err
				}
			}
		} else if len(live) < int(t.WarmMin) {
			want = int(t.WarmMin) - len(live)
		}
		return s.flush(ctx, tx, e)
	})
	if err != nil {
		return err
	}
	if want > 0 {
		// A spent hard budget stops the refill: each warm guest would
		// commit more of it, and its bookings would be refused anyway.
		var spent bool
		if err := s.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			spent, err = budget.Spent(ctx, tx, t.TenantID, s.env.Clock().Now())
			return err
		}); err != nil {
			return err
		}
		if spent {
			return nil
		}
	}
	for range max(want, 0) {
		err := s.bootWarm(ctx, t)
		var apiErr *envelope.Error
		if errors.As(err, &apiErr) && apiErr.Code == envelope.CodeSpendLimitReached {
			// The budget has room for none more: the refill waits for
			// the next period (or a larger budget), not for a retry.
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// bootWarm boots one paused instance for a template, through the pool's
// placer like any instance create.
func (s *Service) bootWarm(ctx context.Context, t Template) error {
	var boot *vps.Boot
	now := s.env.Clock().Now()
	name := hostName("warm", now)
	if err := s.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		cur, err := TemplateByID(ctx, tx, t.ID)
		if err != nil {
			return err
		}
		if cur.State != TemplateActive {
			return errTemplateGone
		}
		ud, err := s.userData(ctx, tx, cur)
		if err != nil {
			return err
		}
		boot, err = s.bootFor(ctx, tx, t.TenantID, name, cur, ud)
		return err
	}); err != nil {
		if errors.Is(err, errTemplateGone) {
			return nil
		}
		return err
	}
	if !boot.Placeable() {
		return fmt.Errorf("template %s no longer resolves its flavor, pool or IP pool", t.Name)
	}
	return s.inst.Submit(ctx, t.PoolID, t.TenantID, func(ctx context.Context, b *envelope.Batch) error {
		// Counted again in the pool's placer batch (one at a time per
		// pool): two reconciles racing never boot past warm_min.
		ws, err := WarmOfTemplate(ctx, b.Tx, t.ID)
		if err != nil || len(ws) >= int(t.WarmMin) {
			return err
		}
		e := &events{now: s.env.Clock().Now()}
		in, err := s.inst.BootIn(ctx, b.Tx, e.emit, e.now, systemActor, boot, true)
		if err != nil {
			return err
		}
		if err := WarmInsert(ctx, b.Tx, &Warm{InstanceID: in.ID, TenantID: t.TenantID, TemplateID: t.ID, Shape: t.Shape, CreateTime: e.now}); err != nil {
			return err
		}
		e.emit(envelope.Event{Type: "sandbox_template.warm_booted", TenantID: t.TenantID, ResourceType: "SandboxTemplate", ResourceID: t.ID,
			Data: map[string]any{"instance_id": in.ID, "node_id": in.NodeID}})
		return s.flush(ctx, b.Tx, e)
	})
}

var errTemplateGone = errors.New("template deleted")
