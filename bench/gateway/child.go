package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	rpprof "runtime/pprof"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/internal/app"
)

// The child is the control plane under test: api, worker and gateway roles
// on SQLite in the state dir, as `better-compute serve` runs them.
const (
	childEnv     = "BC_BENCH_CHILD"
	childAPI     = "BC_BENCH_API"
	childGateway = "BC_BENCH_GATEWAY"
	childState   = "BC_BENCH_STATE"
	childSecret  = "BC_BENCH_SECRET"
	childBeat    = "BC_BENCH_HEARTBEAT"
	// childPprof, when set, is the loopback address the child serves
	// net/http/pprof on, for -profile.
	childPprof = "BC_BENCH_PPROF"
	// childCPUProfile, when set, is a file the child writes a CPU profile
	// of its whole life into (the restarted child of -profile: its start
	// and the reconnect storm).
	childCPUProfile = "BC_BENCH_CPUPROFILE"
	// childHandshake, when set, is the gateway's handshake timeout.
	childHandshake = "BC_BENCH_HANDSHAKE_TIMEOUT"
	adminKeyFile   = "admin.key"
	readyFileName  = "ready"
)

func runChild() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	state := os.Getenv(childState)
	if path := os.Getenv(childCPUProfile); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := rpprof.StartCPUProfile(f); err != nil {
			return err
		}
		// Deferred first, so it runs last, after the control plane closed.
		defer func() { rpprof.StopCPUProfile(); _ = f.Close() }()
	}
	if addr := os.Getenv(childPprof); addr != "" {
		// Sample every 4 KiB, not every 512 KiB: per-session structures are
		// a few KiB each and the default rate would hide most of them.
		runtime.MemProfileRate = 4 << 10
		if err := servePprof(addr); err != nil {
			return err
		}
	}
	beat, err := time.ParseDuration(os.Getenv(childBeat))
	if err != nil {
		return err
	}
	var handshake time.Duration
	if v := os.Getenv(childHandshake); v != "" {
		if handshake, err = time.ParseDuration(v); err != nil {
			return err
		}
	}
	a, err := app.New(ctx, app.Config{
		Roles:                   []string{app.RoleAPI, app.RoleWorker, app.RoleGateway},
		Listen:                  os.Getenv(childAPI),
		GatewayListen:           os.Getenv(childGateway),
		StateDir:                state,
		Secret:                  os.Getenv(childSecret),
		HeartbeatInterval:       beat,
		GatewayHandshakeTimeout: handshake,
		// Liveness follows the beat (the defaults' ratios: 3 and 30 beats),
		// so a slow -heartbeat is accepted and no session is judged lost
		// while it is held.
		UnreachableAfter: max(30*time.Second, 3*beat),
		LostAfter:        max(5*time.Minute, 30*beat),
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }()
	if _, _, err := a.Bootstrap(ctx, func(secret string) error {
		return os.WriteFile(filepath.Join(state, adminKeyFile), []byte(secret), 0o600)
	}); err != nil {
		return err
	}
	ln, err := a.Listen()
	if err != nil {
		return err
	}
	if _, err := a.ListenGateway(); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(state, readyFileName), []byte("ok"), 0o600); err != nil {
		return err
	}
	if err := a.Run(ctx, ln); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// servePprof serves the profiles on a loopback address of their own, apart
// from the API's mux, so profiling never reaches the code under test.
func servePprof(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("pprof listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	go func() { _ = http.Serve(ln, mux) }() //nolint:gosec // loopback, benchmark only
	return nil
}
