package bctest

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// fakeApply runs one command on the fake hypervisor as the agent hands it
// over: its result as a map, or its failure code and message.
func fakeApply(t *testing.T, h *FakeHypervisor, kind string, params any) (res map[string]any, code, msg string) {
	t.Helper()
	b, err := json.Marshal(params)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	st, err := structpb.NewStruct(m)
	require.NoError(t, err)
	out, err := h.Apply(context.Background(), &agentv1.Command{Kind: kind, Params: st})
	if err != nil {
		var coded interface{ FailureCode() string }
		require.ErrorAs(t, err, &coded)
		return nil, coded.FailureCode(), err.Error()
	}
	return out.AsMap(), "", ""
}

func fakeMust(t *testing.T, h *FakeHypervisor, kind string, params any) map[string]any {
	t.Helper()
	res, code, msg := fakeApply(t, h, kind, params)
	require.Empty(t, code, "%s: %s", kind, msg)
	return res
}

func fakeGuestParams(id string) vmcmd.CreateParams {
	// Paused: no sshd is needed to check the guest's files.
	return vmcmd.CreateParams{InstanceID: id, VCPUs: 1, MemoryMiB: 512, DiskMiB: 2048, Image: vmcmd.Image{Name: "debian-12"},
		Network: vmcmd.Network{Policy: vmcmd.PolicyEgress}, Paused: true}
}

// TestFakeHypervisorFromSnapshot: the fake speaks bcd's contract for a
// guest made from a kept snapshot: instance.delete keeps the snapshots it
// names and drops the others, a create from_snapshot gets the snapshot's
// files (refused as bcd refuses a missing snapshot, another image or a
// larger disk, with nothing made), and snapshot.delete removes one,
// converging when repeated.
func TestFakeHypervisorFromSnapshot(t *testing.T) {
	t.Parallel()
	h := NewFakeHypervisor("debian-12", "ubuntu-24")
	root := t.TempDir()
	h.SetRoot(root)
	snaps := filepath.Join(root, "snapshots")
	fakeMust(t, h, vmcmd.KindInstanceCreate, fakeGuestParams("web-a"))
	require.NoError(t, os.MkdirAll(h.GuestDir("web-a"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(h.GuestDir("web-a"), "marker"), []byte("written in a"), 0o600))
	for _, s := range []string{"keep-1", "drop-1"} {
		fakeMust(t, h, vmcmd.KindInstanceSnapshot, vmcmd.SnapshotParams{InstanceID: "web-a", SnapshotID: s})
	}
	_, code, msg := fakeApply(t, h, vmcmd.KindInstanceDelete, vmcmd.DeleteParams{InstanceID: "web-a", KeepSnapshots: []string{"Keep"}})
	require.Equal(t, vmcmd.FailInvalid, code, msg)
	require.Contains(t, msg, "keep_snapshots[0]")
	require.Equal(t, "deleted", fakeMust(t, h, vmcmd.KindInstanceDelete, vmcmd.DeleteParams{InstanceID: "web-a", KeepSnapshots: []string{"keep-1"}})["state"])
	_, _, ok := h.Guest("web-a")
	require.False(t, ok)
	require.NoDirExists(t, filepath.Join(root, "web-a"))
	require.NoDirExists(t, filepath.Join(snaps, "web-a", "drop-1"))
	require.DirExists(t, filepath.Join(snaps, "web-a", "keep-1"))

	from := &vmcmd.SnapshotParams{InstanceID: "web-a", SnapshotID: "keep-1"}
	for _, c := range []struct {
		code, contains string
		mutate         func(p *vmcmd.CreateParams)
	}{
		{vmcmd.FailNotFound, `instance.create: from_snapshot: instance "web-a" has no snapshot "drop-1" on this host`, func(p *vmcmd.CreateParams) {
			p.FromSnapshot = &vmcmd.SnapshotParams{InstanceID: "web-a", SnapshotID: "drop-1"}
		}},
		{vmcmd.FailInvalid, "from_snapshot: snapshot \"keep-1\" of \"web-a\" is of the image debian-12, not ubuntu-24", func(p *vmcmd.CreateParams) {
			p.Image.Name = "ubuntu-24"
		}},
		{vmcmd.FailInvalid, "from_snapshot: snapshot \"keep-1\" of \"web-a\" has a 2048 MiB disk, larger than disk_mib (1024)", func(p *vmcmd.CreateParams) {
			p.DiskMiB = 1024
		}},
		{vmcmd.FailInvalid, "from_snapshot.snapshot_id", func(p *vmcmd.CreateParams) {
			p.FromSnapshot = &vmcmd.SnapshotParams{InstanceID: "web-a", SnapshotID: "Keep"}
		}},
	} {
		p := fakeGuestParams("web-b")
		p.FromSnapshot = from
		p.Volumes = []vmcmd.VolumeRef{{VolumeID: "data-b", Format: "raw", SizeMiB: 8}}
		c.mutate(&p)
		_, code, msg := fakeApply(t, h, vmcmd.KindInstanceCreate, p)
		require.Equal(t, c.code, code, msg)
		require.Contains(t, msg, c.contains)
		_, _, ok := h.Guest("web-b")
		require.False(t, ok, c.contains)
		require.Empty(t, h.Volumes(), c.contains)
		require.NoDirExists(t, filepath.Join(root, "web-b"), c.contains)
	}

	p := fakeGuestParams("web-b")
	p.DiskMiB = 4096
	p.FromSnapshot = from
	st := fakeMust(t, h, vmcmd.KindInstanceCreate, p)
	require.Equal(t, "paused", st["state"])
	b, err := os.ReadFile(filepath.Join(h.GuestDir("web-b"), "marker"))
	require.NoError(t, err)
	require.Equal(t, "written in a", string(b))
	// Redelivered after the snapshot went: the same guest.
	for range 2 {
		require.Equal(t, map[string]any{"instance_id": "web-a", "snapshot_id": "keep-1"},
			fakeMust(t, h, vmcmd.KindSnapshotDelete, from))
	}
	require.NoDirExists(t, filepath.Join(snaps, "web-a"), "the emptied directory goes too")
	require.Equal(t, st, fakeMust(t, h, vmcmd.KindInstanceCreate, p))
	fakeMust(t, h, vmcmd.KindSnapshotDelete, vmcmd.SnapshotParams{InstanceID: "never-was", SnapshotID: "s1"})
	_, code, msg = fakeApply(t, h, vmcmd.KindSnapshotDelete, vmcmd.SnapshotParams{InstanceID: "web-a", SnapshotID: "S"})
	require.Equal(t, vmcmd.FailInvalid, code, msg)

	// A delete without keep_snapshots takes them all.
	fakeMust(t, h, vmcmd.KindInstanceSnapshot, vmcmd.SnapshotParams{InstanceID: "web-b", SnapshotID: "s1"})
	fakeMust(t, h, vmcmd.KindInstanceDelete, vmcmd.InstanceRef{InstanceID: "web-b"})
	require.NoDirExists(t, filepath.Join(snaps, "web-b"))
	require.NoDirExists(t, filepath.Join(root, "web-b"))
}
