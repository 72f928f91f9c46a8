package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func (a *app) sandboxTemplatesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "sandbox-templates", Aliases: []string{"sandbox-template"},
		Short: "Manage sandbox templates (image, flavor, pool, TTL bounds, warm pool, env from the tenant's secrets)"}
	var (
		tenant, confirmationID                 string
		flavor, image, ipPool, capPool, policy string
		project                                string
		defTTL, maxTTL                         time.Duration
		warmMin, warmMax                       int32
		env                                    []string
		limit                                  int
	)
	create := &cobra.Command{
		Use:   "create NAME --flavor F [--image I] [--pool P] [--ip-pool P] [--ttl D] [--max-ttl D] [--warm-min N --warm-max M] [--env NAME=secret://S]",
		Short: "Add a template, checked once against its pool (so later sandbox creates fail only for capacity)",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			req := &apiv1.CreateSandboxTemplateRequest{Name: argv[0], Flavor: flavor, Image: image, Pool: capPool, IpPool: ipPool, Project: project,
				WarmMin: warmMin, WarmMax: warmMax, NetworkPolicy: policy}
			if defTTL != 0 {
				req.DefaultTtl = durationpb.New(defTTL)
			}
			if maxTTL != 0 {
				req.MaxTtl = durationpb.New(maxTTL)
			}
			for _, e := range env {
				k, v, ok := strings.Cut(e, "=")
				if !ok {
					return invalidArg("env", fmt.Sprintf("%q is not NAME=secret://SECRET", e))
				}
				if req.Env == nil {
					req.Env = map[string]string{}
				}
				req.Env[k] = v
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			req.Tenant = t
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateSandboxTemplateResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.SandboxTemplates.Create(cmd.Context(), request(req, m))
				return err
			})
			if err != nil {
				return a.reportRefusal(cmd.ErrOrStderr(), err)
			}
			return a.printSandboxTemplates(cmd, resp.Msg, resp.Msg.GetTemplate())
		},
	}
	fl := create.Flags()
	fl.StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	fl.StringVar(&flavor, "flavor", "", "the flavor (the tenant's or the platform's)")
	fl.StringVar(&image, "image", "", "the guest image (default: the only one the control plane knows)")
	fl.StringVar(&capPool, "pool", "", "the capacity pool (default: the only one the tenant sees)")
	fl.StringVar(&ipPool, "ip-pool", "", "the IP pool (default: the only one the tenant sees)")
	fl.StringVar(&policy, "network-policy", "", "egress (default), private or none")
	fl.StringVar(&project, "project", "", "the project sandboxes book capacity in (default: the tenant's default project)")
	fl.DurationVar(&defTTL, "ttl", 0, "a sandbox's lifetime when its create names none (default 1h)")
	fl.DurationVar(&maxTTL, "max-ttl", 0, "the longest lifetime a create or extend may ask for (default 24h)")
	fl.Int32Var(&warmMin, "warm-min", 0, "paused instances kept ready to claim")
	fl.Int32Var(&warmMax, "warm-max", 0, "most paused instances kept")
	fl.StringArrayVar(&env, "env", nil, "NAME=secret://SECRET of the tenant's own secrets, written to /etc/sandbox/env in the guest (repeatable)")
	addConfirmationFlag(create, &confirmationID)

	get := &cobra.Command{
		Use:   "get TEMPLATE",
		Short: "Show a template",
		Args:  positional("TEMPLATE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.SandboxTemplates.Get(cmd.Context(), connect.NewRequest(&apiv1.GetSandboxTemplateRequest{Tenant: t, Template: argv[0]}))
			if err != nil {
				return err
			}
			return a.printSandboxTemplates(cmd, resp.Msg, resp.Msg.GetTemplate())
		},
	}
	get.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List a tenant's templates",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.SandboxTemplate, string, error) {
				resp, err := c.SandboxTemplates.List(ctx, connect.NewRequest(&apiv1.ListSandboxTemplatesRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetTemplates(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printSandboxTemplates(cmd, &apiv1.ListSandboxTemplatesResponse{Templates: all}, all...)
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	addLimitFlag(list, &limit)

	del := &cobra.Command{
		Use:   "delete TEMPLATE",
		Short: "Delete a template; its warm instances are drained, its sandboxes run until deleted or expired",
		Args:  positional("TEMPLATE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.SandboxTemplates.Delete(cmd.Context(), request(&apiv1.DeleteSandboxTemplateRequest{Tenant: t, Template: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "deleted %s\n", argv[0]) })
		},
	}
	del.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	addConfirmationFlag(del, &confirmationID)

	cmd.AddCommand(create, list, get, del)
	return cmd
}

func (a *app) printSandboxTemplates(cmd *cobra.Command, msg proto.Message, items ...*apiv1.SandboxTemplate) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "NAME", "FLAVOR", "IMAGE", "TTL", "MAX TTL", "WARM", "NETWORK", "ENV")
		for _, t := range items {
			var env []string
			for k := range t.GetEnv() {
				env = append(env, k)
			}
			sort.Strings(env)
			row(w, t.GetId(), t.GetName(), t.GetFlavor(), t.GetImage(), t.GetDefaultTtl().AsDuration().String(),
				t.GetMaxTtl().AsDuration().String(), fmt.Sprintf("%d-%d", t.GetWarmMin(), t.GetWarmMax()), t.GetNetworkPolicy(),
				cmpOr(strings.Join(env, ","), "-"))
		}
	})
}

