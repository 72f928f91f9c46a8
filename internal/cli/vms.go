package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// Instances and volumes are a tenant's: the context's tenant, or --tenant.

const instanceWaitHelp = "wait up to this long for the instance to get there (create: running and, when the guest reports an SSH address, answering on it)"

func (a *app) instancesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "instances", Aliases: []string{"instance", "vms"}, Short: "Run virtual machines (placed through capacity, addressed from an IP pool)"}
	var (
		tenant, confirmationID                          string
		flavor, image, ipPool, capPool, policy, project string
		onHostLost                                      string
		sshKeys, sshKeyFiles, volumes                   []string
		userDataFile                                    string
		wait                                            time.Duration
		limit                                           int
	)
	create := &cobra.Command{
		Use:   "create NAME --flavor F [--image I] [--ip-pool P] [--pool P] [--ssh-key KEY] [--volume NAME:GIB[:qcow2|raw]] [--on-host-lost keep|recreate] [--wait D]",
		Short: "Create an instance: placed on a host of a pool, leased an address, booted by bcd",
		Long: `Create an instance. It is placed at once on a host of the capacity pool
(--pool, default the only pool the tenant sees) or refused; its address
comes from the IP pool (--ip-pool, default the tenant's only pool, else the
platform's only one); --image defaults to the only guest image the control
plane knows. --volume creates a host volume with it and attaches it (repeat
for more). --on-host-lost recreate places the instance again on another
host, booted from its image with the same id, name, address and SSH keys,
when its host is declared lost (its volumes stay behind, marked failed);
the default, keep, leaves it lost. With --wait D the command waits until
the guest runs and, when its host reports an SSH address, until that
address answers on TCP.`,
		Args: positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if wait < 0 {
				return invalidArg("wait", "must not be negative")
			}
			req := &apiv1.CreateInstanceRequest{Name: argv[0], Flavor: flavor, Image: image, IpPool: ipPool, Pool: capPool,
				NetworkPolicy: policy, SshKeys: sshKeys, Project: project, OnHostLost: onHostLost}
			for _, f := range sshKeyFiles {
				b, err := os.ReadFile(f)
				if err != nil {
					return invalidArg("ssh-key-file", err.Error())
				}
				for _, l := range strings.Split(string(b), "\n") {
					if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
						req.SshKeys = append(req.SshKeys, l)
					}
				}
			}
			if userDataFile != "" {
				b, err := os.ReadFile(userDataFile)
				if err != nil {
					return invalidArg("user-data-file", err.Error())
				}
				req.UserData = string(b)
			}
			for _, v := range volumes {
				spec, err := parseVolumeSpec(v)
				if err != nil {
					return err
				}
				req.Volumes = append(req.Volumes, spec)
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			req.Tenant = t
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateInstanceResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Instances.Create(cmd.Context(), request(req, m))
				return err
			})
			if err != nil {
				return a.reportRefusal(cmd.ErrOrStderr(), err)
			}
			in := resp.Msg.GetInstance()
			var waitErr error
			if wait > 0 {
				in, waitErr = a.waitInstance(cmd.Context(), c, t, in, "running", wait, true)
			}
			if err := a.printInstances(cmd, &apiv1.CreateInstanceResponse{Instance: in}, in); err != nil {
				return err
			}
			return waitErr
		},
	}
	fl := create.Flags()
	fl.StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	fl.StringVar(&flavor, "flavor", "", "the flavor (the tenant's or the platform's); none on a provider pool, whose server type decides")
	fl.StringVar(&image, "image", "", "the guest image (default: the only one the control plane knows; a provider pool's image)")
	fl.StringVar(&ipPool, "ip-pool", "", "the IP pool the address comes from (default: the only one the tenant sees)")
	fl.StringVar(&capPool, "pool", "", "the capacity pool to place on (default: the only one the tenant sees)")
	fl.StringVar(&project, "project", "", "the project (default: the tenant's default project)")
	fl.StringVar(&policy, "network-policy", "", "egress (default), private or none")
	fl.StringVar(&onHostLost, "on-host-lost", "", "keep (default: the instance stays lost with its host) or recreate (placed again elsewhere from its image)")
	fl.StringArrayVar(&sshKeys, "ssh-key", nil, "an OpenSSH public key for the guest's user (repeatable)")
	fl.StringArrayVar(&sshKeyFiles, "ssh-key-file", nil, "a file of OpenSSH public keys (repeatable)")
	fl.StringVar(&userDataFile, "user-data-file", "", "cloud-init user data")
	fl.StringArrayVar(&volumes, "volume", nil, "create and attach a volume NAME:GIB[:qcow2|raw] (repeatable)")
	fl.DurationVar(&wait, "wait", 0, instanceWaitHelp)
	addConfirmationFlag(create, &confirmationID)

	get := &cobra.Command{
		Use:   "get INSTANCE",
		Short: "Show an instance",
		Args:  positional("INSTANCE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Instances.Get(cmd.Context(), connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: t, Instance: argv[0]}))
			if err != nil {
				return err
			}
			return a.printInstances(cmd, resp.Msg, resp.Msg.GetInstance())
		},
	}
	get.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List the tenant's instances",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Instance, string, error) {
				resp, err := c.Instances.List(ctx, connect.NewRequest(&apiv1.ListInstancesRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetInstances(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printInstances(cmd, &apiv1.ListInstancesResponse{Instances: all}, all...)
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	addLimitFlag(list, &limit)

	action := func(use, short, target string, call func(ctx context.Context, c *client.Client, t, ref string, m mutation) (*apiv1.Instance, error)) *cobra.Command {
		var (
			tenant, confirmationID string
			wait                   time.Duration
		)
		sub := &cobra.Command{
			Use:   use + " INSTANCE [--wait D]",
			Short: short,
			Args:  positional("INSTANCE"),
			RunE: func(cmd *cobra.Command, argv []string) error {
				if wait < 0 {
					return invalidArg("wait", "must not be negative")
				}
				c, t, err := a.clientTenant(cmd, tenant)
				if err != nil {
					return err
				}
				in, err := call(cmd.Context(), c, t, argv[0], mutation{confirmationID: confirmationID})
				if err != nil {
					return err
				}
				var waitErr error
				if wait > 0 {
					in, waitErr = a.waitInstance(cmd.Context(), c, t, in, target, wait, false)
				}
				if err := a.printInstances(cmd, in, in); err != nil {
					return err
				}
				return waitErr
			},
		}
		sub.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
		sub.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the instance to be "+target)
		addConfirmationFlag(sub, &confirmationID)
		return sub
	}
	start := action("start", "Start a stopped instance", "running", func(ctx context.Context, c *client.Client, t, ref string, m mutation) (*apiv1.Instance, error) {
		r, err := c.Instances.Start(ctx, request(&apiv1.StartInstanceRequest{Tenant: t, Instance: ref}, m))
		if err != nil {
			return nil, err
		}
		return r.Msg.GetInstance(), nil
	})
	stop := action("stop", "Stop a running instance (it keeps its host, address and disks)", "stopped",
		func(ctx context.Context, c *client.Client, t, ref string, m mutation) (*apiv1.Instance, error) {
			r, err := c.Instances.Stop(ctx, request(&apiv1.StopInstanceRequest{Tenant: t, Instance: ref}, m))
			if err != nil {
				return nil, err
			}
			return r.Msg.GetInstance(), nil
		})
	reboot := action("reboot", "Reboot a running instance's guest", "running",
		func(ctx context.Context, c *client.Client, t, ref string, m mutation) (*apiv1.Instance, error) {
			r, err := c.Instances.Reboot(ctx, request(&apiv1.RebootInstanceRequest{Tenant: t, Instance: ref}, m))
			if err != nil {
				return nil, err
			}
			return r.Msg.GetInstance(), nil
		})
	del := action("delete", "Delete an instance: its guest, address and booking go; its volumes stay, detached", "deleted",
		func(ctx context.Context, c *client.Client, t, ref string, m mutation) (*apiv1.Instance, error) {
			r, err := c.Instances.Delete(ctx, request(&apiv1.DeleteInstanceRequest{Tenant: t, Instance: ref}, m))
			if err != nil {
				return nil, err
			}
			return r.Msg.GetInstance(), nil
		})
	var (
		sshTenant, sshConfirmationID string
		sshFlags                     shellFlags
	)
	sshCmd := &cobra.Command{
		Use:   "ssh INSTANCE [-it] [-- CMD [ARGS...]]",
		Short: "Open a shell or run a command in a running instance over SSH, through the API (no agent in the guest)",
		Long: `Run CMD in the instance as its guest account (bc) and stream its stdout and
stderr here; the CLI exits with the command's exit code. With no CMD it
opens the account's login shell on a terminal (as -it does) when stdin is
a terminal, and refuses otherwise.

  -i  forwards stdin to the guest.
  -t  runs on a pseudo-terminal in the guest, of this terminal's $TERM and
      size (resizing this window resizes it); the local terminal goes raw
      (Ctrl-C, Ctrl-D reach the guest) and is restored when the session
      ends. Stdin must be a terminal. A terminal merges stderr into stdout.

The CLI makes an ephemeral Ed25519 key, has the API sign it (a certificate
valid at most 15 minutes) and issue a single-use ticket, then opens a tunnel
through the API and the instance's host (never a direct connection) and
pins the guest by its host certificate from the deployment's SSH CA. A guest
without a valid certificate is refused before anything runs. With -o json
(not with -t) it prints {exitCode, hostCertificate: valid|expired|none,
stdout, stderr}.`,
		Example: `  better-compute instances ssh vm1                 # a login shell
  better-compute instances ssh vm1 -- uname -a
  better-compute instances ssh vm1 -it -- top
  tar c dir | better-compute instances ssh vm1 -i -- tar x`,
		Args: guestExecArgs("INSTANCE", "uname -a", &sshFlags, true),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, sshTenant)
			if err != nil {
				return err
			}
			return a.runGuestCommand(cmd, argv[1:], sshFlags, true, func(ctx context.Context, publicKey string) (*apiv1.SshTicket, error) {
				r, err := c.Instances.Ssh(ctx, request(&apiv1.SshInstanceRequest{Tenant: t, Instance: argv[0], PublicKey: publicKey},
					mutation{confirmationID: sshConfirmationID}))
				if err != nil {
					return nil, err
				}
				return r.Msg.GetTicket(), nil
			})
		},
	}
	sshFlags.add(sshCmd)
	sshCmd.Flags().StringVar(&sshTenant, "tenant", "", "tenant (default: the context's)")
	addConfirmationFlag(sshCmd, &sshConfirmationID)
	cmd.AddCommand(create, list, get, start, stop, reboot, del, sshCmd)
	return cmd
}

