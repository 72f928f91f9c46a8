package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/pki"
)

const (
	apiAddr     = "127.0.0.1:18580"
	gatewayAddr = "127.0.0.1:18543"
	pprofAddr   = "127.0.0.1:18590"
)

type child struct {
	cmd  *exec.Cmd
	done chan error
}

// startChild starts the control plane and waits until it is ready.
// cpuProfile, when not empty, is a file the child writes a CPU profile of
// its whole life into.
func startChild(o options, secret, cpuProfile string) (*child, error) {
	_ = os.Remove(filepath.Join(o.stateDir, readyFileName))
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), childEnv+"=1", childAPI+"="+apiAddr, childGateway+"="+gatewayAddr,
		childState+"="+o.stateDir, childSecret+"="+secret, childBeat+"="+o.heartbeat.String())
	if o.profileDir != "" {
		cmd.Env = append(cmd.Env, childPprof+"="+pprofAddr)
	}
	if cpuProfile != "" {
		cmd.Env = append(cmd.Env, childCPUProfile+"="+cpuProfile)
	}
	if o.handshake > 0 {
		cmd.Env = append(cmd.Env, childHandshake+"="+o.handshake.String())
	}
	if o.gogc != "" {
		cmd.Env = append(cmd.Env, "GOGC="+o.gogc)
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, done: make(chan error, 1)}
	go func() { c.done <- cmd.Wait() }()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := os.Stat(filepath.Join(o.stateDir, readyFileName)); err == nil {
			return c, nil
		}
		select {
		case err := <-c.done:
			return nil, fmt.Errorf("control plane exited: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return nil, errors.New("control plane did not become ready")
		}
	}
}

func (c *child) stop() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.done:
		return err
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		return errors.New("control plane did not stop in 30 s")
	}
}

func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// raiseFileLimit lifts the open-file limit to its hard maximum: every
// session is a socket on both sides.
func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

