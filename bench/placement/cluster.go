package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cluster is a throw-away PostgreSQL server: its own data directory in a
// temp dir, on a free loopback port, with durable commits (fsync and
// synchronous_commit on), so the figures are those of a production setting.
type cluster struct {
	bin  string // directory of initdb, pg_ctl, postgres
	dir  string // temp dir: data/, the log and the socket
	port int
	// runAs prefixes every server command: PostgreSQL refuses to run as
	// root, so as root it runs as the postgres user.
	runAs []string
	// Settings is every -c the server was started with, in order.
	Settings []string
	URL      string
}

// pgBinDir finds the newest PostgreSQL install's bin directory (Debian lays
// them out as /usr/lib/postgresql/<major>/bin), or the one initdb on PATH is
// in.
func pgBinDir() (string, error) {
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	slices.SortFunc(found, func(a, b string) int {
		return majorOf(a) - majorOf(b)
	})
	if len(found) > 0 {
		return filepath.Dir(found[len(found)-1]), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no PostgreSQL server binaries: neither /usr/lib/postgresql/*/bin/initdb nor initdb on PATH (install postgresql, or pass -postgres-url)")
}

// majorOf is the major version in /usr/lib/postgresql/<major>/bin/initdb.
func majorOf(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

// clusterSettings are the server settings of a benchmark run. Durability is
// on (fsync, synchronous_commit, full_page_writes: the defaults, stated so
// that no postgresql.conf can turn them off); max_connections leaves room
// for maxConns clients and the reserved superuser slots.
func clusterSettings(maxConns int) []string {
	return []string{
		"fsync=on",
		"synchronous_commit=on",
		"full_page_writes=on",
		"max_connections=" + strconv.Itoa(maxConns),
		// The earlier figures ran with 512MB; the default 128MB would make
		// a 1,000,000-booking history spill.
		"shared_buffers=512MB",
	}
}

// startCluster runs initdb into a new temp dir and starts the server on a
// free loopback port. On error nothing is left behind. stop must be called
// (the caller defers it before anything can fail).
func startCluster(ctx context.Context, maxConns int, logf func(string, ...any)) (c *cluster, err error) {
	bin, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	c = &cluster{bin: bin, Settings: clusterSettings(maxConns)}
	var uid, gid = -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root: the throw-away cluster runs as the postgres user, which does not exist (%w); run as another user or pass -postgres-url", err)
		}
		runuser, err := exec.LookPath("runuser")
		if err != nil {
			return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root: the throw-away cluster runs as the postgres user through runuser, which is not on PATH (%w); run as another user or pass -postgres-url", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		c.runAs = []string{runuser, "-u", "postgres", "--"}
	}
	if c.dir, err = os.MkdirTemp("", "bc-bench-pg-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.stop())
		}
	}()
	if uid >= 0 {
		if err := os.Chown(c.dir, uid, gid); err != nil {
			return nil, fmt.Errorf("give %s to the postgres user: %w", c.dir, err)
		}
	}
	data := filepath.Join(c.dir, "data")
	// --no-sync only skips initdb's own flush of the template files; the
	// server below runs with fsync on.
	if out, err := c.command(ctx, "initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, lastLines(out, 10))
	}
	if c.port, err = freePort(); err != nil {
		return nil, err
	}
	opts := []string{"-p", strconv.Itoa(c.port), "-k", c.dir, "-c", "listen_addresses=127.0.0.1"}
	for _, s := range c.Settings {
		opts = append(opts, "-c", s)
	}
	start := c.command(ctx, "pg_ctl", "start", "-D", data, "-w", "-t", "120", "-l", filepath.Join(c.dir, "log"),
		"-o", strings.Join(opts, " "))
	if out, err := start.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		return nil, fmt.Errorf("pg_ctl start: %w: %s\nserver log: %s", err, lastLines(out, 5), lastLines(log, 20))
	}
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
	logf("throw-away PostgreSQL (%s) on port %d in %s: %s", bin, c.port, c.dir, strings.Join(c.Settings, " "))
	return c, nil
}

// command runs a PostgreSQL program, as the postgres user when root. It is
// put in its own process group, so a Ctrl-C at the terminal reaches only the
// harness, which then stops the server in order.
func (c *cluster) command(ctx context.Context, prog string, args ...string) *exec.Cmd {
	argv := append(slices.Clone(c.runAs), filepath.Join(c.bin, prog))
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The postgres user cannot enter root's working directory.
	cmd.Dir = c.dir
	return cmd
}

// stop stops the server (fast shutdown: connections are ended, nothing is
// left to recover) and removes its directory. It runs on a context of its
// own, so it also works after the run's context was cancelled (Ctrl-C).
// Stopping twice is harmless.
func (c *cluster) stop() error {
	if c == nil || c.dir == "" {
		return nil
	}
	var errs []error
	data := filepath.Join(c.dir, "data")
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, err := c.command(ctx, "pg_ctl", "stop", "-D", data, "-m", "fast", "-w", "-t", "60").CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("pg_ctl stop: %w: %s", err, lastLines(out, 5)))
		}
	}
	if len(errs) == 0 {
		// A server that did not stop keeps its directory, to be looked at.
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, err)
		}
		c.dir = ""
	}
	return errors.Join(errs...)
}

// freePort is a loopback TCP port nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lastLines is the last n lines of out, for error messages.
func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(bytes.ToValidUTF8(out, nil))), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
