package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func (a *app) sitesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "sites", Aliases: []string{"site"}, Short: "Manage a tenant's sites (provisioning networks of bare-metal machines)"}
	var (
		tenant, confirmationID, dhcpMode, description string
		networks                                      []string
		limit                                         int
	)
	create := &cobra.Command{
		Use:   "create NAME --networks CIDR[,CIDR…] [--dhcp-mode full|proxy]",
		Short: "Add a site; every BMC address of its machines must fall in its networks",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateSiteResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Sites.Create(cmd.Context(), request(&apiv1.CreateSiteRequest{Tenant: t, Name: argv[0], Networks: networks,
					DhcpMode: dhcpMode, Description: description}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printSites(cmd, resp.Msg, resp.Msg.GetSite())
		},
	}
	addTenantFlag(create, &tenant)
	create.Flags().StringSliceVar(&networks, "networks", nil, "provisioning networks as CIDRs, comma-separated")
	create.Flags().StringVar(&dhcpMode, "dhcp-mode", "full", "full (answer DHCP on the network) or proxy (proxyDHCP beside a DHCP server)")
	create.Flags().StringVar(&description, "description", "", "what the site is")
	addConfirmationFlag(create, &confirmationID)

	get := &cobra.Command{
		Use:   "get SITE",
		Short: "Show a site",
		Args:  positional("SITE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Sites.Get(cmd.Context(), connect.NewRequest(&apiv1.GetSiteRequest{Tenant: t, Site: argv[0]}))
			if err != nil {
				return err
			}
			return a.printSites(cmd, resp.Msg, resp.Msg.GetSite())
		},
	}
	addTenantFlag(get, &tenant)

	list := &cobra.Command{
		Use:   "list",
		Short: "List a tenant's sites",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Site, string, error) {
				resp, err := c.Sites.List(ctx, connect.NewRequest(&apiv1.ListSitesRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetSites(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printSites(cmd, &apiv1.ListSitesResponse{Sites: all}, all...)
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)

	update := &cobra.Command{
		Use:   "update SITE [--networks CIDR,…] [--dhcp-mode full|proxy] [--description D]",
		Short: "Change a site; a network an enrolled machine's BMC needs stays",
		Args:  positional("SITE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			req := &apiv1.UpdateSiteRequest{Tenant: t, Site: argv[0]}
			fl := cmd.Flags()
			if fl.Changed("networks") {
				req.Networks, req.UpdateNetworks = networks, true
			}
			if fl.Changed("dhcp-mode") {
				req.DhcpMode = &dhcpMode
			}
			if fl.Changed("description") {
				req.Description = &description
			}
			resp, err := c.Sites.Update(cmd.Context(), request(req, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printSites(cmd, resp.Msg, resp.Msg.GetSite())
		},
	}
	addTenantFlag(update, &tenant)
	update.Flags().StringSliceVar(&networks, "networks", nil, "replace the networks (CIDRs, comma-separated)")
	update.Flags().StringVar(&dhcpMode, "dhcp-mode", "", "full or proxy")
	update.Flags().StringVar(&description, "description", "", "the new description")
	addConfirmationFlag(update, &confirmationID)

	del := &cobra.Command{
		Use:   "delete SITE",
		Short: "Delete a site whose machines are all retired",
		Args:  positional("SITE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Sites.Delete(cmd.Context(), request(&apiv1.DeleteSiteRequest{Tenant: t, Site: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "deleted %s\n", argv[0]) })
		},
	}
	addTenantFlag(del, &tenant)
	addConfirmationFlag(del, &confirmationID)

	cmd.AddCommand(create, list, get, update, del)
	return cmd
}

func (a *app) printSites(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Site) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "NAME", "NETWORKS", "DHCP", "UPDATED")
		for _, s := range items {
			row(w, s.GetId(), s.GetName(), strings.Join(s.GetNetworks(), ","), s.GetDhcpMode(), ts(s.GetUpdateTime()))
		}
	})
}

// bmcPassword reads the BMC password from --bmc-password-file (- for
// stdin): never from an argument, which the process list shows.
func bmcPassword(cmd *cobra.Command, file string) (string, error) {
	var (
		b   []byte
		err error
	)
	switch file {
	case "":
		return "", invalidArg("bmc-password-file", "pass --bmc-password-file FILE (- for stdin): the password is never an argument")
	case "-":
		b, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), 4096))
	default:
		b, err = os.ReadFile(file)
	}
	if err != nil {
		return "", invalidArg("bmc-password-file", err.Error())
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

func (a *app) machinesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "machines", Aliases: []string{"machine"}, Short: "Enroll bare-metal machines and move them through their lifecycle",
		Long: `A machine is enrolled at a site with its BMC and the MAC it PXE-boots from, then
driven by workflows: inspect (inventory), commission (inventory, wipe, optional
burn-in; ends ready), deploy (write a signed image and boot it), release (wipe;
ends ready), rescue (the ramdisk with an SSH key, at most an hour) and retire.
A machine runs one workflow at a time.`}
	var (
		tenant, confirmationID string
		limit                  int
	)
	var (
		site, name, driver, address, username, passwordFile, mac, profile string
	)
	enroll := &cobra.Command{
		Use:   "enroll NAME --site S --bmc-driver ipmi|redfish|EXTERNAL --bmc-address A --bmc-username U --bmc-password-file F --mac M",
		Short: "Enroll a machine; its BMC password is sealed at once and never shown",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			name = argv[0]
			pw, err := bmcPassword(cmd, passwordFile)
			if err != nil {
				return err
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.EnrollMachineResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Machines.Enroll(cmd.Context(), request(&apiv1.EnrollMachineRequest{Tenant: t, Site: site, Name: name,
					BmcDriver: driver, BmcAddress: address, BmcUsername: username, BmcPassword: pw, Mac: mac, HardwareProfile: profile}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printMachine(cmd, resp.Msg, resp.Msg.GetMachine())
		},
	}
	addTenantFlag(enroll, &tenant)
	enroll.Flags().StringVar(&site, "site", "", "the site (name or id)")
	enroll.Flags().StringVar(&driver, "bmc-driver", "", "ipmi, redfish, or an external driver the site's agents report (drivers list)")
	enroll.Flags().StringVar(&address, "bmc-address", "", "the BMC: an IP (ipmi, port 623) or a Redfish URL (https://10.0.0.5)")
	enroll.Flags().StringVar(&username, "bmc-username", "", "the BMC user")
	enroll.Flags().StringVar(&passwordFile, "bmc-password-file", "", "read the BMC password from this file (- for stdin)")
	enroll.Flags().StringVar(&mac, "mac", "", "the MAC address the machine PXE-boots from")
	enroll.Flags().StringVar(&profile, "hardware-profile", "", "a hardware profile label")
	addConfirmationFlag(enroll, &confirmationID)

	get := &cobra.Command{
		Use:   "get MACHINE",
		Short: "Show a machine: state, workflow, failure, inventory and erase record",
		Args:  positional("MACHINE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Machines.Get(cmd.Context(), connect.NewRequest(&apiv1.GetMachineRequest{Tenant: t, Machine: argv[0]}))
			if err != nil {
				return err
			}
			return a.printMachine(cmd, resp.Msg, resp.Msg.GetMachine())
		},
	}
	addTenantFlag(get, &tenant)

	var state string
	list := &cobra.Command{
		Use:   "list [--site S] [--state ready]",
		Short: "List a tenant's machines",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Machine, string, error) {
				resp, err := c.Machines.List(ctx, connect.NewRequest(&apiv1.ListMachinesRequest{Tenant: t, Site: site, State: state,
					PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetMachines(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(&apiv1.ListMachinesResponse{Machines: all}, func(w io.Writer) {
				machineTable(w, a.siteNames(cmd.Context(), all), all...)
			})
		},
	}
	addTenantFlag(list, &tenant)
	list.Flags().StringVar(&site, "site", "", "only this site's machines")
	list.Flags().StringVar(&state, "state", "", "only machines in this state")
	addLimitFlag(list, &limit)

	// transition builds one lifecycle verb.
	var waitFor time.Duration
	transition := func(use, short string, call func(cmd *cobra.Command, c machineCaller, t, machine string, m mutation) (*apiv1.Machine, proto.Message, error),
		flags func(*cobra.Command)) *cobra.Command {
		sub := &cobra.Command{
			Use:   use,
			Short: short,
			Args:  positional("MACHINE"),
			RunE: func(cmd *cobra.Command, argv []string) error {
				c, t, err := a.clientTenant(cmd, tenant)
				if err != nil {
					return err
				}
				m, msg, err := call(cmd, c.Machines, t, argv[0], mutation{confirmationID: confirmationID})
				if err != nil {
					return err
				}
				if waitFor > 0 && m.GetWorkflowId() != "" {
					return a.waitTransition(cmd, c, t, m, waitFor)
				}
				return a.printMachine(cmd, msg, m)
			},
		}
		addTenantFlag(sub, &tenant)
		addConfirmationFlag(sub, &confirmationID)
		sub.Flags().DurationVar(&waitFor, "wait", 0, "wait up to this long for the workflow to end, printing each step as it goes (e.g. --wait 5m)")
		if flags != nil {
			flags(sub)
		}
		return sub
	}
	inspect := transition("inspect MACHINE", "Refresh a machine's inventory from the ramdisk",
		func(cmd *cobra.Command, c machineCaller, t, machine string, m mutation) (*apiv1.Machine, proto.Message, error) {
			r, err := c.Inspect(cmd.Context(), request(&apiv1.InspectMachineRequest{Tenant: t, Machine: machine}, m))
			if err != nil {
				return nil, nil, err
			}
			return r.Msg.GetMachine(), r.Msg, nil
		}, nil)
	var burnIn bool
	commission := transition("commission MACHINE [--burn-in]", "Inventory and wipe a machine (and burn it in); it ends ready",
		func(cmd *cobra.Command, c machineCaller, t, machine string, m mutation) (*apiv1.Machine, proto.Message, error) {
			r, err := c.Commission(cmd.Context(), request(&apiv1.CommissionMachineRequest{Tenant: t, Machine: machine, BurnIn: burnIn}, m))
			if err != nil {
				return nil, nil, err
			}
			return r.Msg.GetMachine(), r.Msg, nil
		}, func(c *cobra.Command) { c.Flags().BoolVar(&burnIn, "burn-in", false, "run the burn-in step") })
	var image, deployProfile string
	deploy := transition("deploy MACHINE --image NAME [--profile NAME]", "Write a signed image to a ready machine and boot it",
		func(cmd *cobra.Command, c machineCaller, t, machine string, m mutation) (*apiv1.Machine, proto.Message, error) {
			r, err := c.Deploy(cmd.Context(), request(&apiv1.DeployMachineRequest{Tenant: t, Machine: machine, Image: image,
				Profile: deployProfile}, m))
			if err != nil {
				return nil, nil, err
			}
			return r.Msg.GetMachine(), r.Msg, nil
		}, func(c *cobra.Command) {
			c.Flags().StringVar(&image, "image", "", "the image (name or id), signed by a key on the tenant's or the platform's allowlist")
			c.Flags().StringVar(&deployProfile, "profile", "", "a deploy profile of the tenant to run instead of the built-in deploy (profiles list)")
		})
	release := transition("release MACHINE", "Wipe a machine; it ends ready",
		func(cmd *cobra.Command, c machineCaller, t, machine string, m mutation) (*apiv1.Machine, proto.Message, error) {
			r, err := c.Release(cmd.Context(), request(&apiv1.ReleaseMachineRequest{Tenant: t, Machine: machine}, m))
			if err != nil {
				return nil, nil, err
			}
			return r.Msg.GetMachine(), r.Msg, nil
		}, nil)
	retire := transition("retire MACHINE", "Take an idle machine out of service for good",
		func(cmd *cobra.Command, c machineCaller, t, machine string, m mutation) (*apiv1.Machine, proto.Message, error) {
			r, err := c.Retire(cmd.Context(), request(&apiv1.RetireMachineRequest{Tenant: t, Machine: machine}, m))
			if err != nil {
				return nil, nil, err
			}
			return r.Msg.GetMachine(), r.Msg, nil
		}, nil)
	var (
		keyFile string
		dur     time.Duration
	)
	rescue := transition("rescue MACHINE --ssh-key-file F [--duration 1h]", "Boot the ramdisk with an SSH key, for at most an hour",
		func(cmd *cobra.Command, c machineCaller, t, machine string, m mutation) (*apiv1.Machine, proto.Message, error) {
			if keyFile == "" {
				return nil, nil, invalidArg("ssh-key-file", "pass --ssh-key-file FILE (an OpenSSH public key, - for stdin)")
			}
			var (
				b   []byte
				err error
			)
			if keyFile == "-" {
				b, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), 16<<10))
			} else {
				b, err = os.ReadFile(keyFile)
			}
			if err != nil {
				return nil, nil, invalidArg("ssh-key-file", err.Error())
			}
			r, err := c.Rescue(cmd.Context(), request(&apiv1.RescueMachineRequest{Tenant: t, Machine: machine,
				SshPublicKey: strings.TrimSpace(string(b)), DurationSeconds: int64(dur / time.Second)}, m))
			if err != nil {
				return nil, nil, err
			}
			return r.Msg.GetMachine(), r.Msg, nil
		}, func(c *cobra.Command) {
			c.Flags().StringVar(&keyFile, "ssh-key-file", "", "an OpenSSH public key file (- for stdin)")
			c.Flags().DurationVar(&dur, "duration", time.Hour, "how long the rescue lasts (at most 1h)")
		})

	power := &cobra.Command{
		Use:   "power MACHINE on|off|cycle|status",
		Short: "Turn an idle machine on or off or cycle it (a one-step workflow), or read its power from the BMC",
		Args:  positional("MACHINE", "ACTION"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			if argv[1] == "status" {
				r, err := c.Machines.GetPowerStatus(cmd.Context(), connect.NewRequest(&apiv1.GetMachinePowerStatusRequest{Tenant: t, Machine: argv[0]}))
				if err != nil {
					return err
				}
				return a.printer(cmd.OutOrStdout()).print(r.Msg, func(w io.Writer) { fmt.Fprintf(w, "%s: power %s\n", argv[0], r.Msg.GetPower()) })
			}
			r, err := c.Machines.Power(cmd.Context(), request(&apiv1.PowerMachineRequest{Tenant: t, Machine: argv[0], Action: argv[1]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printMachine(cmd, r.Msg, r.Msg.GetMachine())
		},
	}
	addTenantFlag(power, &tenant)
	addConfirmationFlag(power, &confirmationID)

	abort := &cobra.Command{
		Use:   "abort MACHINE",
		Short: "Cancel a machine's active workflow; the machine ends failed (a power action's keeps its state)",
		Long: `abort cancels the machine's active workflow. With no step in flight it ends at
once; a step in flight (a BMC call, a wipe) is not taken back halfway, and the
workflow ends when it does. The machine then ends failed, as nothing says what
its disk holds any more: commission or release it to bring it back. An aborted
power action leaves the machine in the state it was in.`,
		Args: positional("MACHINE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			r, err := c.Machines.Abort(cmd.Context(), request(&apiv1.AbortMachineRequest{Tenant: t, Machine: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(r.Msg, func(w io.Writer) {
				machineTable(w, a.siteNames(cmd.Context(), []*apiv1.Machine{r.Msg.GetMachine()}), r.Msg.GetMachine())
				wf := r.Msg.GetWorkflow()
				if wf.GetState() == "cancelled" {
					fmt.Fprintf(w, "\nworkflow %s cancelled\n", wf.GetId())
				} else {
					fmt.Fprintf(w, "\nworkflow %s: cancel requested; it ends when its step in flight does\n", wf.GetId())
				}
			})
		},
	}
	addTenantFlag(abort, &tenant)
	addConfirmationFlag(abort, &confirmationID)

	var wait bool
	rotate := &cobra.Command{
		Use:   "rotate-bmc MACHINE [--wait]",
		Short: "Replace a machine's BMC password with a generated one, current only once the site agent signed that it logs in",
		Long: `rotate-bmc has the control plane generate a new BMC password and seal it as the
machine's pending credential; the site agent sets it on the BMC and logs in with
it, and only its signed success makes it current. The password is never shown.
On any failure the old password stays current and the machine goes into
maintenance with the reason (machines get shows it); a later successful
rotate-bmc ends maintenance. With --wait it waits for the rotation to end and
fails when it did not succeed.`,
		Args: positional("MACHINE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			// Not retried: a second call while the first one's rotation
			// runs is refused as busy, and after it would be a new one.
			resp, err := c.Machines.RotateBMCPassword(cmd.Context(), request(&apiv1.RotateBMCPasswordRequest{Tenant: t, Machine: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			machine := resp.Msg.GetMachine()
			if !wait {
				return a.printMachine(cmd, resp.Msg, machine)
			}
			pending := machine.GetBmcPendingCredentialRef()
			if machine, err = a.waitMachineIdle(cmd.Context(), c, t, machine); err != nil {
				return err
			}
			if err := a.printMachine(cmd, &apiv1.GetMachineResponse{Machine: machine}, machine); err != nil {
				return err
			}
			if machine.GetBmcCredentialRef() != pending {
				return connect.NewError(connect.CodeAborted, fmt.Errorf("BMC password rotation of %s failed; the old password stays current and the machine is in maintenance: %s",
					argv[0], machine.GetMaintenanceReason()))
			}
			return nil
		},
	}
	addTenantFlag(rotate, &tenant)
	addConfirmationFlag(rotate, &confirmationID)
	rotate.Flags().BoolVar(&wait, "wait", false, "wait until the rotation ends; fail unless it succeeded")

	cmd.AddCommand(enroll, list, get, inspect, commission, deploy, release, retire, rescue, power, abort, rotate)
	cmd.AddCommand(a.leaseCommands()...)
	return cmd
}

func (a *app) workflowsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "workflows", Aliases: []string{"workflow"}, Short: "Show machine workflows (steps, attempts, timings, errors); pause, resume, retry or abort one"}
	var (
		tenant, machine, state string
		limit                  int
	)
	list := &cobra.Command{
		Use:   "list [--machine M] [--state S]",
		Short: "List a tenant's machine workflows, oldest first",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.MachineWorkflow, string, error) {
				resp, err := c.Machines.ListWorkflows(ctx, connect.NewRequest(&apiv1.ListMachineWorkflowsRequest{Tenant: t, Machine: machine,
					State: state, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetWorkflows(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(&apiv1.ListMachineWorkflowsResponse{Workflows: all}, func(w io.Writer) {
				row(w, "ID", "MACHINE", "OPERATION", "STATE", "CREATED", "ENDED", "FAILED STEP")
				for _, wf := range all {
					row(w, wf.GetId(), wf.GetMachineId(), wf.GetOperation(), wf.GetState(), ts(wf.GetCreateTime()), ts(wf.GetEndTime()),
						dash(wf.GetFailedStep()))
				}
			})
		},
	}
	addTenantFlag(list, &tenant)
	list.Flags().StringVar(&machine, "machine", "", "only this machine's workflows (name or id)")
	list.Flags().StringVar(&state, "state", "", "only workflows in this state (pending, running, paused, succeeded, failed, cancelled)")
	addLimitFlag(list, &limit)

	get := &cobra.Command{
		Use:   "get WORKFLOW",
		Short: "Show a workflow's steps: state, attempts, timings, error and last logs",
		Args:  positional("WORKFLOW"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			r, err := c.Machines.GetWorkflow(cmd.Context(), connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: t, Workflow: argv[0]}))
			if err != nil {
				return err
			}
			wf := r.Msg.GetWorkflow()
			return a.printer(cmd.OutOrStdout()).print(r.Msg, func(w io.Writer) {
				fmt.Fprintf(w, "workflow %s: %s of machine %s, %s", wf.GetId(), wf.GetOperation(), wf.GetMachineId(), wf.GetState())
				if wf.GetCancelRequested() && wf.GetState() != "cancelled" {
					fmt.Fprint(w, " (cancel requested)")
				}
				fmt.Fprintln(w)
				if wf.GetReason() != "" {
					fmt.Fprintf(w, "failed at %s: %s\n", wf.GetFailedStep(), wf.GetReason())
				}
				fmt.Fprintln(w)
				row(w, "#", "STEP", "KIND", "STATE", "ATTEMPTS", "STARTED", "TOOK", "ERROR")
				for _, s := range wf.GetSteps() {
					took := "-"
					if s.GetStartTime() != nil && s.GetEndTime() != nil {
						took = s.GetEndTime().AsTime().Sub(s.GetStartTime().AsTime()).Round(time.Millisecond).String()
					}
					name := s.GetName()
					if s.GetPhase() == "cleanup" {
						name += " (cleanup)"
					}
					row(w, fmt.Sprint(s.GetIndex()), name, s.GetKind(), s.GetState(), fmt.Sprint(s.GetAttempts()), ts(s.GetStartTime()), took,
						dash(s.GetError()))
				}
				for _, s := range wf.GetSteps() {
					if s.GetLogs() != "" && (s.GetState() == "failed" || s.GetError() != "") {
						fmt.Fprintf(w, "\nlast logs of %s:\n%s\n", s.GetName(), s.GetLogs())
					}
				}
			})
		},
	}
	addTenantFlag(get, &tenant)
	cmd.AddCommand(list, get)
	cmd.AddCommand(a.workflowControlCommands()...)
	return cmd
}

// machineCaller is the machine API as the lifecycle verbs use it.
type machineCaller interface {
	Inspect(context.Context, *connect.Request[apiv1.InspectMachineRequest]) (*connect.Response[apiv1.InspectMachineResponse], error)
	Commission(context.Context, *connect.Request[apiv1.CommissionMachineRequest]) (*connect.Response[apiv1.CommissionMachineResponse], error)
	Deploy(context.Context, *connect.Request[apiv1.DeployMachineRequest]) (*connect.Response[apiv1.DeployMachineResponse], error)
	Release(context.Context, *connect.Request[apiv1.ReleaseMachineRequest]) (*connect.Response[apiv1.ReleaseMachineResponse], error)
	Retire(context.Context, *connect.Request[apiv1.RetireMachineRequest]) (*connect.Response[apiv1.RetireMachineResponse], error)
	Rescue(context.Context, *connect.Request[apiv1.RescueMachineRequest]) (*connect.Response[apiv1.RescueMachineResponse], error)
}

// machineTable prints machines; sites maps site ids to names (siteNames).
func machineTable(w io.Writer, sites map[string]string, items ...*apiv1.Machine) {
	row(w, "ID", "NAME", "SITE", "STATE", "BMC", "MAC", "IMAGE", "WORKFLOW")
	for _, m := range items {
		row(w, m.GetId(), m.GetName(), cmpOr(sites[m.GetSiteId()], m.GetSiteId()), m.GetState(), m.GetBmcDriver()+" "+m.GetBmcAddress(), m.GetMac(),
			dash(m.GetImageName()), dash(m.GetWorkflowId()))
	}
}

// waitTransition waits for a lifecycle verb's workflow to end, printing
// the machine's steps to stderr as they start, and fails (ABORTED) when
// the machine ends failed.
func (a *app) waitTransition(cmd *cobra.Command, c *client.Client, tenant string, m *apiv1.Machine, d time.Duration) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), d)
	defer cancel()
	wf, op := m.GetWorkflowId(), m.GetOperation()
	errw := cmd.ErrOrStderr()
	fmt.Fprintf(errw, "%s %s: workflow %s\n", op, m.GetName(), wf)
	seen := map[string]bool{}
	progress := func() {
		resp, err := c.Machines.GetWorkflow(ctx, connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: tenant, Workflow: wf}))
		if err != nil {
			return // progress is best effort; the wait itself reports errors
		}
		for _, st := range resp.Msg.GetWorkflow().GetSteps() {
			key := st.GetName() + "/" + st.GetState()
			if st.GetState() == "pending" || seen[key] {
				continue
			}
			seen[key] = true
			fmt.Fprintf(errw, "  %-14s %s\n", st.GetName(), st.GetState())
		}
	}
	poll := 5 * a.retryBackoff
	for m.GetWorkflowId() != "" {
		progress()
		select {
		case <-ctx.Done():
			if cmd.Context().Err() != nil {
				return connect.NewError(connect.CodeCanceled, fmt.Errorf("stopped waiting for %s of machine %s (workflow %s)", op, m.GetName(), wf))
			}
			return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("%s of machine %s still running after %s: workflows get %s", op, m.GetName(), d, wf))
		case <-time.After(poll):
		}
		resp, err := c.Machines.Get(ctx, connect.NewRequest(&apiv1.GetMachineRequest{Tenant: tenant, Machine: m.GetId()}))
		if err != nil {
			return err
		}
		m = resp.Msg.GetMachine()
	}
	progress()
	if err := a.printMachine(cmd, &apiv1.GetMachineResponse{Machine: m}, m); err != nil {
		return err
	}
	if m.GetState() == "failed" {
		return connect.NewError(connect.CodeAborted, fmt.Errorf("%s of machine %s failed at step %s: %s", op, m.GetName(), m.GetFailedStep(), m.GetFailureReason()))
	}
	return nil
}