// parseVolumeSpec reads --volume NAME:GIB[:FORMAT].
func parseVolumeSpec(s string) (*apiv1.InstanceVolumeSpec, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return nil, invalidArg("volume", fmt.Sprintf("must be NAME:GIB[:qcow2|raw], got %q", s))
	}
	n, err := strconv.Atoi(parts[1])
	if err != nil {
		return nil, invalidArg("volume", fmt.Sprintf("size must be a number of GiB, got %q", parts[1]))
	}
	spec := &apiv1.InstanceVolumeSpec{Name: parts[0], SizeGib: int32(n)}
	if len(parts) == 3 {
		spec.Format = parts[2]
	}
	return spec, nil
}

// settledInstance reports whether an instance stopped moving towards
// target: it got there, or it never will.
func settledInstance(state, target string) bool {
	switch state {
	case target, "failed", "lost", "deleted":
		return true
	}
	return false
}

// waitInstance polls in until it reaches target (or cannot) or d passes;
// with ssh, a running guest's SSH address must answer on TCP too.
func (a *app) waitInstance(ctx context.Context, c *client.Client, tenant string, in *apiv1.Instance, target string, d time.Duration, ssh bool) (*apiv1.Instance, error) {
	poll := 5 * a.retryBackoff
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		if settledInstance(in.GetState(), target) {
			if in.GetState() != target {
				return in, connect.NewError(connect.CodeAborted, fmt.Errorf("instance %s is %s: %s", in.GetName(), in.GetState(),
					cmpOr(in.GetMessage(), "no reason given")))
			}
			if !ssh || in.GetSshAddress() == "" || sshAnswers(ctx, in.GetSshAddress()) {
				return in, nil
			}
		}
		select {
		case <-ctx.Done():
			return in, connect.NewError(connect.CodeCanceled, fmt.Errorf("stopped waiting for instance %s (%s)", in.GetName(), in.GetState()))
		case <-deadline.C:
			return in, connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("instance %s still %s after %s (waiting for %s)", in.GetName(),
				in.GetState(), d, target))
		case <-time.After(poll):
		}
		resp, err := c.Instances.Get(ctx, connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: tenant, Instance: in.GetId()}))
		if err != nil {
			return in, err
		}
		in = resp.Msg.GetInstance()
	}
}

