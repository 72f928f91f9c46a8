package app_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// cfDelete is the agent's delete request; replays must send the same body.
func cfDelete(project string) *apiv1.DeleteProjectRequest {
	return &apiv1.DeleteProjectRequest{Tenant: "acme", Project: project}
}

// cfReplay sends a delete carrying a confirmation id.
func cfReplay(c *client.Client, project, cfmID string) error {
	_, err := c.Projects.Delete(context.Background(), sfWithHeader(cfDelete(project), client.HeaderConfirmationID, cfmID))
	return err
}

func cfList(t *testing.T, c *client.Client, state string) []*apiv1.Confirmation {
	t.Helper()
	res, err := c.Confirmations.List(context.Background(), connect.NewRequest(&apiv1.ListConfirmationsRequest{Tenant: "acme", State: state}))
	require.NoError(t, err)
	return res.Msg.GetConfirmations()
}

func cfProjectExists(t *testing.T, c *client.Client, project string) bool {
	t.Helper()
	_, err := c.Projects.Get(context.Background(), connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "acme", Project: project}))
	if err == nil {
		return true
	}
	require.Equal(t, "NOT_FOUND", client.Code(err), "error %v", err)
	return false
}

// cfRequireOneDecision runs one mutation attempt and checks the PDP was
// asked exactly want times for action.
func cfRequireDecisions(t *testing.T, cp *bctest.ControlPlane, action string, want int, attempt func() error) error {
	t.Helper()
	cp.Authz.Reset()
	err := attempt()
	require.Equal(t, want, cp.Authz.CallsFor(action), "PDP calls for %s (err %v)", action, err)
	return err
}

func TestConfirmationFlow(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin() // bootstrap key: kind user, a human
	sfTenant(t, admin, "acme")
	web := sfProject(t, admin, "acme", "web")
	sfProject(t, admin, "acme", "api")
	agentSecret, agentKey := sfKey(t, admin, "acme", "agent", 0)
	require.Equal(t, "agent", agentKey.GetKind())
	serviceSecret, serviceKey := sfKey(t, admin, "acme", "admin", 0)
	require.Equal(t, "service", serviceKey.GetKind())
	agent, service := cp.Client(agentSecret), cp.Client(serviceSecret)

	// The agent's delete needs a human: one decision, a pending confirmation,
	// the project untouched.
	before := sfCounts(t, cp)
	err := cfRequireDecisions(t, cp, "projects.delete", 1, func() error {
		_, err := agent.Projects.Delete(ctx, connect.NewRequest(cfDelete("web")))
		return err
	})
	sfRequireCode(t, err, "CONFIRMATION_REQUIRED")
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	cfmID := client.Detail(err).GetConfirmationId()
	require.True(t, envelope.IsID(cfmID, "cfm"), "confirmation id %q", cfmID)
	sfRequireDelta(t, before, sfCounts(t, cp), map[string]int{"confirmations": 1, "audit_log": 1, "events": 1})
	require.True(t, cfProjectExists(t, admin, "web"))

	pending := cfList(t, admin, envelope.ConfirmationPending)
	require.Len(t, pending, 1)
	require.Equal(t, cfmID, pending[0].GetId())
	require.Equal(t, "projects.delete", pending[0].GetAction())
	require.Equal(t, web.GetId(), pending[0].GetResourceId())
	require.Equal(t, agentKey.GetId(), pending[0].GetPrincipalId())

	// A replay before approval is refused before any decision.
	err = cfRequireDecisions(t, cp, "projects.delete", 0, func() error { return cfReplay(agent, "web", cfmID) })
	sfRequireCode(t, err, "CONFIRMATION_NOT_USABLE")

	approve := func(c *client.Client, id string) (*apiv1.Confirmation, error) {
		var out *apiv1.Confirmation
		err := cfRequireDecisions(t, cp, "confirmations.approve", 1, func() error {
			res, err := c.Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: id}))
			if err == nil {
				out = res.Msg.GetConfirmation()
			}
			return err
		})
		return out, err
	}

	// Neither the agent itself nor a non-human admin key may approve.
	for name, c := range map[string]*client.Client{"agent": agent, "service admin": service} {
		before := sfCounts(t, cp)
		_, err := approve(c, cfmID)
		sfRequireCode(t, err, "PERMISSION_DENIED", name)
		// Nothing but (at most) the refusal's audit row; see
		// TestConfirmationNonHumanApprovalIsAudited for the audit row itself.
		after := sfCounts(t, cp)
		after["audit_log"] = before["audit_log"]
		sfRequireDelta(t, before, after, nil, name)
	}
	require.Len(t, cfList(t, admin, envelope.ConfirmationPending), 1, "still pending")

	// The human approves.
	got, err := approve(admin, cfmID)
	require.NoError(t, err)
	require.Equal(t, envelope.ConfirmationApproved, got.GetState())
	require.NotEmpty(t, got.GetApprovedBy())
	_, err = approve(admin, cfmID)
	sfRequireCode(t, err, "FAILED_PRECONDITION", "approving twice")

	// The approval covers exactly the refused request: a different body, or
	// a different principal, is refused and does not spend it.
	err = cfRequireDecisions(t, cp, "projects.delete", 0, func() error { return cfReplay(agent, "api", cfmID) })
	sfRequireCode(t, err, "CONFIRMATION_NOT_USABLE")
	err = cfRequireDecisions(t, cp, "projects.delete", 0, func() error { return cfReplay(agent, web.GetId(), cfmID) })
	sfRequireCode(t, err, "CONFIRMATION_NOT_USABLE", "the same project by id is a different request body")
	err = cfRequireDecisions(t, cp, "projects.delete", 0, func() error { return cfReplay(service, "web", cfmID) })
	sfRequireCode(t, err, "CONFIRMATION_NOT_USABLE")
	require.True(t, cfProjectExists(t, admin, "web"))
	require.True(t, cfProjectExists(t, admin, "api"))

	// The agent's replay goes through: one decision, project gone.
	err = cfRequireDecisions(t, cp, "projects.delete", 1, func() error { return cfReplay(agent, "web", cfmID) })
	require.NoError(t, err)
	require.False(t, cfProjectExists(t, admin, "web"))
	used := cfList(t, admin, envelope.ConfirmationUsed)
	require.Len(t, used, 1)
	require.Equal(t, cfmID, used[0].GetId())

	// A confirmation lets exactly one replay through.
	before = sfCounts(t, cp)
	err = cfRequireDecisions(t, cp, "projects.delete", 0, func() error { return cfReplay(agent, "web", cfmID) })
	sfRequireCode(t, err, "CONFIRMATION_NOT_USABLE")
	sfRequireDelta(t, before, sfCounts(t, cp), nil)

	// Without the header the agent still needs a new confirmation.
	err = cfRequireDecisions(t, cp, "projects.delete", 1, func() error {
		_, err := agent.Projects.Delete(ctx, connect.NewRequest(cfDelete("api")))
		return err
	})
	sfRequireCode(t, err, "CONFIRMATION_REQUIRED")
	require.NotEqual(t, cfmID, client.Detail(err).GetConfirmationId())
}

