package envelope

import (
	"context"
	"errors"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/store"
)

// Confirmation states.
const (
	ConfirmationPending  = "pending"
	ConfirmationApproved = "approved"
	ConfirmationUsed     = "used"
	ConfirmationExpired  = "expired"
)

// Confirmation is a policy's demand for a human approval of one request.
type Confirmation struct {
	ID           string
	TenantID     string
	Action       string
	ResourceType string
	ResourceID   string
	PrincipalID  string
	RequestHash  string
	State        string
	ApprovedBy   string
	CreateTime   time.Time
	ExpireTime   time.Time
}

// ExpireConfirmationArgs is the job that expires one confirmation at its
// deadline; it is enqueued in the transaction that creates the confirmation.
type ExpireConfirmationArgs struct {
	ID string `json:"id"`
}

// Kind names the job for River.
func (ExpireConfirmationArgs) Kind() string { return "confirmations.expire" }

// requireConfirmation stores a pending confirmation with the refused
// request's audit row and answers CONFIRMATION_REQUIRED with its id.
func (e *Envelope) requireConfirmation(ctx context.Context, caller Caller, audit AuditEntry, reqHash string) error {
	now := e.cfg.Clock.Now()
	c := Confirmation{
		ID:           NewID("cfm", now),
		TenantID:     audit.TenantID,
		Action:       audit.Action,
		ResourceType: audit.ResourceType,
		ResourceID:   audit.ResourceID,
		PrincipalID:  caller.Principal.ID,
		RequestHash:  reqHash,
		State:        ConfirmationPending,
		CreateTime:   now,
		ExpireTime:   now.Add(e.cfg.ConfirmationTTL),
	}
	err := e.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if err := confirmationInsert(ctx, tx, c); err != nil {
			return err
		}
		audit.ID, audit.Time = NewID("aud", now), now
		if err := e.cfg.Recorder.InsertAudits(ctx, tx, []AuditEntry{audit}); err != nil {
			return err
		}
		if err := e.cfg.Recorder.InsertEvents(ctx, tx, []Event{{
			Type: "confirmation.created", TenantID: c.TenantID, ResourceType: "Confirmation", ResourceID: c.ID, Time: now,
			Data: map[string]any{"action": c.Action, "resourceType": c.ResourceType, "resourceId": c.ResourceID, "principalId": c.PrincipalID},
		}}); err != nil {
			return err
		}
		if e.cfg.Jobs != nil {
			return e.cfg.Jobs.InsertTx(ctx, tx, ExpireConfirmationArgs{ID: c.ID}, &river.InsertOpts{ScheduledAt: c.ExpireTime})
		}
		return nil
	})
	if err != nil {
		return FromStore(err, "confirmation")
	}
	return &Error{
		Code:           CodeConfirmationRequired,
		Message:        "a human must approve this " + c.Action + ": better-compute confirmations approve " + c.ID + ", then repeat the request with " + HeaderConfirmationID,
		ConfirmationID: c.ID,
	}
}

// checkConfirmation verifies, before the decision, that a replay carries an
// approved confirmation for exactly this request by this principal.
func (e *Envelope) checkConfirmation(ctx context.Context, caller Caller, id, action, reqHash string) error {
	if !IsID(id, "cfm") {
		return Invalid(Violation{Field: HeaderConfirmationID, Reason: "is not a valid cfm id"})
	}
	var c Confirmation
	err := e.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		c, err = ConfirmationGet(ctx, tx, id)
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return NotFound("confirmation", id)
	}
	if err != nil {
		return FromStore(err, "confirmation")
	}
	switch {
	case c.PrincipalID != caller.Principal.ID || c.Action != action || c.RequestHash != reqHash:
		return Errorf(CodeConfirmationNotUsable, "confirmation %s was issued for a different request", id)
	case c.State == ConfirmationPending:
		return Errorf(CodeConfirmationNotUsable, "confirmation %s is not approved yet", id)
	case c.State != ConfirmationApproved || !c.ExpireTime.After(e.cfg.Clock.Now()):
		return Errorf(CodeConfirmationNotUsable, "confirmation %s is %s", id, expiredOr(c, e.cfg.Clock.Now()))
	}
	return nil
}

func expiredOr(c Confirmation, now time.Time) string {
	if !c.ExpireTime.After(now) {
		return ConfirmationExpired
	}
	return c.State
}

const confirmationColumns = `id, tenant_id, action, resource_type, resource_id, principal_id, request_hash, state, approved_by, create_time, expire_time`

// ConfirmationListParams filters ConfirmationList.
type ConfirmationListParams struct {
	TenantID string
	State    string
	After    string
	Limit    int
}