// waitVolume polls v until it settles (attached or available) or d
// passes: settling elsewhere than target is the failure, with the
// volume's message (an attach bcd refused leaves it available).
func (a *app) waitVolume(ctx context.Context, c *client.Client, tenant string, v *apiv1.Volume, target string, d time.Duration) (*apiv1.Volume, error) {
	poll := 5 * a.retryBackoff
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		switch v.GetState() {
		case target:
			return v, nil
		case "attached", "available", "failed", "deleted":
			return v, connect.NewError(connect.CodeAborted, fmt.Errorf("volume %s is %s: %s", v.GetName(), v.GetState(),
				cmpOr(v.GetMessage(), "no reason given")))
		}
		select {
		case <-ctx.Done():
			return v, connect.NewError(connect.CodeCanceled, fmt.Errorf("stopped waiting for volume %s (%s)", v.GetName(), v.GetState()))
		case <-deadline.C:
			return v, connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("volume %s still %s after %s (waiting for %s)", v.GetName(),
				v.GetState(), d, target))
		case <-time.After(poll):
		}
		resp, err := c.Volumes.Get(ctx, connect.NewRequest(&apiv1.GetVolumeRequest{Tenant: tenant, Volume: v.GetId()}))
		if err != nil {
			return v, err
		}
		v = resp.Msg.GetVolume()
	}
}

