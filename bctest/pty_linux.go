package bctest

import (
	"fmt"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// OpenPTY opens a pseudo-terminal pair of cols x rows, closed when the
// test ends: a test drives the terminal end (master) as a user's
// terminal emulator would, and hands the other (the tty) to the code
// under test as its stdin.
func OpenPTY(t testing.TB, cols, rows int) (master, tty *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	var n int
	if err := control(m, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock: %w", err)
		}
		n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN)
		return err
	}); err != nil {
		t.Fatalf("pty: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open the tty: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	SetPTYSize(t, m, cols, rows)
	return m, s
}

// SetPTYSize resizes the terminal f (either end) as a window resize does.
func SetPTYSize(t testing.TB, f *os.File, cols, rows int) {
	t.Helper()
	if err := control(f, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(cols), Row: uint16(rows)})
	}); err != nil {
		t.Fatalf("set the terminal size: %v", err)
	}
}

// control runs fn on f's descriptor without switching f to blocking mode
// (as Fd would), so closing f still ends a read in progress.
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