func TestConfirmationExpiry(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	sfProject(t, admin, "acme", "web")
	sfProject(t, admin, "acme", "api")
	agentSecret, _ := sfKey(t, admin, "acme", "agent", 0)
	agent := cp.Client(agentSecret)

	request := func(project string) string {
		t.Helper()
		err := cfRequireDecisions(t, cp, "projects.delete", 1, func() error {
			_, err := agent.Projects.Delete(ctx, connect.NewRequest(cfDelete(project)))
			return err
		})
		sfRequireCode(t, err, "CONFIRMATION_REQUIRED")
		return client.Detail(err).GetConfirmationId()
	}

	// An approved confirmation that expires before its replay.
	approvedID := request("api")
	_, err := admin.Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: approvedID}))
	require.NoError(t, err)
	// A pending one that expires before approval.
	pendingID := request("web")

	cp.Clock.Advance(16 * time.Minute)
	// River follows the simulated clock (jobs.Config.Clock): the expiry
	// jobs are due now and write their rows (an event each) in the
	// background. Let them finish before counting, or their rows land
	// inside the refused approval's window.
	bctest.WaitFor(t, "the expiry jobs", func() bool {
		var n int
		require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM confirmations WHERE id IN ($1, $2) AND state = 'expired'`, approvedID, pendingID).Scan(&n)
		}))
		return n == 2
	})

	before := sfCounts(t, cp)
	cp.Authz.Reset()
	_, err = admin.Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: pendingID}))
	sfRequireCode(t, err, "FAILED_PRECONDITION")
	require.Equal(t, 1, cp.Authz.CallsFor("confirmations.approve"))
	sfRequireDelta(t, before, sfCounts(t, cp), nil, "a refused approval rolls back")

	for _, tc := range []struct{ project, id string }{{"api", approvedID}, {"web", pendingID}} {
		err = cfRequireDecisions(t, cp, "projects.delete", 0, func() error { return cfReplay(agent, tc.project, tc.id) })
		sfRequireCode(t, err, "CONFIRMATION_NOT_USABLE", tc.id)
		require.True(t, cfProjectExists(t, admin, tc.project))
	}

	// Each confirmation enqueued its confirmations.expire job in the
	// transaction that created it, scheduled at its expire time.
	var jobs int
	require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM river_job WHERE kind = 'confirmations.expire'`).Scan(&jobs)
	}))
	require.Equal(t, 2, jobs)

	bctest.WaitFor(t, "the expire jobs to mark both confirmations expired", func() bool {
		return len(cfList(t, admin, envelope.ConfirmationExpired)) == 2
	})
	require.Empty(t, cfList(t, admin, envelope.ConfirmationPending))
	require.Empty(t, cfList(t, admin, envelope.ConfirmationApproved))

	// Expired is final: approving or replaying still fails.
	_, err = admin.Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: pendingID}))
	sfRequireCode(t, err, "FAILED_PRECONDITION")
	sfRequireCode(t, cfReplay(agent, "api", approvedID), "CONFIRMATION_NOT_USABLE")
}