// sshAnswers reports whether something at addr greets like an SSH server.
func sshAnswers(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer func() { _ = conn.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetReadDeadline(dl)
	}
	buf := make([]byte, 4)
	_, err = io.ReadFull(conn, buf)
	return err == nil && string(buf) == "SSH-"
}

func (a *app) printInstances(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Instance) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		managed := false
		for _, in := range items {
			managed = managed || in.GetManagedBy() != ""
		}
		head := []string{"ID", "NAME", "STATE", "FLAVOR", "ADDRESS", "NODE", "SSH", "CONDITIONS"}
		if managed {
			// Instances nobody created by hand (sandboxes, warm pools)
			// say who drives them.
			head = append(head, "MANAGED BY")
		}
		row(w, head...)
		for _, in := range items {
			var conds []string
			for _, c := range in.GetConditions() {
				if c.GetStatus() == "true" {
					conds = append(conds, c.GetType())
				}
			}
			state := in.GetState()
			if in.GetMessage() != "" {
				state += " (" + in.GetMessage() + ")"
			}
			cells := []string{in.GetId(), in.GetName(), state, in.GetFlavor(), in.GetAddress(), cmpOr(in.GetNodeName(), in.GetNodeId()),
				in.GetSshAddress(), strings.Join(conds, ",")}
			if managed {
				cells = append(cells, dash(in.GetManagedBy()))
			}
			row(w, cells...)
		}
	})
}

