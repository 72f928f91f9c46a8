package cli

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/better-compute/better-compute/internal/sshca"
)

// shellFlags are -i and -t of instances ssh and sandboxes exec, as docker
// and kubectl have them.
type shellFlags struct{ interactive, tty bool }

func (f *shellFlags) add(cmd *cobra.Command) {
	cmd.Flags().BoolVarP(&f.interactive, "interactive", "i", false, "forward stdin to the guest (with -t, the keys typed here)")
	cmd.Flags().BoolVarP(&f.tty, "tty", "t", false, "run on a terminal in the guest, of this terminal's $TERM and size (stdin must be a terminal)")
}

// errNotATerminal refuses -t when there is no terminal to drive it.
var errNotATerminal = usagef("unable to use a TTY: input is not a terminal (drop -t, or run from a terminal)")

// localTerminal is the terminal on the CLI's stdin.
type localTerminal struct {
	fd   int
	term string
}

// stdinTerminal returns the terminal stdin is, or false. The descriptor
// comes through SyscallConn, which (unlike Fd) leaves the file's mode as
// it is.
func stdinTerminal(cmd *cobra.Command) (localTerminal, bool) {
	f, ok := cmd.InOrStdin().(*os.File)
	if !ok {
		return localTerminal{}, false
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return localTerminal{}, false
	}
	fd := -1
	if rc.Control(func(u uintptr) { fd = int(u) }) != nil || fd < 0 || !term.IsTerminal(fd) {
		return localTerminal{}, false
	}
	return localTerminal{fd: fd}, true
}

// size is the terminal's size, or 80x24 when it does not say.
func (t localTerminal) size() sshca.WindowSize {
	w, h, err := term.GetSize(t.fd)
	if err != nil || w <= 0 || h <= 0 {
		return sshca.WindowSize{Width: 80, Height: 24}
	}
	return sshca.WindowSize{Width: w, Height: h}
}

// guestSession is how one guest session uses the local terminal.
type guestSession struct {
	stdin io.Reader
	pty   *sshca.Pty
	tty   localTerminal
	raw   bool
}

// newGuestSession checks the flags against stdin before any API call, so
// a refusal costs no ticket. implied: a command with no CMD that means a
// login shell when stdin is a terminal (instances ssh).
func (a *app) newGuestSession(cmd *cobra.Command, f shellFlags, argv []string, implied bool) (*guestSession, error) {
	if len(argv) == 0 && (!f.interactive || !f.tty) {
		if _, ok := stdinTerminal(cmd); !implied || !ok {
			return nil, usagef("no command and stdin is not a terminal: give the command after -- (e.g. -- uname -a), or run from a terminal for a login shell")
		}
		f.interactive, f.tty = true, true
	}
	s := &guestSession{}
	if f.interactive {
		s.stdin = cmd.InOrStdin()
	}
	if !f.tty {
		return s, nil
	}
	if a.flagOutput == "json" {
		return nil, invalidArg("output", "json gathers the output, which a terminal session does not have: drop -t or -o json")
	}
	t, ok := stdinTerminal(cmd)
	if !ok {
		return nil, errNotATerminal
	}
	t.term, _ = a.lookupEnv("TERM")
	sz := t.size()
	s.tty, s.raw = t, f.interactive
	s.pty = &sshca.Pty{Term: t.term, Width: sz.Width, Height: sz.Height}
	return s, nil
}

// start puts the local terminal in raw mode (the guest's pty does the
// echo and line editing, and Ctrl-C goes to the guest as a byte) and
// forwards its size changes. The returned stop restores the terminal; the
// caller defers it, so an error, a panic or SIGINT/SIGTERM (which cancel
// the CLI's context and so end the session) all restore it; it may be
// called more than once.
func (s *guestSession) start(ctx context.Context) (stop func(), err error) {
	if s.pty == nil {
		return func() {}, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	sizes := make(chan sshca.WindowSize, 1)
	s.pty.Resize = sizes
	watchResize(ctx, s.tty, sizes)
	if !s.raw {
		return cancel, nil
	}
	old, err := term.MakeRaw(s.tty.fd)
	if err != nil {
		cancel()
		return nil, errors.Join(errors.New("put the terminal in raw mode"), err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			_ = term.Restore(s.tty.fd, old)
		})
	}, nil
}

// sendLatest offers a size, replacing one the session has not taken yet:
// only the last size matters.
func sendLatest(ch chan sshca.WindowSize, ws sshca.WindowSize) {
	for {
		select {
		case ch <- ws:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}
