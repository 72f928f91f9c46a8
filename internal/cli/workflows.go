package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// workflowControlCommands are the verbs that change a workflow: pause,
// resume, retry --from STEP and abort. Each prints the machine and the
// workflow as the API answers them.
func (a *app) workflowControlCommands() []*cobra.Command {
	var (
		tenant, confirmationID, from string
	)
	type answer interface {
		proto.Message
		GetMachine() *apiv1.Machine
		GetWorkflow() *apiv1.MachineWorkflow
	}
	show := func(cmd *cobra.Command, msg answer, what string) error {
		return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
			machineTable(w, a.siteNames(cmd.Context(), []*apiv1.Machine{msg.GetMachine()}), msg.GetMachine())
			wf := msg.GetWorkflow()
			fmt.Fprintf(w, "\nworkflow %s (%s): %s, %s\n", wf.GetId(), wf.GetOperation(), what, wf.GetState())
		})
	}

	pause := &cobra.Command{
		Use:   "pause WORKFLOW",
		Short: "Pause a workflow: its step in flight ends and is recorded, the next one waits",
		Long: `pause stops a machine's workflow from starting its next step. The step in
flight (a BMC call, a wipe) is not taken back: it ends and its result is
recorded. While paused, no deadline fails the workflow, and the machine stays in
its -ing state. Resume it, retry it from a step, or abort it.`,
		Args: positional("WORKFLOW"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			r, err := c.Machines.PauseWorkflow(cmd.Context(), request(&apiv1.PauseMachineWorkflowRequest{Tenant: t, Workflow: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return show(cmd, r.Msg, "paused")
		},
	}
	resume := &cobra.Command{
		Use:   "resume WORKFLOW",
		Short: "Resume a paused workflow with its next step",
		Args:  positional("WORKFLOW"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			r, err := c.Machines.ResumeWorkflow(cmd.Context(), request(&apiv1.ResumeMachineWorkflowRequest{Tenant: t, Workflow: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return show(cmd, r.Msg, "resumed")
		},
	}
	retry := &cobra.Command{
		Use:   "retry WORKFLOW --from STEP",
		Short: "Restart a failed or paused workflow at a step; the steps before keep their results",
		Long: `retry restarts a failed or paused workflow at the step --from names (workflows
get lists them): that step and every one after it run again, each with a fresh
retry budget and new idempotency keys; the steps before it are not run again. A
failed machine goes back to the operation's -ing state. A workflow that
succeeded or was cancelled is not retried: start the operation anew. After a
failure the machine's ramdisk is gone, so a step that runs in it is retried from
the ramdisk boot before it.`,
		Args: positional("WORKFLOW"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			r, err := c.Machines.RetryWorkflow(cmd.Context(), request(&apiv1.RetryMachineWorkflowRequest{Tenant: t, Workflow: argv[0],
				FromStep: from}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return show(cmd, r.Msg, "retried from "+from)
		},
	}
	retry.Flags().StringVar(&from, "from", "", "the step to restart at (required)")
	abort := &cobra.Command{
		Use:   "abort WORKFLOW",
		Short: "Cancel a machine's active workflow by its id: machines abort, for that workflow only",
		Long: `abort is machines abort addressed by the workflow: it cancels the workflow only
while it is its machine's active one. A step in flight is not taken back
halfway; the workflow ends when it does, and the machine ends failed (a power
action's keeps its state).`,
		Args: positional("WORKFLOW"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			r, err := c.Machines.AbortWorkflow(cmd.Context(), request(&apiv1.AbortMachineWorkflowRequest{Tenant: t, Workflow: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			what := "cancel requested; it ends when its step in flight does"
			if r.Msg.GetWorkflow().GetState() == "cancelled" {
				what = "aborted"
			}
			return show(cmd, r.Msg, what)
		},
	}
	cmds := []*cobra.Command{pause, resume, retry, abort}
	for _, c := range cmds {
		addTenantFlag(c, &tenant)
		addConfirmationFlag(c, &confirmationID)
	}
	return cmds
}