// TestConfirmationNotExpiredEarly checks a confirmation is usable until its
// deadline by the control plane's clock.
func TestConfirmationNotExpiredEarly(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	sfProject(t, admin, "acme", "web")
	agentSecret, _ := sfKey(t, admin, "acme", "agent", 0)
	agent := cp.Client(agentSecret)
	_, err := agent.Projects.Delete(ctx, connect.NewRequest(cfDelete("web")))
	sfRequireCode(t, err, "CONFIRMATION_REQUIRED")
	id := client.Detail(err).GetConfirmationId()
	cp.Clock.Advance(14 * time.Minute)
	_, err = admin.Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: id}))
	require.NoError(t, err)
	require.NoError(t, cfReplay(agent, "web", id))
	require.False(t, cfProjectExists(t, admin, "web"))
}

// TestConfirmationNonHumanApprovalIsAudited: a refused approval is an
// authorization denial and, like every denial, leaves exactly one audit row
// with decision deny and nothing else, whether the policy refused it (agent)
// or the handler did (a non-human admin key).
func TestConfirmationNonHumanApprovalIsAudited(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	sfProject(t, admin, "acme", "web")
	agentSecret, _ := sfKey(t, admin, "acme", "agent", 0)
	serviceSecret, _ := sfKey(t, admin, "acme", "admin", 0)
	_, err := cp.Client(agentSecret).Projects.Delete(ctx, connect.NewRequest(cfDelete("web")))
	sfRequireCode(t, err, "CONFIRMATION_REQUIRED")
	id := client.Detail(err).GetConfirmationId()

	for name, secret := range map[string]string{"agent": agentSecret, "service admin": serviceSecret} {
		t.Run(name, func(t *testing.T) {
			before := sfCounts(t, cp)
			_, err := cp.Client(secret).Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: id}))
			sfRequireCode(t, err, "PERMISSION_DENIED")
			sfRequireDelta(t, before, sfCounts(t, cp), map[string]int{"audit_log": 1}, "a denied approval is on record")
		})
	}
}

// TestConfirmationNotOpenedForMissingResource: an agent's delete of a
// project that does not exist once opened a confirmation (a human asked to
// approve a request that can only fail); it is NOT_FOUND first, writing
// nothing, while a stranger still learns nothing (PERMISSION_DENIED).
func TestConfirmationNotOpenedForMissingResource(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	sfTenant(t, admin, "other")
	agentSecret, _ := sfKey(t, admin, "acme", "agent", 0)
	strangerSecret, _ := sfKey(t, admin, "other", "agent", 0)
	agent, stranger := cp.Client(agentSecret), cp.Client(strangerSecret)

	before := sfCounts(t, cp)
	_, err := agent.Projects.Delete(ctx, connect.NewRequest(cfDelete("ghost")))
	sfRequireCode(t, err, "NOT_FOUND")
	require.Empty(t, client.Detail(err).GetConfirmationId())
	sfRequireDelta(t, before, sfCounts(t, cp), nil, "no confirmation, audit row or event for a missing project")
	require.Empty(t, cfList(t, admin, ""))

	_, err = stranger.Projects.Delete(ctx, connect.NewRequest(cfDelete("ghost")))
	sfRequireCode(t, err, "PERMISSION_DENIED")
}
