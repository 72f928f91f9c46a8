// Command gateway benchmarks the agent gateway: how many concurrent mTLS
// sessions one gateway process holds on this machine, how fast a committed
// command reaches its node, how long a fleet takes to reconnect after the
// gateway restarts, and the gateway's resident memory.
//
// It runs the control plane as a child process (this same binary, re-run
// with BC_BENCH_CHILD=1) so that the memory figure is the gateway's own,
// and drives N light agents (the real wire protocol, no hardware) from this
// process. With -json the last line is one JSON object.
//
// It must never be imported, and never reach beyond loopback.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"
)

type options struct {
	sessions    int
	commands    int
	hold        time.Duration
	heartbeat   time.Duration
	concurrency int
	dispatchers int
	reconnect   bool
	jsonOut     bool
	stateDir    string
	profileDir  string
	cpuSeconds  int
	gogc        string
	ramp        int
	handshake   time.Duration
}

// result is what the benchmark reports.
type result struct {
	Sessions      int     `json:"sessions"`
	SessionsHeld  int     `json:"sessions_held"`
	Dropped       int     `json:"dropped"`
	JoinS         float64 `json:"join_s"`
	ConnectS      float64 `json:"connect_s"`
	Commands      int     `json:"commands"`
	Dispatchers   int     `json:"dispatchers"`
	DispatchP50ms float64 `json:"dispatch_p50_ms"`
	DispatchP99ms float64 `json:"dispatch_p99_ms"`
	DispatchMaxms float64 `json:"dispatch_max_ms"`
	ReconnectS    float64 `json:"reconnect_s"`
	// The reconnect's shape: the restarted control plane ready, then half
	// and nine tenths of the sessions back (seconds from the restart).
	ReconnectReadyS float64 `json:"reconnect_ready_s"`
	ReconnectHalfS  float64 `json:"reconnect_half_s"`
	Reconnect90S    float64 `json:"reconnect_90_s"`
	// Session attempts that failed before their HelloAck, in the first
	// connect and in the reconnect, and the commonest reasons.
	ConnectFailed     int64    `json:"connect_failed"`
	ReconnectFailed   int64    `json:"reconnect_failed"`
	ConnectFailures   []string `json:"connect_failures,omitempty"`
	ReconnectFailures []string `json:"reconnect_failures,omitempty"`
	Reconnected       int      `json:"reconnected"`
	GatewayRSSMiB     float64  `json:"gateway_rss_mib"`
	HarnessRSSMiB     float64  `json:"harness_rss_mib"`
	HeartbeatS        float64  `json:"heartbeat_s"`
	GOGC              string   `json:"gogc,omitempty"`
	Ramp              int      `json:"ramp,omitempty"`
	Store             string   `json:"store"`
	GoMaxProcs        int      `json:"gomaxprocs"`
	Machine           string   `json:"machine"`
	StartedAt         string   `json:"started_at"`
	DurationS         float64  `json:"duration_s"`
}

func main() {
	if os.Getenv(childEnv) == "1" {
		if err := runChild(); err != nil {
			log.Fatalf("bench child: %v", err)
		}
		return
	}
	var o options
	flag.IntVar(&o.sessions, "sessions", 1000, "concurrent agent sessions")
	flag.IntVar(&o.commands, "commands", 1000, "commands dispatched to measure latency")
	flag.DurationVar(&o.hold, "hold", 10*time.Second, "how long the sessions are held before counting drops")
	flag.DurationVar(&o.heartbeat, "heartbeat", 10*time.Second, "heartbeat interval the gateway asks for")
	flag.IntVar(&o.concurrency, "concurrency", 32, "joins and connects in flight")
	flag.IntVar(&o.dispatchers, "dispatchers", 8, "commands in flight while measuring dispatch (each on its own node)")
	flag.BoolVar(&o.reconnect, "reconnect", true, "measure the reconnect storm after a gateway restart")
	flag.BoolVar(&o.jsonOut, "json", false, "print the result as one JSON object on the last line")
	flag.StringVar(&o.stateDir, "state-dir", "", "state directory of the control plane (default a temp dir)")
	flag.StringVar(&o.profileDir, "profile", "", "write the control plane's heap profile (sessions held), goroutines, and CPU profiles of both processes during dispatch and the reconnect into this directory")
	flag.IntVar(&o.ramp, "ramp", 0, "sessions being opened at once in the first connect (0: all at once); a busy machine may need it to connect 10,000")
	flag.StringVar(&o.gogc, "gogc", "", "GOGC of the control plane (default: Go's, 100)")
	flag.DurationVar(&o.handshake, "handshake-timeout", 0, "the gateway's handshake timeout (default: the gateway's)")
	flag.IntVar(&o.cpuSeconds, "cpu-seconds", 10, "length of the control plane's CPU profile taken from the start of dispatch, with -profile")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, o)
	if err != nil {
		log.Fatalf("bench: %v", err)
	}
	if o.jsonOut {
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
		return
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	fmt.Println(string(b))
}
