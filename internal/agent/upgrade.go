package agent

// bcd replaces itself (daemon.upgrade) and goes back (daemon.rollback).
//
// Invariants:
//   - Nothing is installed that a trusted release key did not sign, that
//     does not match the manifest's size and sha256 for this platform, and
//     that does not say it is the manifest's version when run.
//   - The executable is replaced by one rename: at every moment the path
//     holds a whole binary, the old one or the new one.
//   - The binary that ran before is kept beside the executable
//     (<exe>.prev), and upgrade.json in the state directory says which
//     version it is, so a rollback or the watchdog can put it back.
//   - An upgraded bcd that establishes no session within the command's
//     revert_after_seconds puts the previous binary back by itself.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/release"
)

// Command kinds that upgrade and roll back bcd itself, and the capability
// bcd advertises when it can apply them (a release key is configured).
const (
	KindDaemonUpgrade  = "daemon.upgrade"
	KindDaemonRollback = "daemon.rollback"
	CapDaemonUpgrade   = "daemon.upgrade"
)

// Failure codes of daemon.upgrade and daemon.rollback.
const (
	// FailReleaseUntrusted: no release key is configured, or the
	// manifest is not signed by one of them.
	FailReleaseUntrusted = "RELEASE_UNTRUSTED"
	// FailReleaseInvalid: the envelope or manifest is malformed or
	// invalid, or the release has no binary for this node's platform.
	FailReleaseInvalid = "RELEASE_INVALID"
	FailDownload       = "DOWNLOAD_FAILED"
	FailDigestMismatch = "DIGEST_MISMATCH"
	// FailProbe: the downloaded binary did not run, or `<new> version`
	// did not print the manifest's version.
	FailProbe   = "PROBE_FAILED"
	FailInstall = "INSTALL_FAILED"
	// FailNoPrevious: the kept previous binary is not of the version a
	// rollback asks for (or there is none).
	FailNoPrevious = "NO_PREVIOUS"
)

// upgradeFile records the last upgrade, rollback or revert.
const upgradeFile = "upgrade.json"

// States of upgradeState.
const (
	// upgradePending: the new binary is installed; it is kept only once
	// it establishes a session.
	upgradePending = "pending"
	// upgradeConfirmed: the new binary established a session.
	upgradeConfirmed = "confirmed"
	// upgradeReverted: the new binary established no session in time,
	// or could not be started, and the previous one was put back.
	upgradeReverted = "reverted"
	// upgradeRolledBack: daemon.rollback put the previous one back.
	upgradeRolledBack = "rolled_back"
)

// Defaults of the upgrade's bounds.
const (
	defaultRevertAfter = 120 * time.Second
	// maxRevertAfter bounds revert_after_seconds: a day.
	maxRevertAfter = 24 * time.Hour
	// probeTimeout bounds `<new> version`.
	probeTimeout = 30 * time.Second
)

// upgradeState is upgrade.json.
type upgradeState struct {
	State       string `json:"state"`
	FromVersion string `json:"from_version"`
	ToVersion   string `json:"to_version"`
	// Executable is the path that was replaced.
	Executable string `json:"executable"`
	// Previous is the kept binary, of PreviousVersion and
	// PreviousSHA256: what a rollback or the watchdog puts back.
	Previous        string `json:"previous"`
	PreviousVersion string `json:"previous_version"`
	PreviousSHA256  string `json:"previous_sha256"`
	// RevertAfterSeconds is the watchdog's deadline after the restart.
	RevertAfterSeconds int       `json:"revert_after_seconds,omitempty"`
	Rollout            string    `json:"rollout,omitempty"`
	CommandID          string    `json:"command_id,omitempty"`
	Reason             string    `json:"reason,omitempty"`
	UpdateTime         time.Time `json:"update_time"`
}

type upgradeParams struct {
	Manifest           string   `json:"manifest"`
	URL                string   `json:"url"`
	RevertAfterSeconds *float64 `json:"revert_after_seconds"`
	Rollout            string   `json:"rollout"`
}

type rollbackParams struct {
	ToVersion string `json:"to_version"`
	Rollout   string `json:"rollout"`
}