// waitMachineIdle polls a machine until its workflow ended.
func (a *app) waitMachineIdle(ctx context.Context, c *client.Client, tenant string, m *apiv1.Machine) (*apiv1.Machine, error) {
	// Five backoffs: one second by default, a few milliseconds in tests.
	poll := 5 * a.retryBackoff
	for m.GetWorkflowId() != "" {
		select {
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeCanceled, fmt.Errorf("stopped waiting for machine %s's workflow %s", m.GetName(), m.GetWorkflowId()))
		case <-time.After(poll):
		}
		resp, err := c.Machines.Get(ctx, connect.NewRequest(&apiv1.GetMachineRequest{Tenant: tenant, Machine: m.GetId()}))
		if err != nil {
			return nil, err
		}
		m = resp.Msg.GetMachine()
	}
	return m, nil
}

func (a *app) printMachine(cmd *cobra.Command, msg proto.Message, m *apiv1.Machine) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		machineTable(w, a.siteNames(cmd.Context(), []*apiv1.Machine{m}), m)
		if id := m.GetLeaseId(); id != "" {
			fmt.Fprintf(w, "\nunder dedicated-root lease %s (machines lease-get %s)\n", id, id)
		}
		if ref := m.GetBmcPendingCredentialRef(); ref != "" {
			fmt.Fprintf(w, "\nBMC password rotation: %s pending (current %s)\n", ref, m.GetBmcCredentialRef())
		}
		if reason := m.GetMaintenanceReason(); reason != "" {
			fmt.Fprintf(w, "\nin maintenance since %s: %s\n", ts(m.GetMaintenanceTime()), reason)
		}
		if m.GetState() == "failed" {
			fmt.Fprintf(w, "\nfailed: %s, step %s: %s\n", m.GetFailedOperation(), m.GetFailedStep(), m.GetFailureReason())
			if logs := m.GetFailureLogs(); logs != "" {
				fmt.Fprintf(w, "last logs:\n%s\n", logs)
			}
		}
		if exp := m.GetRescueExpireTime(); exp != nil {
			fmt.Fprintf(w, "\nrescue until %s\n", ts(exp))
		}
		if drives := m.GetEraseRecord().GetFields()["drives"].GetListValue().GetValues(); len(drives) > 0 {
			rec := m.GetEraseRecord().GetFields()
			fmt.Fprintf(w, "\nlast wipe (attested=%v, signed by the ramdisk at %s):\n", rec["attested"].GetBoolValue(), rec["time"].GetStringValue())
			for _, d := range drives {
				f := d.GetStructValue().GetFields()
				v := f["verification"].GetStructValue().GetFields()
				fmt.Fprintf(w, "  %s  %s  %.0f bytes  %.0f ms  read-back %.0f blocks zero=%v\n", f["device"].GetStringValue(),
					f["method"].GetStringValue(), f["bytes"].GetNumberValue(), f["duration_ms"].GetNumberValue(),
					v["samples"].GetNumberValue(), v["zero"].GetBoolValue())
			}
		}
	})
}

