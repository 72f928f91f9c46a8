package proxmoxemu_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/luthermonson/go-proxmox"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest/proxmoxemu"
)

func client(t *testing.T, emu *proxmoxemu.Server, secret string) (*proxmox.Client, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	// Skipping verification is what a Proxmox host's self-signed
	// certificate needs; the emulator's is as good.
	c := proxmox.NewClient(emu.URL(), proxmox.WithHTTPClient(&http.Client{}), proxmox.WithInsecureSkipVerify(),
		proxmox.WithAPIToken(emu.TokenID(), secret))
	return c, ctx
}

// go-proxmox's own typed calls work against the emulator: nodes, the
// template, a clone with an id the library asks for, config, power and
// delete, each change a task it waits for.
func TestGoProxmoxDrivesTheEmulator(t *testing.T) {
	t.Parallel()
	emu := proxmoxemu.New(t)
	c, ctx := client(t, emu, emu.Secret())

	v, err := c.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, "8.2", v.Release)
	nodes, err := c.Nodes(ctx)
	require.NoError(t, err)
	require.Len(t, nodes, 2)
	node, err := c.Node(ctx, proxmoxemu.NodeA)
	require.NoError(t, err)
	require.NotEmpty(t, node.PVEVersion)

	vms, err := node.VirtualMachines(ctx)
	require.NoError(t, err)
	require.Len(t, vms, 1)
	require.True(t, bool(vms[0].Template))
	tmpl, err := node.VirtualMachine(ctx, proxmoxemu.TemplateID)
	require.NoError(t, err)
	require.Equal(t, proxmoxemu.TemplateName, tmpl.VirtualMachineConfig.Name)

	newid, task, err := tmpl.Clone(ctx, &proxmox.VirtualMachineCloneOptions{Name: "clone-1", Full: true, Storage: proxmoxemu.DiskStorage, Target: proxmoxemu.NodeB})
	require.NoError(t, err)
	require.Equal(t, 100, newid)
	require.NoError(t, task.Wait(ctx, time.Second, 10*time.Second))

	other, err := c.Node(ctx, proxmoxemu.NodeB)
	require.NoError(t, err)
	clone, err := other.VirtualMachine(ctx, newid)
	require.NoError(t, err)
	require.True(t, clone.IsStopped())
	task, err = clone.Config(ctx,
		proxmox.VirtualMachineOption{Name: "ciuser", Value: "bc"},
		proxmox.VirtualMachineOption{Name: "sshkeys", Value: proxmox.EncodeSSHKeys("ssh-ed25519 AAAAC3Nza op@example")},
		proxmox.VirtualMachineOption{Name: "ipconfig0", Value: "ip=dhcp"},
		proxmox.VirtualMachineOption{Name: "cores", Value: 4})
	require.NoError(t, err)
	require.NoError(t, task.Wait(ctx, time.Second, 10*time.Second))
	require.NoError(t, clone.Ping(ctx))
	require.Equal(t, "bc", clone.VirtualMachineConfig.CIUser)
	require.Equal(t, 4, *clone.VirtualMachineConfig.Cores)
	require.Equal(t, "ip=dhcp", clone.VirtualMachineConfig.IPConfigs["ipconfig0"])

	task, err = clone.Start(ctx)
	require.NoError(t, err)
	require.NoError(t, task.Wait(ctx, time.Second, 10*time.Second))
	require.NoError(t, clone.Ping(ctx))
	require.True(t, clone.IsRunning())
	_, err = clone.Delete(ctx, nil)
	require.ErrorContains(t, err, "is running - destroy failed")

	task, err = clone.Stop(ctx)
	require.NoError(t, err)
	require.NoError(t, task.Wait(ctx, time.Second, 10*time.Second))
	task, err = clone.Delete(ctx, &proxmox.VirtualMachineDeleteOptions{Purge: true})
	require.NoError(t, err)
	require.NoError(t, task.Wait(ctx, time.Second, 10*time.Second))
	_, err = other.VirtualMachine(ctx, newid)
	require.True(t, proxmox.IsNotFound(err), "%v", err)
	require.Zero(t, emu.Servers())
}

// The knobs answer as the conformance suite expects, and go-proxmox reads
// the answers as it reads a real Proxmox's.
func TestKnobs(t *testing.T) {
	t.Parallel()
	emu := proxmoxemu.New(t)
	c, ctx := client(t, emu, emu.Secret())

	_, err := proxmox.NewClient(emu.URL(), proxmox.WithInsecureSkipVerify(), proxmox.WithAPIToken(emu.TokenID(), "wrong")).Nodes(ctx)
	require.True(t, proxmox.IsNotAuthorized(err), "%v", err)

	emu.RateLimitNext(1)
	_, err = c.Nodes(ctx)
	var apiErr *proxmox.APIError
	require.True(t, errors.As(err, &apiErr), "%v", err)
	require.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
	require.Equal(t, time.Second, apiErr.RetryAfter)

	emu.FailNext(http.StatusInternalServerError, "storage 'nfs' does not exist\nmore detail")
	_, err = c.Nodes(ctx)
	require.True(t, errors.As(err, &apiErr), "%v", err)
	require.Equal(t, "500 storage 'nfs' does not exist", apiErr.Status, "the message's first line is the status line")
	require.True(t, proxmox.IsNotFound(err))

	emu.LoseNextCreate()
	tmpl, err := c.NodeRef(proxmoxemu.NodeA).VirtualMachine(ctx, proxmoxemu.TemplateID)
	require.NoError(t, err)
	_, _, err = tmpl.Clone(ctx, &proxmox.VirtualMachineCloneOptions{NewID: 123, Name: "lost", Full: true})
	require.Error(t, err)
	require.False(t, errors.As(err, &apiErr), "a lost answer is no answer: %v", err)
	require.Equal(t, 1, emu.Servers(), "the lost clone took effect")
	require.Equal(t, "lost", emu.VMConfig(123)["name"])

	nodes, err := c.Nodes(ctx)
	require.NoError(t, err, "the next request is answered")
	require.Len(t, nodes, 2)
}
