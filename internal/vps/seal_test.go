package vps_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

// TestInstanceUserDataSealed: an instance's user data sits sealed in its
// row and in its instance.create command's row (no plaintext in either),
// the commands API leaves the seed out, and bcd still gets it in the
// clear over its session — also when the command is delivered by a later
// session (bcd restarted between the send and the delivery).
func TestInstanceUserDataSealed(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	const marker = "MARKER-user-data-7f3a"
	userData := "#cloud-config\nwrite_files:\n  - path: /etc/x\n    content: " + marker + "\n"
	create := func(name string) *apiv1.Instance {
		t.Helper()
		res, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: name, Flavor: "small",
			Image: "debian-12", IpPool: "dev", SshKeys: []string{testKey}, UserData: userData}))
		require.NoError(t, err)
		return res.Msg.GetInstance()
	}
	sealer, err := pki.NewSealer(h.cp.Secret)
	require.NoError(t, err)
	// rows reads an instance's sealed user data and its create's params.
	rows := func(id string) (sealed []byte, params string) {
		t.Helper()
		require.NoError(t, h.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT user_data_sealed FROM instances WHERE id = $1`, id).Scan(&sealed); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT params FROM commands WHERE kind = 'instance.create' AND params LIKE $1`,
				`%"`+vps.HostID(id)+`"%`).Scan(&params)
		}))
		return sealed, params
	}

	in := create("vm1")
	sealed, params := rows(in.GetId())
	require.NotEmpty(t, sealed)
	require.False(t, bytes.Contains(sealed, []byte(marker)), "the instance row holds no plaintext")
	require.NotContains(t, params, marker, "the command row holds no plaintext")
	require.NotContains(t, params, "user_data")
	require.Contains(t, params, `"`+vps.SealedSeedField+`"`)
	row := vps.Instance{ID: in.GetId(), UserDataSealed: sealed}
	got, err := vps.OpenUserData(sealer, &row)
	require.NoError(t, err)
	require.Equal(t, userData, got, "the row's user data opens under its instance")
	row.ID = "ins_other"
	_, err = vps.OpenUserData(sealer, &row)
	require.ErrorIs(t, err, pki.ErrSealed, "moved to another instance's row it does not open")

	in = waitState(t, h.acme, "vm1", vps.StateRunning)
	d := h.daemon(in.GetNodeId())
	p, _, ok := d.Hypervisor().Guest(vps.HostID(in.GetId()))
	require.True(t, ok)
	require.Equal(t, userData, p.Seed.UserData, "bcd gets the user data in the clear")

	// The commands API leaves the seed out, sealed or not.
	list, err := h.admin.Commands.List(ctx, connect.NewRequest(&apiv1.ListCommandsRequest{Tenant: "acme", Node: in.GetNodeId()}))
	require.NoError(t, err)
	seen := 0
	for _, c := range list.Msg.GetCommands() {
		if c.GetKind() == "instance.create" {
			seen++
			require.Nil(t, c.GetParams().GetFields()["seed"])
		}
	}
	require.Equal(t, 1, seen)

	// bcd goes away before its next create is delivered; the session of
	// the restarted bcd delivers it, opened.
	require.NoError(t, d.Stop())
	stillPlaceable(t, h, d.NodeID())
	in2 := create("vm2")
	require.Equal(t, d.NodeID(), in2.GetNodeId())
	_, params = rows(in2.GetId())
	require.NotContains(t, params, marker)
	nd, err := d.Restart()
	require.NoError(t, err)
	h.sim.Daemons[0] = nd
	waitState(t, h.acme, "vm2", vps.StateRunning)
	p, _, ok = nd.Hypervisor().Guest(vps.HostID(in2.GetId()))
	require.True(t, ok)
	require.Equal(t, userData, p.Seed.UserData)
	bctest.WaitFor(t, "both creates succeeded", func() bool {
		return h.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'instance.create' AND state = 'succeeded'`) == 2
	})
}

// TestInstanceSealedSeedThatDoesNotOpen: a command whose sealed seed no
// longer opens (tampered, or sealed under another secret) is failed by the
// gateway instead of delivered without it; the instance fails with the
// reason and no guest boots.
func TestInstanceSealedSeedThatDoesNotOpen(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	d := h.sim.Daemons[0]
	require.NoError(t, d.Stop())
	stillPlaceable(t, h, d.NodeID())
	res, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm1", Flavor: "small",
		Image: "debian-12", IpPool: "dev", UserData: "#cloud-config\n"}))
	require.NoError(t, err)
	in := res.Msg.GetInstance()
	// Another instance's sealed seed in this command: bound to the other
	// instance, it does not open here.
	sealer, err := pki.NewSealer(h.cp.Secret)
	require.NoError(t, err)
	other, err := sealer.Seal("instance-seed/"+in.GetTenantId()+"/ins-other", []byte(`{"user_data":"#!/bin/sh\n"}`))
	require.NoError(t, err)
	require.NoError(t, h.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		var id, params string
		if err := tx.QueryRow(ctx, `SELECT id, params FROM commands WHERE kind = 'instance.create'`).Scan(&id, &params); err != nil {
			return err
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(params), &m))
		m["seed"].(map[string]any)[vps.SealedSeedField] = base64.StdEncoding.EncodeToString(other)
		b, err := json.Marshal(m)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `UPDATE commands SET params = $1 WHERE id = $2`, string(b), id)
		return err
	}))
	nd, err := d.Restart()
	require.NoError(t, err)
	h.sim.Daemons[0] = nd
	failed := waitState(t, h.acme, "vm1", vps.StateFailed)
	require.Contains(t, failed.GetMessage(), "UNENCODABLE")
	require.Contains(t, failed.GetMessage(), "open the seed")
	require.Empty(t, nd.Hypervisor().Guests(), "no guest booted without its seed")
}

// stillPlaceable makes a stopped bcd's node placeable again, as a restart
// that beat the liveness sweep: once the gateway recorded the goodbye
// (asynchronously after Stop, so forcing it earlier would be undone), and
// telling capacity, whose placer may already hold the node unreachable.
func stillPlaceable(t *testing.T, h *hosts, nodeID string) {
	t.Helper()
	bctest.WaitFor(t, "the gateway recorded bcd's goodbye", func() bool {
		return h.count(t, `SELECT COUNT(*) FROM nodes WHERE id = $1 AND liveness = 'unreachable'`, nodeID) == 1
	})
	require.NoError(t, h.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE nodes SET liveness = 'ready' WHERE id = $1`, nodeID); err != nil {
			return err
		}
		// The pool's placer may have loaded the node unreachable after
		// the goodbye, and a liveness change alone does not bump the
		// pool's version: bump it, as a change of what the node offers
		// does, so the index reads the node again.
		return h.cp.App.Capacity.Hooks().NodeCapabilitiesChanged(ctx, tx, nodeID)
	}))
}