// siteTokensCommand mints site tokens: join tokens of role site bound to
// one site, for `bcd --mode site`. They are listed and revoked with
// join-tokens.
func (a *app) siteTokensCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "site-tokens", Aliases: []string{"site-token"},
		Short: "Mint the tokens site agents (bcd --mode site) join a site with"}
	var (
		tenant, project, site, confirmationID string
		ttl                                   time.Duration
	)
	create := &cobra.Command{
		Use:   "create --tenant T --project P --site S",
		Short: "Create a site token and print it once",
		Long: `Create a site token: a join token of role site bound to one site. The bcd
that joins with it (bcd --mode site) acts for that site only, and holds its
boot lease while connected. The token is printed once and never again;
list and revoke it with join-tokens.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case site == "":
				return invalidArg("site", "required: pass --site")
			case project == "":
				return invalidArg("project", "required: pass --project (where the site agent's node is listed)")
			case ttl < 0:
				return invalidArg("ttl", "must not be negative")
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateJoinTokenResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.JoinTokens.Create(cmd.Context(), request(&apiv1.CreateJoinTokenRequest{
					Tenant: t, Project: project, TtlSeconds: int64(ttl / time.Second), Role: "site", Site: site,
				}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				joinTokenTable(w, resp.Msg.GetJoinToken())
				fmt.Fprintf(w, "\ntoken: %s  (shown once; store it now)\n", resp.Msg.GetToken())
			})
		},
	}
	addTenantFlag(create, &tenant)
	create.Flags().StringVar(&project, "project", "", "project the site agent's node is listed in (name or id)")
	create.Flags().StringVar(&site, "site", "", "site the agent acts for (name or id)")
	create.Flags().DurationVar(&ttl, "ttl", 0, "lifetime, e.g. 1h (default 1h, at most 168h)")
	addConfirmationFlag(create, &confirmationID)
	cmd.AddCommand(create)
	return cmd
}

// siteNames looks up the names of the machines' sites, best effort (a
// site the caller may not read prints as its id).
func (a *app) siteNames(ctx context.Context, items []*apiv1.Machine) map[string]string {
	out := map[string]string{}
	c, err := a.client()
	if err != nil {
		return out
	}
	for _, m := range items {
		id := m.GetSiteId()
		if _, done := out[id]; done || id == "" {
			continue
		}
		out[id] = ""
		if s, err := c.Sites.Get(ctx, connect.NewRequest(&apiv1.GetSiteRequest{Tenant: m.GetTenantId(), Site: id})); err == nil {
			out[id] = s.Msg.GetSite().GetName()
		}
	}
	return out
}