func (a *app) volumesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "volumes", Aliases: []string{"volume"}, Short: "Manage host volumes (disk files on an instance's host)"}
	var (
		tenant, format, instance, confirmationID string
		sizeGiB                                  int32
		limit                                    int
		wait                                     time.Duration
	)
	create := &cobra.Command{
		Use:   "create NAME --size-gib N --instance INSTANCE [--format qcow2|raw]",
		Short: "Create a detached volume on the host of an instance",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateVolumeResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Volumes.Create(cmd.Context(), request(&apiv1.CreateVolumeRequest{Tenant: t, Name: argv[0], SizeGib: sizeGiB,
					Format: format, Instance: instance}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printVolumes(cmd, resp.Msg, resp.Msg.GetVolume())
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	create.Flags().Int32Var(&sizeGiB, "size-gib", 0, "size in GiB")
	create.Flags().StringVar(&format, "format", "", "qcow2 (default) or raw")
	create.Flags().StringVar(&instance, "instance", "", "the instance whose host holds the volume")
	addConfirmationFlag(create, &confirmationID)

	get := &cobra.Command{
		Use:   "get VOLUME",
		Short: "Show a volume",
		Args:  positional("VOLUME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Volumes.Get(cmd.Context(), connect.NewRequest(&apiv1.GetVolumeRequest{Tenant: t, Volume: argv[0]}))
			if err != nil {
				return err
			}
			return a.printVolumes(cmd, resp.Msg, resp.Msg.GetVolume())
		},
	}
	get.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List the tenant's volumes",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Volume, string, error) {
				resp, err := c.Volumes.List(ctx, connect.NewRequest(&apiv1.ListVolumesRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetVolumes(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printVolumes(cmd, &apiv1.ListVolumesResponse{Volumes: all}, all...)
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	addLimitFlag(list, &limit)

	attach := &cobra.Command{
		Use:   "attach VOLUME --instance INSTANCE [--wait D]",
		Short: "Attach an available volume to a running or stopped instance on its host (hot-plugged into a running guest)",
		Args:  positional("VOLUME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if wait < 0 {
				return invalidArg("wait", "must not be negative")
			}
			if instance == "" {
				return invalidArg("instance", "name the instance to attach to")
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Volumes.Attach(cmd.Context(), request(&apiv1.AttachVolumeRequest{Tenant: t, Volume: argv[0], Instance: instance},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			v, waitErr := resp.Msg.GetVolume(), error(nil)
			if wait > 0 {
				v, waitErr = a.waitVolume(cmd.Context(), c, t, v, "attached", wait)
			}
			if err := a.printVolumes(cmd, &apiv1.AttachVolumeResponse{Volume: v}, v); err != nil {
				return err
			}
			return waitErr
		},
	}
	attach.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	attach.Flags().StringVar(&instance, "instance", "", "the instance to attach to (on the volume's host)")
	attach.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the volume to be attached")
	addConfirmationFlag(attach, &confirmationID)

	detach := &cobra.Command{
		Use:   "detach VOLUME [--wait D]",
		Short: "Detach a volume from its instance (a running guest must release the device first)",
		Args:  positional("VOLUME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if wait < 0 {
				return invalidArg("wait", "must not be negative")
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Volumes.Detach(cmd.Context(), request(&apiv1.DetachVolumeRequest{Tenant: t, Volume: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			v, waitErr := resp.Msg.GetVolume(), error(nil)
			if wait > 0 {
				v, waitErr = a.waitVolume(cmd.Context(), c, t, v, "available", wait)
			}
			if err := a.printVolumes(cmd, &apiv1.DetachVolumeResponse{Volume: v}, v); err != nil {
				return err
			}
			return waitErr
		},
	}
	detach.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	detach.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the volume to be available")
	addConfirmationFlag(detach, &confirmationID)

	del := &cobra.Command{
		Use:   "delete VOLUME",
		Short: "Delete a detached volume from its host",
		Args:  positional("VOLUME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Volumes.Delete(cmd.Context(), request(&apiv1.DeleteVolumeRequest{Tenant: t, Volume: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printVolumes(cmd, resp.Msg, resp.Msg.GetVolume())
		},
	}
	del.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	addConfirmationFlag(del, &confirmationID)

	cmd.AddCommand(create, list, get, attach, detach, del)
	return cmd
}

func (a *app) printVolumes(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Volume) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "NAME", "STATE", "SIZE", "FORMAT", "INSTANCE", "NODE")
		for _, v := range items {
			state := v.GetState()
			if v.GetMessage() != "" {
				state += " (" + v.GetMessage() + ")"
			}
			row(w, v.GetId(), v.GetName(), state, fmt.Sprintf("%d GiB", v.GetSizeGib()), v.GetFormat(), v.GetInstanceId(), v.GetNodeId())
		}
	})
}