func (a *app) sandboxesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "sandboxes", Aliases: []string{"sandbox", "sbx"},
		Short: "Run short-lived guests from templates (claimed from a warm pool or booted; deleted at expiry)"}
	var (
		tenant, confirmationID, template string
		fromSnapshot                     string
		ttl, wait                        time.Duration
		limit                            int
		keep                             bool
	)
	create := &cobra.Command{
		Use:   "create --template T [--from-snapshot SNAP] [--ttl D] [--wait D]",
		Short: "Create a sandbox: a warm instance of the template is claimed and resumed, or one is booted (from a snapshot's disk with --from-snapshot)",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if wait < 0 {
				return invalidArg("wait", "must not be negative")
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			req := &apiv1.CreateSandboxRequest{Tenant: t, Template: template, FromSnapshot: fromSnapshot}
			if ttl != 0 {
				req.Ttl = durationpb.New(ttl)
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateSandboxResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Sandboxes.Create(cmd.Context(), request(req, m))
				return err
			})
			if err != nil {
				return a.reportRefusal(cmd.ErrOrStderr(), err)
			}
			sb := resp.Msg.GetSandbox()
			var waitErr error
			if wait > 0 {
				sb, waitErr = a.waitSandbox(cmd.Context(), c, t, sb, wait)
			}
			if err := a.printSandboxes(cmd, &apiv1.CreateSandboxResponse{Sandbox: sb}, sb); err != nil {
				return err
			}
			return waitErr
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	create.Flags().StringVar(&template, "template", "", "the template (name or id)")
	create.Flags().StringVar(&fromSnapshot, "from-snapshot", "", "boot from this ready snapshot's disk (a kept one, or one of a live sandbox), on its node, as a new guest")
	create.Flags().DurationVar(&ttl, "ttl", 0, "lifetime (default: the template's; at most its max)")
	create.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the sandbox to run")
	addConfirmationFlag(create, &confirmationID)

	get := &cobra.Command{
		Use:   "get SANDBOX",
		Short: "Show a sandbox",
		Args:  positional("SANDBOX"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Sandboxes.Get(cmd.Context(), connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: t, Sandbox: argv[0]}))
			if err != nil {
				return err
			}
			return a.printSandboxes(cmd, resp.Msg, resp.Msg.GetSandbox())
		},
	}
	get.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List a tenant's sandboxes",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Sandbox, string, error) {
				resp, err := c.Sandboxes.List(ctx, connect.NewRequest(&apiv1.ListSandboxesRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetSandboxes(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printSandboxes(cmd, &apiv1.ListSandboxesResponse{Sandboxes: all}, all...)
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	addLimitFlag(list, &limit)

	var extendTTL time.Duration
	extend := &cobra.Command{
		Use:   "extend SANDBOX --ttl D",
		Short: "Set a sandbox's lifetime, counted from its create (at most the template's max)",
		Args:  positional("SANDBOX"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Sandboxes.Extend(cmd.Context(), request(&apiv1.ExtendSandboxRequest{Tenant: t, Sandbox: argv[0], Ttl: durationpb.New(extendTTL)},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return a.reportRefusal(cmd.ErrOrStderr(), err)
			}
			return a.printSandboxes(cmd, resp.Msg, resp.Msg.GetSandbox())
		},
	}
	extend.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	extend.Flags().DurationVar(&extendTTL, "ttl", 0, "the new lifetime from create")
	addConfirmationFlag(extend, &confirmationID)

	del := &cobra.Command{
		Use:   "delete SANDBOX",
		Short: "Delete a sandbox and its guest",
		Args:  positional("SANDBOX"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Sandboxes.Delete(cmd.Context(), request(&apiv1.DeleteSandboxRequest{Tenant: t, Sandbox: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printSandboxes(cmd, resp.Msg, resp.Msg.GetSandbox())
		},
	}
	del.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	addConfirmationFlag(del, &confirmationID)

	snap := &cobra.Command{
		Use:   "snapshot SANDBOX",
		Short: "Save a running sandbox's memory, device state and disks on its host",
		Args:  positional("SANDBOX"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Sandboxes.Snapshot(cmd.Context(), request(&apiv1.SnapshotSandboxRequest{Tenant: t, Sandbox: argv[0], Keep: keep},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return a.reportRefusal(cmd.ErrOrStderr(), err)
			}
			return a.printSnapshots(cmd, resp.Msg, resp.Msg.GetSnapshot())
		},
	}
	snap.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	snap.Flags().BoolVar(&keep, "keep", false, "keep the snapshot when the sandbox is deleted, to create sandboxes from (sandboxes create --from-snapshot)")
	addConfirmationFlag(snap, &confirmationID)

	var execFlags shellFlags
	execCmd := &cobra.Command{
		Use:   "exec SANDBOX [-it] [-- CMD [ARGS...]]",
		Short: "Run a command or open a shell in a running sandbox over SSH, through the API (no agent in the guest)",
		Long: `Run CMD in the sandbox as its guest account (bc) and stream its stdout and
stderr here; the CLI exits with the command's exit code. With -it and no
CMD it opens the account's login shell.

  -i  forwards stdin to the guest.
  -t  runs on a pseudo-terminal in the guest, of this terminal's $TERM and
      size (resizing this window resizes it); the local terminal goes raw
      (Ctrl-C, Ctrl-D reach the guest) and is restored when the session
      ends. Stdin must be a terminal. A terminal merges stderr into stdout.

The API signs an ephemeral key for at most 15 minutes and never past the
sandbox's expire time, and issues a single-use ticket; the CLI tunnels
through the API and the sandbox's host and pins the guest by its CA-signed
host certificate. With -o json (not with -t) it prints {exitCode,
hostCertificate: valid|expired|none, stdout, stderr}. An expired or
deleted sandbox is refused (FAILED_PRECONDITION).`,
		Example: `  better-compute sandboxes exec sbx_1 -it            # a login shell
  better-compute sandboxes exec sbx_1 -- python3 -c 'print(1)'
  better-compute sandboxes exec sbx_1 -i -- sh -c 'cat > job.py' < job.py`,
		Args: guestExecArgs("SANDBOX", "uname -a", &execFlags, false),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			return a.runGuestCommand(cmd, argv[1:], execFlags, false, func(ctx context.Context, publicKey string) (*apiv1.SshTicket, error) {
				r, err := c.Sandboxes.Exec(ctx, request(&apiv1.ExecSandboxRequest{Tenant: t, Sandbox: argv[0], PublicKey: publicKey},
					mutation{confirmationID: confirmationID}))
				if err != nil {
					return nil, err
				}
				return r.Msg.GetTicket(), nil
			})
		},
	}
	execFlags.add(execCmd)
	execCmd.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	addConfirmationFlag(execCmd, &confirmationID)

	var (
		snapshotID  string
		restoreWait time.Duration
	)
	restore := &cobra.Command{
		Use:   "restore SANDBOX --snapshot SNAP [--wait D]",
		Short: "Bring a running sandbox back to one of its own ready snapshots, in place on its host",
		Args:  positional("SANDBOX"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if restoreWait < 0 {
				return invalidArg("wait", "must not be negative")
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Sandboxes.Restore(cmd.Context(), request(&apiv1.RestoreSandboxRequest{Tenant: t, Sandbox: argv[0], Snapshot: snapshotID},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return a.reportRefusal(cmd.ErrOrStderr(), err)
			}
			sb := resp.Msg.GetSandbox()
			var waitErr error
			if restoreWait > 0 {
				sb, waitErr = a.waitSandbox(cmd.Context(), c, t, sb, restoreWait)
			}
			if err := a.printSandboxes(cmd, &apiv1.RestoreSandboxResponse{Sandbox: sb}, sb); err != nil {
				return err
			}
			return waitErr
		},
	}
	restore.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	restore.Flags().StringVar(&snapshotID, "snapshot", "", "a ready snapshot of this sandbox (id)")
	restore.Flags().DurationVar(&restoreWait, "wait", 0, "wait up to this long for the sandbox to run again")
	addConfirmationFlag(restore, &confirmationID)

	cmd.AddCommand(create, list, get, extend, del, snap, restore, execCmd, a.sandboxSnapshotsCommand())
	return cmd
}

// sandboxSnapshotsCommand lists and deletes a tenant's sandbox snapshots
// (of live and deleted sandboxes).
func (a *app) sandboxSnapshotsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "snapshots", Aliases: []string{"snapshot-list"},
		Short: "List and delete sandbox snapshots (a kept one outlives its sandbox and seeds new ones)"}
	var (
		tenant, sandbox, confirmationID string
		limit                           int
	)
	list := &cobra.Command{
		Use:   "list [--sandbox SBX]",
		Short: "List the tenant's snapshots, of one sandbox (live or deleted) with --sandbox",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.SandboxSnapshot, string, error) {
				resp, err := c.Sandboxes.ListSnapshots(ctx, connect.NewRequest(&apiv1.ListSandboxSnapshotsRequest{Tenant: t, Sandbox: sandbox,
					PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetSnapshots(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printSnapshots(cmd, &apiv1.ListSandboxSnapshotsResponse{Snapshots: all}, all...)
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	list.Flags().StringVar(&sandbox, "sandbox", "", "only this sandbox's snapshots (id)")
	addLimitFlag(list, &limit)

	del := &cobra.Command{
		Use:   "delete SNAP",
		Short: "Delete a snapshot and its files on its host",
		Args:  positional("SNAP"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Sandboxes.DeleteSnapshot(cmd.Context(), request(&apiv1.DeleteSandboxSnapshotRequest{Tenant: t, Snapshot: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return a.reportRefusal(cmd.ErrOrStderr(), err)
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "deleted %s\n", argv[0]) })
		},
	}
	del.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the context's)")
	addConfirmationFlag(del, &confirmationID)

	cmd.AddCommand(list, del)
	return cmd
}

func (a *app) printSnapshots(cmd *cobra.Command, msg proto.Message, items ...*apiv1.SandboxSnapshot) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "SANDBOX", "NODE", "STATE", "KEEP", "IMAGE", "DISK", "CREATED")
		for _, s := range items {
			disk := "-"
			if s.GetDiskGib() > 0 {
				disk = fmt.Sprintf("%d GiB", s.GetDiskGib())
			}
			row(w, s.GetId(), s.GetSandboxId(), s.GetNodeId(), s.GetState(), fmt.Sprint(s.GetKeep()), cmpOr(s.GetImage(), "-"), disk, ts(s.GetCreateTime()))
		}
	})
}

// waitSandbox polls sb until it runs, fails, or d passes.
func (a *app) waitSandbox(ctx context.Context, c *client.Client, tenant string, sb *apiv1.Sandbox, d time.Duration) (*apiv1.Sandbox, error) {
	poll := 5 * a.retryBackoff
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		switch sb.GetState() {
		case "running":
			return sb, nil
		case "failed", "deleting", "deleted":
			return sb, connect.NewError(connect.CodeAborted, fmt.Errorf("sandbox %s is %s", sb.GetId(), sb.GetState()))
		}
		select {
		case <-ctx.Done():
			return sb, connect.NewError(connect.CodeCanceled, fmt.Errorf("stopped waiting for sandbox %s (%s)", sb.GetId(), sb.GetState()))
		case <-deadline.C:
			return sb, connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("sandbox %s still %s after %s", sb.GetId(), sb.GetState(), d))
		case <-time.After(poll):
		}
		resp, err := c.Sandboxes.Get(ctx, connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: tenant, Sandbox: sb.GetId()}))
		if err != nil {
			return sb, err
		}
		sb = resp.Msg.GetSandbox()
	}
}

func (a *app) printSandboxes(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Sandbox) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "TEMPLATE", "STATE", "ORIGIN", "ADDRESS", "INSTANCE", "EXPIRES")
		for _, s := range items {
			row(w, s.GetId(), s.GetTemplate(), s.GetState(), s.GetOrigin(), cmpOr(s.GetAddress(), "-"), s.GetInstanceId(),
				ts(s.GetExpireTime()))
		}
	})
}