// decodeParams decodes a command's params into v, refusing unknown fields.
func decodeParams(p *structpb.Struct, v any) error {
	if p == nil {
		return errors.New("params are required")
	}
	b, err := p.MarshalJSON()
	if err != nil {
		return fmt.Errorf("params: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("params: %w", err)
	}
	return nil
}

// Platform is this bcd's release platform, "linux-<GOARCH>".
func Platform() string { return "linux-" + runtime.GOARCH }

func versionResult(from, to string, restarting bool) *structpb.Struct {
	res, _ := structpb.NewStruct(map[string]any{"from_version": from, "to_version": to, "restarting": restarting})
	return res
}

// upgrade applies daemon.upgrade.
func (a *Agent) upgrade(ctx context.Context, c *agentv1.Command) (outcome, error) {
	var p upgradeParams
	if err := decodeParams(c.GetParams(), &p); err != nil {
		return outcome{}, fail(FailInvalidParams, err)
	}
	revertAfter := defaultRevertAfter
	if r := p.RevertAfterSeconds; r != nil {
		d := time.Duration(*r) * time.Second
		if *r != float64(int64(*r)) || *r < 1 || d > maxRevertAfter {
			return outcome{}, fail(FailInvalidParams, fmt.Errorf("revert_after_seconds: %v is not a whole number of seconds from 1 to %d", *r, int(maxRevertAfter.Seconds())))
		}
		revertAfter = d
	}
	if p.Manifest == "" {
		return outcome{}, fail(FailInvalidParams, errors.New("manifest: required: the signed release envelope"))
	}
	u, err := url.Parse(p.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return outcome{}, fail(FailInvalidParams, fmt.Errorf("url: %q is not an absolute http or https URL", p.URL))
	}
	if len(a.cfg.ReleaseKeys) == 0 {
		return outcome{}, fail(FailReleaseUntrusted, errors.New("this bcd trusts no release key (--release-pubkey): it installs no release"))
	}
	m, _, err := release.Verify([]byte(p.Manifest), a.cfg.ReleaseKeys)
	if err != nil {
		if errors.Is(err, release.ErrUnknownKey) || errors.Is(err, release.ErrBadSignature) || errors.Is(err, release.ErrWrongPurpose) {
			return outcome{}, fail(FailReleaseUntrusted, fmt.Errorf("manifest: %w", err))
		}
		return outcome{}, fail(FailReleaseInvalid, fmt.Errorf("manifest: %w", err))
	}
	bin, ok := m.Binary(Platform())
	if !ok {
		return outcome{}, fail(FailReleaseInvalid, fmt.Errorf("release %s has no %s binary", m.Version, Platform()))
	}
	if m.Version == a.cfg.Version {
		return outcome{result: versionResult(m.Version, m.Version, false)}, nil
	}

	a.upgradeMu.Lock()
	defer a.upgradeMu.Unlock()
	exe := a.cfg.Executable
	if exe == "" {
		return outcome{}, fail(FailInstall, errors.New("the path of bcd's executable is unknown"))
	}
	tmp, err := a.download(ctx, p.URL, bin, exe)
	if err != nil {
		return outcome{}, err
	}
	installed := false
	defer func() {
		if !installed {
			_ = os.Remove(tmp)
		}
	}()
	if err := probeVersion(ctx, tmp, m.Version); err != nil {
		return outcome{}, fail(FailProbe, err)
	}
	// The kept binary must be the one running: a file replaced under a
	// running bcd would be put back under the wrong version.
	if err := probeVersion(ctx, exe, a.cfg.Version); err != nil {
		return outcome{}, fail(FailInstall, fmt.Errorf("the executable is not the running bcd: %w", err))
	}
	prev := exe + ".prev"
	sum, err := keepCopy(exe, prev)
	if err != nil {
		return outcome{}, fail(FailInstall, err)
	}
	st := upgradeState{
		State: upgradePending, FromVersion: a.cfg.Version, ToVersion: m.Version, Executable: exe,
		Previous: prev, PreviousVersion: a.cfg.Version, PreviousSHA256: sum,
		RevertAfterSeconds: int(revertAfter / time.Second), Rollout: p.Rollout, CommandID: c.GetId(),
		UpdateTime: a.cfg.Clock.Now(),
	}
	old, hadOld, err := a.readUpgrade()
	if err != nil {
		return outcome{}, fail(FailInstall, err)
	}
	// Recorded before the rename: a bcd that dies right after it starts
	// as the new version and finds its watchdog's record.
	if err := a.dir.writeJSON(upgradeFile, &st); err != nil {
		return outcome{}, fail(FailInstall, err)
	}
	if err := replace(tmp, exe); err != nil {
		if hadOld {
			_ = a.dir.writeJSON(upgradeFile, &old)
		} else {
			_ = a.dir.remove(upgradeFile)
		}
		return outcome{}, fail(FailInstall, err)
	}
	installed = true
	a.log.Warn("bcd upgraded; restarting", "from", a.cfg.Version, "to", m.Version, "executable", exe, "previous", prev, "rollout", p.Rollout)
	a.restartAfterReport(c, exe)
	return outcome{result: versionResult(a.cfg.Version, m.Version, true)}, nil
}

// rollback applies daemon.rollback.
func (a *Agent) rollback(c *agentv1.Command) (outcome, error) {
	var p rollbackParams
	if err := decodeParams(c.GetParams(), &p); err != nil {
		return outcome{}, fail(FailInvalidParams, err)
	}
	if p.ToVersion == "" {
		return outcome{}, fail(FailInvalidParams, errors.New("to_version: required"))
	}
	if p.ToVersion == a.cfg.Version {
		return outcome{result: versionResult(a.cfg.Version, a.cfg.Version, false)}, nil
	}
	a.upgradeMu.Lock()
	defer a.upgradeMu.Unlock()
	st, ok, err := a.readUpgrade()
	if err != nil {
		return outcome{}, fail(FailInstall, err)
	}
	if !ok || st.Previous == "" {
		return outcome{}, fail(FailNoPrevious, fmt.Errorf("no previous binary is kept: bcd %s cannot go back to %s", a.cfg.Version, p.ToVersion))
	}
	if st.PreviousVersion != p.ToVersion {
		return outcome{}, fail(FailNoPrevious, fmt.Errorf("the kept previous binary is %s, not %s", st.PreviousVersion, p.ToVersion))
	}
	exe := st.Executable
	if err := a.swapBack(&st, upgradeRolledBack, "daemon.rollback "+c.GetId()); err != nil {
		if errors.Is(err, errPreviousGone) {
			return outcome{}, fail(FailNoPrevious, err)
		}
		return outcome{}, fail(FailInstall, err)
	}
	st.Rollout, st.CommandID = p.Rollout, c.GetId()
	if err := a.dir.writeJSON(upgradeFile, &st); err != nil {
		a.log.Error("record the rollback", "err", err)
	}
	a.log.Warn("bcd rolled back; restarting", "from", st.FromVersion, "to", st.ToVersion, "executable", exe, "rollout", p.Rollout)
	a.restartAfterReport(c, exe)
	return outcome{result: versionResult(st.FromVersion, st.ToVersion, true)}, nil
}

var errPreviousGone = errors.New("the kept previous binary is gone or changed")

// swapBack puts st's previous binary back at st.Executable and keeps the
// one it replaces as the new previous; st is updated to say so (state,
// versions, digests) and written. The caller holds upgradeMu.
func (a *Agent) swapBack(st *upgradeState, state, reason string) error {
	f, err := os.Open(st.Previous)
	if err != nil {
		return fmt.Errorf("%w: %w", errPreviousGone, err)
	}
	sum, _, err := release.Digest(f)
	_ = f.Close()
	if err != nil {
		return fmt.Errorf("%w: read %s: %w", errPreviousGone, st.Previous, err)
	}
	if sum != st.PreviousSHA256 {
		return fmt.Errorf("%w: %s has sha256 %s, upgrade.json recorded %s", errPreviousGone, st.Previous, sum, st.PreviousSHA256)
	}
	// The current binary becomes the previous one: linked (or copied)
	// aside first, so the executable's path never lacks a binary.
	aside := st.Previous + ".swap"
	curSum, err := keepCopy(st.Executable, aside)
	if err != nil {
		return err
	}
	if err := replace(st.Previous, st.Executable); err != nil {
		_ = os.Remove(aside)
		return err
	}
	if err := replace(aside, st.Previous); err != nil {
		// The previous binary is in place; only the way forward is lost.
		a.log.Error("keep the replaced binary", "path", aside, "err", err)
	}
	// The executable held the version the record installed last.
	cur := st.ToVersion
	*st = upgradeState{
		State: state, FromVersion: cur, ToVersion: st.PreviousVersion, Executable: st.Executable,
		Previous: st.Previous, PreviousVersion: cur, PreviousSHA256: curSum,
		Rollout: st.Rollout, CommandID: st.CommandID, Reason: reason, UpdateTime: a.cfg.Clock.Now(),
	}
	return a.dir.writeJSON(upgradeFile, st)
}

func (a *Agent) readUpgrade() (upgradeState, bool, error) {
	var st upgradeState
	ok, err := a.dir.readJSON(upgradeFile, &st)
	return st, ok, err
}

// download fetches url into a new file beside exe, bounded by the
// manifest's size and the command's context, and checks it against bin.
// It returns the file's path, mode 0755 and synced.
func (a *Agent) download(ctx context.Context, rawURL string, bin release.Binary, exe string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.UpgradeDownloadTimeout)
	defer cancel()
	client, err := a.downloadClient()
	if err != nil {
		return "", fail(FailDownload, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return "", fail(FailInvalidParams, fmt.Errorf("url: %w", err))
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fail(FailDownload, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return "", fail(FailDownload, fmt.Errorf("GET %s: %s", rawURL, resp.Status))
	}
	if resp.ContentLength > bin.Size {
		return "", fail(FailDigestMismatch, fmt.Errorf("GET %s: %d bytes, the manifest's %s binary has %d", rawURL, resp.ContentLength, bin.Platform, bin.Size))
	}
	f, err := os.CreateTemp(filepath.Dir(exe), "."+filepath.Base(exe)+".new-")
	if err != nil {
		return "", fail(FailInstall, err)
	}
	ok := false
	defer func() {
		_ = f.Close()
		if !ok {
			_ = os.Remove(f.Name())
		}
	}()
	// One byte past the size tells a longer file apart without reading it all.
	n, err := io.Copy(f, io.LimitReader(resp.Body, bin.Size+1))
	if err != nil {
		return "", fail(FailDownload, fmt.Errorf("GET %s: %w", rawURL, err))
	}
	if n > bin.Size {
		return "", fail(FailDigestMismatch, fmt.Errorf("GET %s: longer than the manifest's %d bytes", rawURL, bin.Size))
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", fail(FailInstall, err)
	}
	if err := release.CheckBinary(f, bin); err != nil {
		return "", fail(FailDigestMismatch, fmt.Errorf("GET %s: %w", rawURL, err))
	}
	if err := f.Chmod(0o755); err != nil {
		return "", fail(FailInstall, err)
	}
	if err := f.Sync(); err != nil {
		return "", fail(FailInstall, err)
	}
	if err := f.Close(); err != nil {
		return "", fail(FailInstall, err)
	}
	ok = true
	return f.Name(), nil
}

// downloadClient trusts the system roots and the control plane's trust
// bundle, which signs the control plane's own listeners.
func (a *Agent) downloadClient() (*http.Client, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if b, err := a.dir.read(trustFile); err == nil {
		pool.AppendCertsFromPEM(b)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	return &http.Client{Transport: tr}, nil
}

// probeVersion runs `path version` and checks it prints want.
func probeVersion(ctx context.Context, path, want string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var out []byte
	var err error
	// A file just written may be held open for writing by a child forked
	// meanwhile (ETXTBSY) for as long as that fork takes to exec.
	for range 50 {
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, path, "version")
		cmd.Stderr = &stderr
		out, err = cmd.Output()
		if err == nil || !errors.Is(err, syscall.ETXTBSY) {
			if err != nil && stderr.Len() > 0 {
				err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
			}
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s version: %w", path, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err != nil {
		return fmt.Errorf("%s version: %w", path, err)
	}
	if got := strings.TrimSpace(string(out)); got != want {
		return fmt.Errorf("%s version printed %q, want %q", path, truncate(got, 80), want)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// keepCopy makes dst the same file as src, replacing dst atomically, and
// returns its sha256: a hard link where the filesystem allows, else a
// synced copy.
func keepCopy(src, dst string) (string, error) {
	dir := filepath.Dir(dst)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(dst)+".tmp-")
	if err != nil {
		return "", fmt.Errorf("keep %s: %w", src, err)
	}
	name := tmp.Name()
	_ = tmp.Close()
	_ = os.Remove(name)
	defer func() { _ = os.Remove(name) }()
	if err := os.Link(src, name); err != nil {
		if err := copyFile(src, name); err != nil {
			return "", fmt.Errorf("keep %s: %w", src, err)
		}
	}
	f, err := os.Open(name)
	if err != nil {
		return "", fmt.Errorf("keep %s: %w", src, err)
	}
	sum, _, err := release.Digest(f)
	_ = f.Close()
	if err != nil {
		return "", fmt.Errorf("keep %s: %w", src, err)
	}
	if err := replace(name, dst); err != nil {
		return "", err
	}
	return sum, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// replace renames from over to and syncs the directory, so the rename
// survives a crash.
func replace(from, to string) error {
	if err := os.Rename(from, to); err != nil {
		return fmt.Errorf("install %s: %w", to, err)
	}
	if d, err := os.Open(filepath.Dir(to)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// restartAfterReport re-execs exe once c's final update is reported (see
// afterReport). A re-exec that fails puts the previous binary back.
func (a *Agent) restartAfterReport(c *agentv1.Command, exe string) {
	a.afterReport(c, "restart", func(context.Context) {
		a.log.Warn("bcd re-executing", "executable", exe, "command", c.GetId())
		if err := a.cfg.Reexec(exe); err != nil {
			a.log.Error("re-exec failed; putting the previous binary back", "err", err)
			a.revert("re-exec failed: " + err.Error())
		}
	})
}

// reexec replaces the process with path, same arguments and environment.
func reexec(path string) error {
	return syscall.Exec(path, os.Args, os.Environ())
}

// upgradeWatchdog runs for the life of Run: a bcd that was just upgraded
// to its own version must establish a session within the upgrade's
// revert_after_seconds, or it puts the previous binary back and re-execs.
func (a *Agent) upgradeWatchdog(ctx context.Context) {
	a.upgradeMu.Lock()
	st, ok, err := a.readUpgrade()
	a.upgradeMu.Unlock()
	if err != nil {
		a.log.Error("upgrade record", "err", err)
		return
	}
	if !ok || st.State != upgradePending || st.ToVersion != a.cfg.Version {
		return
	}
	d := time.Duration(cmpPositive(st.RevertAfterSeconds, int(defaultRevertAfter/time.Second))) * time.Second
	a.log.Info("upgraded bcd on probation", "from", st.FromVersion, "to", st.ToVersion, "revert_after", d)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	a.upgradeMu.Lock()
	st, ok, err = a.readUpgrade()
	a.upgradeMu.Unlock()
	if err != nil || !ok || st.State != upgradePending || st.ToVersion != a.cfg.Version {
		return
	}
	a.log.Error("no session since the upgrade; putting the previous binary back", "version", a.cfg.Version, "previous", st.PreviousVersion, "after", d)
	if a.revert(fmt.Sprintf("no session within %v of the restart", d)) {
		if err := a.cfg.Reexec(st.Executable); err != nil {
			a.log.Error("re-exec the previous binary", "err", err)
		}
	}
}

func cmpPositive(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// revert puts the previous binary back after a failed upgrade (state
// reverted) and reports whether it did.
func (a *Agent) revert(reason string) bool {
	a.upgradeMu.Lock()
	defer a.upgradeMu.Unlock()
	st, ok, err := a.readUpgrade()
	if err != nil || !ok || st.State != upgradePending {
		a.log.Error("no pending upgrade to revert", "err", err)
		return false
	}
	if err := a.swapBack(&st, upgradeReverted, reason); err != nil {
		a.log.Error("put the previous binary back", "err", err)
		return false
	}
	return true
}

// confirmUpgrade marks a pending upgrade to this version confirmed: it is
// called when a session is established.
func (a *Agent) confirmUpgrade() {
	a.upgradeMu.Lock()
	defer a.upgradeMu.Unlock()
	st, ok, err := a.readUpgrade()
	if err != nil || !ok || st.State != upgradePending || st.ToVersion != a.cfg.Version {
		return
	}
	st.State, st.UpdateTime = upgradeConfirmed, a.cfg.Clock.Now()
	if err := a.dir.writeJSON(upgradeFile, &st); err != nil {
		a.log.Error("confirm the upgrade", "err", err)
		return
	}
	a.log.Info("upgrade confirmed", "from", st.FromVersion, "to", st.ToVersion)
}