func parallel(n, workers int, fn func(i int) error) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if len(errs) < 5 {
						errs = append(errs, fmt.Errorf("#%d: %w", i, err))
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func waitUntil(ctx context.Context, limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

func run(ctx context.Context, o options) (result, error) {
	start := time.Now()
	res := result{Sessions: o.sessions, Store: "sqlite", GoMaxProcs: runtime.GOMAXPROCS(0),
		Machine: fmt.Sprintf("%d cores", runtime.NumCPU()), StartedAt: start.UTC().Format(time.RFC3339), HeartbeatS: o.heartbeat.Seconds(), GOGC: o.gogc, Ramp: o.ramp}
	raiseFileLimit()
	if o.stateDir == "" {
		dir, err := os.MkdirTemp("", "bc-bench-gateway-")
		if err != nil {
			return res, err
		}
		defer func() { _ = os.RemoveAll(dir) }()
		o.stateDir = dir
	}
	secret, err := pki.GenerateSecret()
	if err != nil {
		return res, err
	}
	cp, err := startChild(o, secret, "")
	if err != nil {
		return res, err
	}
	defer func() { _ = cp.stop() }()
	key, err := os.ReadFile(filepath.Join(o.stateDir, adminKeyFile))
	if err != nil {
		return res, err
	}
	api := client.New("http://"+apiAddr, strings.TrimSpace(string(key)))
	if _, err := api.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "bench"})); err != nil {
		return res, err
	}
	if _, err := api.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "bench", Name: "gateway"})); err != nil {
		return res, err
	}

	// Join every agent through the gateway with a token of its own.
	agents := make([]*lightAgent, o.sessions)
	joinStart := time.Now()
	if err := parallel(o.sessions, o.concurrency, func(i int) error {
		tok, err := api.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "bench", Project: "gateway"}))
		if err != nil {
			return fmt.Errorf("join token: %w", err)
		}
		a, err := newLightAgent(gatewayAddr)
		if err != nil {
			return err
		}
		if err := a.join(ctx, tok.Msg.GetToken(), i); err != nil {
			return fmt.Errorf("join: %w", err)
		}
		agents[i] = a
		return nil
	}); err != nil {
		return res, err
	}
	res.JoinS = time.Since(joinStart).Seconds()
	logf("joined %d agents in %.1fs", o.sessions, res.JoinS)

	// Open every session.
	runCtx, stopAgents := context.WithCancel(ctx)
	connStart := time.Now()
	var ramp chan struct{}
	if o.ramp > 0 {
		ramp = make(chan struct{}, o.ramp)
	}
	var wg sync.WaitGroup
	// One deferred step: the agents stop, then are waited for.
	defer func() { stopAgents(); wg.Wait() }()
	for i, a := range agents {
		wg.Add(1)
		go func() { defer wg.Done(); a.run(runCtx, o.heartbeat, ramp) }()
		if i%o.concurrency == 0 {
			time.Sleep(time.Millisecond) // pace the handshakes a little
		}
	}
	connected := func() int {
		n := 0
		for _, a := range agents {
			if a.connected.Load() {
				n++
			}
		}
		return n
	}
	if !waitUntil(ctx, 5*time.Minute, func() bool { return connected() == o.sessions }) {
		return res, fmt.Errorf("only %d of %d sessions connected", connected(), o.sessions)
	}
	res.ConnectS = time.Since(connStart).Seconds()
	failedSum := func() int64 {
		var n int64
		for _, a := range agents {
			n += a.failed.Load()
		}
		return n
	}
	res.ConnectFailed, res.ConnectFailures = failedSum(), takeFailures(5)
	logf("%d sessions up in %.1fs (%d attempts failed: %v); holding %s", o.sessions, res.ConnectS, res.ConnectFailed, res.ConnectFailures, o.hold)

	// Hold: every session must stay up.
	var droppedBefore int64
	for _, a := range agents {
		droppedBefore += a.dropped.Load()
	}
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(o.hold):
	}
	var dropped int64
	for _, a := range agents {
		dropped += a.dropped.Load()
	}
	res.Dropped = int(dropped - droppedBefore)
	res.SessionsHeld = connected()
	res.GatewayRSSMiB = rssMiB(cp.cmd.Process.Pid)
	res.HarnessRSSMiB = rssMiB(os.Getpid())
	logf("held %d, dropped %d; gateway RSS %.0f MiB; dispatching %d commands", res.SessionsHeld, res.Dropped, res.GatewayRSSMiB, o.commands)
	var stopProfiles func()
	if o.profileDir != "" {
		if stopProfiles, err = startProfiles(o); err != nil {
			return res, err
		}
	}

	// Dispatch: commit a command through the API; the latency is from the
	// row's create time (stamped in the committing transaction) to the
	// node holding the command, before it answers with its update;
	// o.dispatchers in flight, each on its own node.
	var (
		latMu sync.Mutex
		lats  []time.Duration
	)
	res.Dispatchers = o.dispatchers
	if o.dispatchers > len(agents) {
		return res, fmt.Errorf("-dispatchers %d needs at least as many sessions, not %d", o.dispatchers, len(agents))
	}
	var (
		busyMu sync.Mutex
		busy   = map[int]bool{}
	)
	// pick spreads the commands over the fleet, never to a node that has
	// one in flight: the probe awaits one command per agent at a time.
	pick := func(i int) int {
		busyMu.Lock()
		defer busyMu.Unlock()
		j := (i * 7919) % len(agents)
		for busy[j] {
			j = (j + 1) % len(agents)
		}
		busy[j] = true
		return j
	}
	if err := parallel(o.commands, o.dispatchers, func(i int) error {
		j := pick(i)
		defer func() { busyMu.Lock(); delete(busy, j); busyMu.Unlock() }()
		a := agents[j]
		a.await()
		run, err := api.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "bench", Node: a.nodeID, Kind: "inventory.refresh"}))
		if err != nil {
			return err
		}
		select {
		case at := <-a.received:
			latMu.Lock()
			lats = append(lats, at.Sub(run.Msg.GetCommand().GetCreateTime().AsTime()))
			latMu.Unlock()
			return nil
		case <-time.After(30 * time.Second):
			return fmt.Errorf("command to %s not delivered in 30 s", a.nodeID)
		}
	}); err != nil {
		return res, err
	}
	if stopProfiles != nil {
		stopProfiles()
	}
	slices.Sort(lats)
	res.Commands = len(lats)
	if n := len(lats); n > 0 {
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		res.DispatchP50ms = ms(lats[n/2])
		res.DispatchP99ms = ms(lats[min(n-1, n*99/100)])
		res.DispatchMaxms = ms(lats[n-1])
	}

	logf("dispatch p50 %.2f ms, p99 %.2f ms", res.DispatchP50ms, res.DispatchP99ms)

	// Reconnect storm: restart the gateway; every agent comes back.
	if o.reconnect {
		if err := cp.stop(); err != nil {
			return res, err
		}
		// Every agent has seen its session end before the clock starts.
		if !waitUntil(ctx, time.Minute, func() bool { return connected() == 0 }) {
			return res, fmt.Errorf("%d sessions still up after the gateway stopped", connected())
		}
		var cpuProfile string
		var stopHarnessProfile func()
		if o.profileDir != "" {
			cpuProfile = filepath.Join(o.profileDir, "gateway-reconnect-cpu.pprof")
			if stopHarnessProfile, err = startCPUProfile(filepath.Join(o.profileDir, "harness-reconnect-cpu.pprof")); err != nil {
				return res, err
			}
		}
		failedBefore := failedSum()
		_ = takeFailures(0)
		restart := time.Now()
		if cp, err = startChild(o, secret, cpuProfile); err != nil {
			return res, err
		}
		res.ReconnectReadyS = time.Since(restart).Seconds()
		stopSnapshots := func() {}
		if o.profileDir != "" {
			stopSnapshots = snapshotGoroutines(o.profileDir, restart)
		}
		back := func() bool {
			n := 0
			for _, a := range agents {
				if a.connected.Load() {
					n++
				}
			}
			res.Reconnected = n
			if res.ReconnectHalfS == 0 && 2*n >= o.sessions {
				res.ReconnectHalfS = time.Since(restart).Seconds()
			}
			if res.Reconnect90S == 0 && 10*n >= 9*o.sessions {
				res.Reconnect90S = time.Since(restart).Seconds()
			}
			return n == o.sessions
		}
		if !waitUntil(ctx, 5*time.Minute, back) {
			return res, fmt.Errorf("only %d of %d sessions back after the restart", res.Reconnected, o.sessions)
		}
		res.ReconnectS = time.Since(restart).Seconds()
		res.ReconnectFailed, res.ReconnectFailures = failedSum()-failedBefore, takeFailures(5)
		stopSnapshots()
		if stopHarnessProfile != nil {
			stopHarnessProfile()
		}
		logf("all %d sessions back %.1fs after the restart (control plane ready %.1fs, half %.1fs, 90%% %.1fs); %d attempts failed: %v",
			o.sessions, res.ReconnectS, res.ReconnectReadyS, res.ReconnectHalfS, res.Reconnect90S, res.ReconnectFailed, res.ReconnectFailures)
	}
	res.DurationS = time.Since(start).Seconds()
	return res, nil
}
