package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/spf13/cobra"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/sshca"
	"github.com/better-compute/better-compute/internal/sshexec"
)

// guestExecArgs checks `NAME [-- CMD [ARGS...]]`: with no command, -it
// (or, where implied, a terminal on stdin) makes it a login shell.
func guestExecArgs(noun, example string, f *shellFlags, implied bool) cobra.PositionalArgs {
	return func(cmd *cobra.Command, argv []string) error {
		switch dash := cmd.ArgsLenAtDash(); {
		case len(argv) == 0:
			return usagef("invalid %s: required", noun)
		case dash < 0 && len(argv) == 1 && (implied || f.interactive && f.tty):
			return nil
		case dash < 0:
			return usagef("give the command after --, e.g. %s %s -- %s, or -it for a login shell", cmd.Name(), argv[0], example)
		case dash != 1:
			return usagef("exactly one %s goes before --", noun)
		case len(argv) == 1:
			return usagef("invalid command: required after --")
		}
		return nil
	}
}

// guestExecResult is `-o json` of instances ssh and sandboxes exec.
type guestExecResult struct {
	ExitCode        int    `json:"exitCode"`
	HostCertificate string `json:"hostCertificate"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	Error           string `json:"error,omitempty"`
}

// tlsConfig is the TLS configuration the API client uses, for the tunnel
// that dials the API itself.
func (a *app) tlsConfig() *tls.Config {
	if a.httpClient != nil {
		if t, ok := a.httpClient.Transport.(*http.Transport); ok && t.TLSClientConfig != nil {
			return t.TLSClientConfig
		}
	}
	return nil
}

// runGuestCommand gets a ticket with a fresh key (ticket is the API call),
// then runs argv (none: the login shell) through the tunnel: output
// streams here (or is gathered for -o json), stdin goes with -i, a pty
// with -t, and the CLI exits with the remote exit code.
func (a *app) runGuestCommand(cmd *cobra.Command, argv []string, f shellFlags, implied bool,
	ticket func(ctx context.Context, publicKey string) (*apiv1.SshTicket, error)) error {
	ctx := cmd.Context()
	sess, err := a.newGuestSession(cmd, f, argv, implied)
	if err != nil {
		return err
	}
	key, err := sshexec.NewKey()
	if err != nil {
		return err
	}
	c, err := a.context()
	if err != nil {
		return err
	}
	server := a.setting("server", envServer, c.Server)
	t, err := ticket(ctx, key.AuthorizedKey)
	if err != nil {
		return a.reportRefusal(cmd.ErrOrStderr(), err)
	}
	jsonOut := a.flagOutput == "json"
	var outBuf, errBuf bytes.Buffer
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if jsonOut {
		stdout, stderr = &outBuf, &errBuf
	}
	var command string
	if len(argv) > 0 {
		command = shellJoin(argv)
	}
	stop, err := sess.start(ctx)
	if err != nil {
		return err
	}
	defer stop() // a panic too
	res, runErr := sshexec.Run(ctx, sshexec.Params{APIURL: server, TLS: a.tlsConfig(), Ticket: t, Key: key,
		Command: command, Stdin: sess.stdin, Pty: sess.pty, Stdout: stdout, Stderr: stderr})
	// The terminal is back to normal before anything below prints.
	stop()
	status := sshca.HostCertNone
	code := 0
	if res != nil {
		status, code = res.HostCert, res.ExitCode
	}
	if jsonOut {
		out := guestExecResult{ExitCode: code, HostCertificate: string(status), Stdout: outBuf.String(), Stderr: errBuf.String()}
		if runErr != nil {
			out.Error = runErr.Error()
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		if _, err := fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b); err != nil {
			return err
		}
	}
	switch {
	case errors.Is(runErr, sshca.ErrHostNotPinned):
		return fmt.Errorf("refusing the guest (hostCertificate: %s): %w", status, runErr)
	case runErr != nil:
		return runErr
	case code != 0:
		return &exitCodeError{code: code}
	}
	return nil
}

// shellJoin quotes argv for the guest's shell (sshd runs the command line
// with the account's shell), so each argument arrives as given.
func shellJoin(argv []string) string {
	if len(argv) == 1 {
		// One argument is a command line of its own: "ls -l | wc -l".
		return argv[0]
	}
	q := make([]string, len(argv))
	for i, s := range argv {
		if s != "" && strings.IndexFunc(s, func(r rune) bool {
			return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && !strings.ContainsRune("-_./=:,+@%", r)
		}) < 0 {
			q[i] = s
			continue
		}
		q[i] = "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
