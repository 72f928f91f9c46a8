package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	bcapp "github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/storeopen"
)

// Finding is one check of doctor: ok, warn or fail, what it saw and, when
// not ok, how to fix it.
type Finding struct {
	Check  string `json:"check"`
	Status string `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// Finding statuses.
const (
	findingOK   = "ok"
	findingWarn = "warn"
	findingFail = "fail"
)

// doctorFlags say where the deployment is: its database (as serve and pki
// take it), and optionally its API and gateway addresses to dial.
type doctorFlags struct {
	pki     pkiFlags
	api     string
	gateway string
	// certWarn is how long before a CA's end doctor warns.
	certWarn time.Duration
}

func (f *doctorFlags) register(cmd *cobra.Command) {
	f.pki.register(cmd)
	cmd.Flags().StringVar(&f.api, "api-url", "", "the API's URL to check it answers /readyz (e.g. https://bc.example.com)")
	cmd.Flags().StringVar(&f.gateway, "gateway", "", "the agent gateway's HOST:PORT to check it accepts TLS")
	cmd.Flags().DurationVar(&f.certWarn, "cert-warn", 30*24*time.Hour, "warn when a CA ends within this long")
}

// maxClockSkew is how far the database's clock may stand from this host's
// before doctor warns: leases, tokens and heartbeats are timed by it.
const maxClockSkew = 2 * time.Second

// runDoctor runs every check against the deployment; it never fails as a
// whole, it reports.
func (f *doctorFlags) run(ctx context.Context) []Finding {
	var out []Finding
	add := func(check, status, detail, fix string) {
		out = append(out, Finding{Check: check, Status: status, Detail: detail, Fix: fix})
	}
	db, err := storeopen.Open(ctx, store.Config{URL: f.pki.databaseURL, StateDir: f.pki.server.StateDir})
	if err != nil {
		add("database", findingFail, "cannot open it: "+err.Error(),
			"pass the --database-url (or --state-dir) serve runs with; check the server is up and the role may connect")
	} else {
		defer func() { _ = db.Close() }()
		out = append(out, f.databaseChecks(ctx, db)...)
	}
	if f.api != "" {
		if err := probeReady(ctx, f.api); err != nil {
			add("api", findingFail, f.api+": "+err.Error(), "check serve runs with the api role and listens there (--listen)")
		} else {
			add("api", findingOK, f.api+" answers /readyz", "")
		}
	}
	if f.gateway != "" {
		if err := probeTLS(ctx, f.gateway); err != nil {
			add("gateway", findingFail, f.gateway+": "+err.Error(), "check serve runs with the gateway role (--gateway-listen) and no firewall is between")
		} else {
			add("gateway", findingOK, f.gateway+" accepts TLS", "")
		}
	}
	return out
}

func (f *doctorFlags) databaseChecks(ctx context.Context, db *store.DB) []Finding {
	var out []Finding
	add := func(check, status, detail, fix string) {
		out = append(out, Finding{Check: check, Status: status, Detail: detail, Fix: fix})
	}
	add("database", findingOK, "reachable ("+string(db.Dialect())+")", "")
	pending, err := db.Pending(ctx, append(bcapp.Modules(), pki.Migrations())...)
	switch {
	case errors.Is(err, store.ErrSchemaTooNew):
		add("migrations", findingFail, err.Error(), "this binary is older than the database: run the release that migrated it")
		return out
	case err != nil:
		add("migrations", findingFail, err.Error(), "check the database user may read schema_migrations")
		return out
	case len(pending) > 0:
		shown := pending
		if len(shown) > 5 {
			shown = append(append([]string{}, shown[:5]...), fmt.Sprintf("and %d more", len(pending)-5))
		}
		add("migrations", findingFail, fmt.Sprintf("%d pending: %s", len(pending), strings.Join(shown, ", ")),
			"start serve (it migrates before it serves), one replica first")
		return out
	default:
		add("migrations", findingOK, "every module is at this binary's version", "")
	}
	var (
		dbNow time.Time
		cas   []pki.CAExpiry
		nodes []fleet.Node
	)
	err = db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		if dbNow, err = store.DatabaseNow(ctx, tx); err != nil {
			return err
		}
		if cas, err = pki.CAExpiries(ctx, tx); err != nil {
			return err
		}
		nodes, err = fleet.NodeList(ctx, tx, &fleet.NodeListParams{Limit: 100000})
		return err
	})
	if err != nil {
		add("database", findingFail, "read: "+err.Error(), "check the database user's grants")
		return out
	}
	now := time.Now()
	if skew := dbNow.Sub(now); skew > maxClockSkew || skew < -maxClockSkew {
		add("clock", findingWarn, fmt.Sprintf("the database's clock is %s from this host's", skew.Round(time.Millisecond)),
			"run NTP (chrony, systemd-timesyncd) on the database and every replica")
	} else {
		add("clock", findingOK, fmt.Sprintf("within %s of the database's", maxClockSkew), "")
	}
	if len(cas) == 0 {
		add("certificates", findingWarn, "no PKI in this database: nodes cannot join", "better-compute pki init (serve creates one on first start with BETTER_COMPUTE_SECRET)")
	}
	for _, c := range cas {
		left := c.NotAfter.Sub(now)
		switch {
		case left <= 0:
			add("certificates", findingFail, fmt.Sprintf("the %s CA ended %s", c.Kind, stamp(c.NotAfter)),
				"better-compute pki rotate (docs/security.md)")
		case left < f.certWarn:
			add("certificates", findingWarn, fmt.Sprintf("the %s CA ends in %s (%s)", c.Kind, left.Round(time.Hour), stamp(c.NotAfter)),
				"better-compute pki rotate before then (docs/security.md)")
		default:
			add("certificates", findingOK, fmt.Sprintf("the %s CA ends %s", c.Kind, stamp(c.NotAfter)), "")
		}
	}
	var lost, unreachable, mute []string
	for _, n := range nodes {
		if n.State == fleet.NodeRetired {
			continue
		}
		switch n.Liveness {
		case fleet.LivenessLost:
			lost = append(lost, n.Name)
		case fleet.LivenessUnreachable:
			unreachable = append(unreachable, n.Name)
		}
		var caps []string
		if n.Capabilities != "" {
			_ = json.Unmarshal([]byte(n.Capabilities), &caps)
		}
		if n.Liveness == fleet.LivenessReady && len(caps) == 0 && n.Mode == "node" {
			mute = append(mute, n.Name)
		}
	}
	if len(lost)+len(unreachable) > 0 {
		add("nodes", findingWarn, fmt.Sprintf("%d lost (%s), %d unreachable (%s)", len(lost), names(lost), len(unreachable), names(unreachable)),
			"check bcd on them (systemctl status bcd; journalctl -u bcd), then `better-compute nodes get NODE`")
	}
	if len(mute) > 0 {
		add("nodes", findingWarn, fmt.Sprintf("%d ready node(s) advertise no capabilities (%s): nothing is placed on them", len(mute), names(mute)),
			"upgrade bcd on them to this release")
	}
	if len(lost)+len(unreachable)+len(mute) == 0 {
		add("nodes", findingOK, fmt.Sprintf("%d node(s), none lost, unreachable or without capabilities", len(nodes)), "")
	}
	return out
}

func names(ns []string) string {
	sort.Strings(ns)
	if len(ns) > 5 {
		return strings.Join(ns[:5], ", ") + ", …"
	}
	return strings.Join(ns, ", ")
}

func probeReady(ctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/readyz", nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return fmt.Errorf("/readyz answered %s: %s", res.Status, strings.TrimSpace(string(b)))
	}
	return nil
}

// probeTLS checks the gateway completes a TLS handshake. The certificate
// is not checked here: bcd pins it from its join token.
func probeTLS(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}} //nolint:gosec // a reachability probe, no data is sent
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

func printFindings(w io.Writer, fs []Finding) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tDETAIL\tFIX")
	for _, f := range fs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Check, f.Status, f.Detail, dash(f.Fix))
	}
	_ = tw.Flush()
}

func failed(fs []Finding) bool {
	for _, f := range fs {
		if f.Status == findingFail {
			return true
		}
	}
	return false
}

func (a *app) doctorCommand() *cobra.Command {
	var f doctorFlags
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check a deployment (database and migrations, clocks, CA expiry, nodes, API, gateway) and say how to fix what is wrong",
		Long: `doctor checks a deployment the way an operator would, each finding with its
fix: the database is reachable and migrated to this binary's version, its
clock agrees with this host's, no CA ends within --cert-warn, no node is
lost, unreachable or ready without capabilities, and (when given) the API
answers /readyz and the gateway accepts TLS. Like pki, it reads the database
directly (--database-url or --state-dir). It exits 1 when a check fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs := f.run(cmd.Context())
			if err := printDoctor(cmd.OutOrStdout(), a.flagOutput, fs); err != nil {
				return err
			}
			if failed(fs) {
				return connect.NewError(connect.CodeFailedPrecondition, errors.New("doctor found failures (above), each with its fix"))
			}
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

// printDoctor writes the findings as the global -o asks (json, else a
// table).
func printDoctor(w io.Writer, output string, fs []Finding) error {
	if output == "json" {
		b, err := json.MarshalIndent(map[string]any{"findings": fs}, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	printFindings(w, fs)
	return nil
}

// secretRE finds what a bundle must not carry: API keys, join tokens,
// bearer headers, and values of secret-looking settings.
var secretRE = regexp.MustCompile(`bc_[A-Za-z0-9_-]{8,}|bcjt_[A-Za-z0-9._-]{8,}|(?i:(bearer\s+))[A-Za-z0-9._~+/=-]{8,}|` +
	`(?i:((?:secret|token|password|key)[a-z_]*["']?\s*[:=]\s*["']?))[^\s"',}]{4,}`)

// Redact replaces credentials in s with [redacted], keeping what names
// them ("Bearer ", "password: ").
func Redact(s string) string {
	return secretRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := secretRE.FindStringSubmatch(m)
		for _, prefix := range sub[1:] {
			if prefix != "" {
				return prefix + "[redacted]"
			}
		}
		return "[redacted]"
	})
}

func (a *app) supportBundleCommand() *cobra.Command {
	var (
		f       doctorFlags
		out     string
		logFile string
		lines   int
	)
	cmd := &cobra.Command{
		Use:   "support-bundle --out FILE.tar.gz",
		Short: "Write a redacted archive for support: doctor's findings, versions, the configuration and recent logs",
		Long: `support-bundle writes a gzipped tar with doctor's findings (as doctor
runs them), the versions of this binary, Go and the OS, the CLI's
configuration and the BETTER_COMPUTE_* environment, and the last --lines of
--log-file (serve's log, e.g. as journald exports it). API keys, join
tokens, bearer headers and the values of secret-looking settings are
replaced with [redacted] before anything is written.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return invalidArg("out", "required: the archive to write, e.g. bc-support.tar.gz")
			}
			files := map[string][]byte{}
			fs := f.run(cmd.Context())
			var doc bytes.Buffer
			printFindings(&doc, fs)
			files["doctor.txt"] = doc.Bytes()
			files["versions.txt"] = fmt.Appendf(nil, "better-compute %s\n%s %s/%s\n", a.version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			var env []string
			for _, kv := range os.Environ() {
				if strings.HasPrefix(kv, "BETTER_COMPUTE_") || strings.HasPrefix(kv, "BC_") {
					k, v, _ := strings.Cut(kv, "=")
					if strings.Contains(k, "SECRET") || strings.Contains(k, "TOKEN") || strings.Contains(k, "PASSWORD") || strings.Contains(k, "KEY") {
						v = "[redacted]"
					}
					env = append(env, k+"="+v)
				}
			}
			sort.Strings(env)
			files["environment.txt"] = []byte(strings.Join(env, "\n") + "\n")
			if p := configPath(a.lookupEnv); p != "" {
				if b, err := os.ReadFile(p); err == nil {
					files["cli-config.yaml"] = b
				}
			}
			if logFile != "" {
				b, err := tailFile(logFile, lines)
				if err != nil {
					return invalidArg("log-file", err.Error())
				}
				files["serve.log"] = b
			}
			if err := writeSupportBundle(out, files); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%d files; credentials redacted)\n", out, len(files))
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&out, "out", "", "the archive to write (.tar.gz)")
	cmd.Flags().StringVar(&logFile, "log-file", "", "serve's log file to take the end of")
	cmd.Flags().IntVar(&lines, "lines", 2000, "how many of the log's last lines to take")
	return cmd
}

func tailFile(path string, n int) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	ls := strings.SplitAfter(string(b), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return []byte(strings.Join(ls, "")), nil
}

// writeSupportBundle writes files, redacted, into a gzipped tar at path
// (mode 0600: it describes the deployment).
func writeSupportBundle(path string, files map[string][]byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	now := time.Now()
	for _, n := range names {
		b := []byte(Redact(string(files[n])))
		if err := tw.WriteHeader(&tar.Header{Name: "bc-support/" + n, Mode: 0o600, Size: int64(len(b)), ModTime: now}); err != nil {
			return errors.Join(err, f.Close())
		}
		if _, err := tw.Write(b); err != nil {
			return errors.Join(err, f.Close())
		}
	}
	return errors.Join(tw.Close(), zw.Close(), f.Close())
}
