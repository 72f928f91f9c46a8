package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// exitCodeError ends the CLI with a process's exit code, printing nothing
// more: the process said what it had to.
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Exit codes of `reservations exec` beyond the process's own.
const (
	// exitInterrupted: the exec was interrupted here (Ctrl-C), as a shell
	// reports SIGINT.
	exitInterrupted = 130
	// exitSignalBase plus the signal's number: the process was killed by
	// a signal, as a shell reports it.
	exitSignalBase = 128
)

func (a *app) reservationExecCommand() *cobra.Command {
	var (
		tenant, confirmationID string
		gpuEnv                 bool
	)
	cmd := &cobra.Command{
		Use:   "exec ID [--gpu-env] -- CMD [ARGS...]",
		Short: "Run a process in an active reservation's cgroup on its node",
		Long: `Run CMD with ARGS on the reservation's node, inside its cgroup, and stream its
stdout and stderr here as it runs. The CLI exits with the process's exit
code (128+N when signal N killed it). Ctrl-C ends the call and the node
kills the process's whole process group (exit 130).

The process gets a clean environment: PATH, HOME=/, LANG=C.UTF-8,
BC_ALLOCATION_ID, and (with --gpu-env, the default) NVIDIA_VISIBLE_DEVICES
and CUDA_VISIBLE_DEVICES set to the reserved GPUs' indexes in PCI bus order
(CUDA_DEVICE_ORDER=PCI_BUS_ID), as nvidia-smi numbers them.

Output is capped at 1 MiB/s and 64 MiB in all; beyond that it is dropped
and the CLI says how many bytes were. The command line is at most 1,024
arguments and 64 KiB, and is kept (quoted, first 1 KiB) in the audit log.`,
		Args: func(cmd *cobra.Command, argv []string) error {
			switch dash := cmd.ArgsLenAtDash(); {
			case len(argv) == 0:
				return usagef("invalid ID: required")
			case dash < 0:
				return usagef("give the command after --, e.g. exec %s -- nvidia-smi", argv[0])
			case dash != 1:
				return usagef("exactly one reservation ID goes before --")
			case len(argv) == 1:
				return usagef("invalid command: required after --")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			// No retry: a repeated exec would run the process twice.
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			stream, err := c.Reservations.Exec(ctx, request(&apiv1.ExecReservationRequest{
				Tenant: t, Reservation: argv[0], Argv: argv[1:], OmitGpuEnv: !gpuEnv,
			}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			defer func() { _ = stream.Close() }()
			return execStream(cmd.Context(), stream, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	addTenantFlag(cmd, &tenant)
	addConfirmationFlag(cmd, &confirmationID)
	cmd.Flags().BoolVar(&gpuEnv, "gpu-env", true, "set NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES to the reserved GPUs (--gpu-env=false leaves them unset)")
	return cmd
}

// execStream copies an exec's output to stdout and stderr as it comes and
// turns its exit into the CLI's.
func execStream(ctx context.Context, stream *connect.ServerStreamForClient[apiv1.ExecReservationResponse], stdout, stderr io.Writer) error {
	for stream.Receive() {
		m := stream.Msg()
		switch ev := m.GetEvent().(type) {
		case *apiv1.ExecReservationResponse_Output:
			w := stdout
			if ev.Output.GetStream() == "stderr" {
				w = stderr
			}
			if _, err := w.Write(ev.Output.GetData()); err != nil {
				return err
			}
		case *apiv1.ExecReservationResponse_Exit:
			return execExit(ev.Exit, stderr)
		}
	}
	err := stream.Err()
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "interrupted: the process group is being killed on the node")
		return &exitCodeError{code: exitInterrupted}
	}
	if err == nil {
		return connect.NewError(connect.CodeUnavailable, errors.New("the exec stream ended before the process's exit: its outcome is unknown (see `commands get`)"))
	}
	return err
}

func execExit(e *apiv1.ExecExit, stderr io.Writer) error {
	if d := e.GetDroppedBytes(); d > 0 {
		fmt.Fprintf(stderr, "note: %d bytes of output were dropped (caps: 1 MiB/s, 64 MiB in all)\n", d)
	}
	if !e.GetCgroupEntered() && e.GetCgroupNote() != "" {
		fmt.Fprintf(stderr, "note: %s\n", e.GetCgroupNote())
	}
	switch e.GetState() {
	case "succeeded":
		if sig := e.GetSignal(); sig != "" {
			fmt.Fprintf(stderr, "killed by %s\n", sig)
			if n := unix.SignalNum(sig); n > 0 {
				return &exitCodeError{code: exitSignalBase + int(n)}
			}
			return &exitCodeError{code: exitSignalBase}
		}
		if code := e.GetExitCode(); code != 0 {
			return &exitCodeError{code: int(code)}
		}
		return nil
	case "canceled":
		fmt.Fprintf(stderr, "canceled: %s\n", e.GetMessage())
		return &exitCodeError{code: exitInterrupted}
	}
	msg := e.GetMessage()
	if e.GetFailureCode() != "" {
		msg = e.GetFailureCode() + ": " + msg
	}
	return connect.NewError(connect.CodeAborted, fmt.Errorf("the process did not run to its end (%s): %s", e.GetState(), msg))
}
