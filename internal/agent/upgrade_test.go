package agent_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/release"
)

// releaseFiles serves binaries by path and signs manifests for them.
type releaseFiles struct {
	key release.Key
	srv *httptest.Server
	mu  sync.Mutex
	bin map[string][]byte
}

func newReleaseFiles(t *testing.T) *releaseFiles {
	t.Helper()
	key, _, err := release.GenerateKey(release.AlgEd25519)
	require.NoError(t, err)
	r := &releaseFiles{key: key, bin: map[string][]byte{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		b, ok := r.bin[req.URL.Path]
		r.mu.Unlock()
		if !ok {
			http.NotFound(w, req)
			return
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// serve publishes body at path and returns its URL.
func (r *releaseFiles) serve(path string, body []byte) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bin[path] = body
	return r.srv.URL + path
}

// manifest signs, with key, a release of version whose binary for this
// platform is bin.
func signRelease(t *testing.T, key release.Key, version string, bin []byte) string {
	t.Helper()
	sum := sha256.Sum256(bin)
	name := "bcd-" + agent.Platform()
	m := release.Manifest{
		Schema: release.Schema, Version: version, MinControlPlaneVersion: "v0.0.1", CreatedAt: time.Now(),
		Binaries: []release.Binary{{
			Platform: agent.Platform(), Name: name, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(bin)),
			SBOM: release.File{Name: release.SBOMName(name), SHA256: hex.EncodeToString(sum[:]), Size: 1},
		}},
	}
	env, err := release.Sign(m, key)
	require.NoError(t, err)
	return string(env)
}

// fakeBcd is a "binary" that answers `version` with version.
func fakeBcd(version string) []byte {
	return []byte("#!/bin/sh\n[ \"$1\" = version ] && echo " + version + "\n")
}

// upgradeRig is a joined agent of version v1.0.0 whose executable is a
// fake bcd in its own directory, trusting rel's key, with its re-exec
// replaced by a channel.
type upgradeRig struct {
	b      *bundle
	rel    *releaseFiles
	exe    string
	reexec chan string
}

func newUpgradeRig(t *testing.T) *upgradeRig {
	t.Helper()
	r := &upgradeRig{b: setup(t), rel: newReleaseFiles(t), reexec: make(chan string, 4)}
	r.exe = filepath.Join(t.TempDir(), "bcd")
	require.NoError(t, os.WriteFile(r.exe, fakeBcd("v1.0.0"), 0o755))
	return r
}

// start runs an agent of version on the rig's state dir.
func (r *upgradeRig) start(t *testing.T, version string, opts ...func(*agent.Config)) (*agent.Agent, func()) {
	t.Helper()
	a := r.b.newAgent(t, append([]func(*agent.Config){func(c *agent.Config) {
		c.Version, c.Executable = version, r.exe
		c.ReleaseKeys = []release.PublicKey{r.rel.key.Public}
		c.Reexec = func(path string) error { r.reexec <- path; return nil }
	}}, opts...)...)
	if !a.Joined() {
		require.NoError(t, a.Join(context.Background(), r.b.gw.token))
	}
	return a, run(t, a)
}

func readUpgradeJSON(t *testing.T, stateDir string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, "upgrade.json"))
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

func fileIs(t *testing.T, path string, want []byte, msg string) {
	t.Helper()
	got, err := os.ReadFile(path)
	require.NoError(t, err, msg)
	require.Equal(t, string(want), string(got), msg)
}

// Each refusal has its code and leaves the executable as it was: no key
// configured, an untrusted key, a tampered binary, a binary that is not
// the release's version, an unreachable URL, bad params; the release bcd
// already runs is a success that restarts nothing.
func TestDaemonUpgradeRefusals(t *testing.T) {
	t.Parallel()
	r := newUpgradeRig(t)
	_, _ = r.start(t, "v1.0.0")
	hello := r.b.gw.hello(t)
	require.Contains(t, hello.GetCapabilities(), agent.CapDaemonUpgrade)

	good := fakeBcd("v1.2.0")
	goodURL := r.rel.serve("/v1.2.0/bcd", good)
	manifest := signRelease(t, r.rel.key, "v1.2.0", good)
	other, _, err := release.GenerateKey(release.AlgEd25519)
	require.NoError(t, err)
	tampered := append([]byte(nil), good...)
	tampered[len(tampered)-2] = 'X'
	wrongVersion := fakeBcd("v1.1.9")

	seq := uint64(0)
	send := func(kind string, p map[string]any) *agentv1.CommandUpdate {
		t.Helper()
		seq++
		r.b.gw.command(&agentv1.Command{Id: "up-" + string(rune('a'+seq)), Seq: seq, Kind: kind, Params: params(t, p)})
		u, _ := r.b.gw.finalUpdate(t, seq)
		return u
	}
	for _, tt := range []struct {
		name, code string
		params     map[string]any
	}{
		{"another key signed it", agent.FailReleaseUntrusted, map[string]any{"manifest": signRelease(t, other, "v1.2.0", good), "url": goodURL}},
		{"not a manifest", agent.FailReleaseInvalid, map[string]any{"manifest": `{"payload_type":"x"}`, "url": goodURL}},
		{"tampered binary", agent.FailDigestMismatch, map[string]any{"manifest": manifest, "url": r.rel.serve("/tampered", tampered)}},
		{"longer binary", agent.FailDigestMismatch, map[string]any{"manifest": manifest, "url": r.rel.serve("/longer", append(append([]byte(nil), good...), '\n'))}},
		{"not found", agent.FailDownload, map[string]any{"manifest": manifest, "url": r.rel.srv.URL + "/nothing"}},
		{"binary of another version", agent.FailProbe, map[string]any{"manifest": signRelease(t, r.rel.key, "v1.2.0", wrongVersion), "url": r.rel.serve("/wrong", wrongVersion)}},
		{"no manifest", agent.FailInvalidParams, map[string]any{"url": goodURL}},
		{"relative url", agent.FailInvalidParams, map[string]any{"manifest": manifest, "url": "/v1.2.0/bcd"}},
		{"file url", agent.FailInvalidParams, map[string]any{"manifest": manifest, "url": "file:///usr/bin/bcd"}},
		{"unknown param", agent.FailInvalidParams, map[string]any{"manifest": manifest, "url": goodURL, "force": true}},
		{"fractional revert", agent.FailInvalidParams, map[string]any{"manifest": manifest, "url": goodURL, "revert_after_seconds": 1.5}},
		{"zero revert", agent.FailInvalidParams, map[string]any{"manifest": manifest, "url": goodURL, "revert_after_seconds": 0}},
	} {
		u := send(agent.KindDaemonUpgrade, tt.params)
		require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState(), tt.name)
		require.Equal(t, tt.code, u.GetFailureCode(), "%s: %s", tt.name, u.GetMessage())
		fileIs(t, r.exe, fakeBcd("v1.0.0"), tt.name+": the executable is untouched")
		require.NoFileExists(t, r.exe+".prev", tt.name)
		require.NoFileExists(t, filepath.Join(r.b.stateDir, "upgrade.json"), tt.name)
		entries, err := os.ReadDir(filepath.Dir(r.exe))
		require.NoError(t, err)
		require.Len(t, entries, 1, "%s: no download is left beside the executable", tt.name)
	}

	// The version bcd runs: nothing to do.
	u := send(agent.KindDaemonUpgrade, map[string]any{"manifest": signRelease(t, r.rel.key, "v1.0.0", fakeBcd("v1.0.0")), "url": goodURL})
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.Equal(t, map[string]any{"from_version": "v1.0.0", "to_version": "v1.0.0", "restarting": false}, u.GetResult().AsMap())

	// Nothing was kept: a rollback has nothing to go back to.
	u = send(agent.KindDaemonRollback, map[string]any{"to_version": "v0.9.0"})
	require.Equal(t, agent.FailNoPrevious, u.GetFailureCode(), u.GetMessage())
	u = send(agent.KindDaemonRollback, map[string]any{"to_version": "v1.0.0"})
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.Equal(t, false, u.GetResult().AsMap()["restarting"])
	u = send(agent.KindDaemonRollback, map[string]any{})
	require.Equal(t, agent.FailInvalidParams, u.GetFailureCode(), u.GetMessage())
	require.Empty(t, r.reexec, "nothing re-executed")
}

// A bcd that trusts no release key says so in its Hello and refuses every
// upgrade.
func TestDaemonUpgradeWithoutKeys(t *testing.T) {
	t.Parallel()
	r := newUpgradeRig(t)
	_, _ = r.start(t, "v1.0.0", func(c *agent.Config) { c.ReleaseKeys = nil })
	require.NotContains(t, r.b.gw.hello(t).GetCapabilities(), agent.CapDaemonUpgrade)
	good := fakeBcd("v1.2.0")
	r.b.gw.command(&agentv1.Command{Id: "u1", Seq: 1, Kind: agent.KindDaemonUpgrade, Params: params(t, map[string]any{
		"manifest": signRelease(t, r.rel.key, "v1.2.0", good), "url": r.rel.serve("/bcd", good),
	})})
	u, _ := r.b.gw.finalUpdate(t, 1)
	require.Equal(t, agent.FailReleaseUntrusted, u.GetFailureCode(), u.GetMessage())
	require.Contains(t, u.GetMessage(), "--release-pubkey")
}

// upgrade sends daemon.upgrade to v1.2.0 and checks what it installed:
// the new binary at the executable, the old one kept, upgrade.json
// pending, and the re-exec after the final update.
func (r *upgradeRig) upgrade(t *testing.T, seq uint64, revertAfter int) {
	t.Helper()
	good := fakeBcd("v1.2.0")
	r.b.gw.command(&agentv1.Command{Id: "upgrade", Seq: seq, Kind: agent.KindDaemonUpgrade, Params: params(t, map[string]any{
		"manifest": signRelease(t, r.rel.key, "v1.2.0", good), "url": r.rel.serve("/v1.2.0/bcd", good),
		"revert_after_seconds": revertAfter, "rollout": "rol_1",
	})})
	u, _ := r.b.gw.finalUpdate(t, seq)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.Equal(t, map[string]any{"from_version": "v1.0.0", "to_version": "v1.2.0", "restarting": true}, u.GetResult().AsMap())
	// The session is left with a goodbye, then the process re-execs.
	require.Equal(t, "restart", bctest.Receive(t, "goodbye", r.b.gw.goodbyes).GetReason())
	require.Equal(t, r.exe, bctest.Receive(t, "re-exec", r.reexec))
	fileIs(t, r.exe, good, "the executable is the new release")
	fileIs(t, r.exe+".prev", fakeBcd("v1.0.0"), "the previous binary is kept")
	st, err := os.Stat(r.exe)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), st.Mode().Perm())
	rec := readUpgradeJSON(t, r.b.stateDir)
	require.Equal(t, "pending", rec["state"])
	require.Equal(t, "v1.0.0", rec["previous_version"])
	require.Equal(t, r.exe+".prev", rec["previous"])
	require.Equal(t, "v1.2.0", rec["to_version"])
	require.EqualValues(t, revertAfter, rec["revert_after_seconds"])
}

// The whole way: upgrade, restart as the new version, a session confirms
// it; roll back to the kept version, and a rollback to a version not kept
// is refused.
func TestDaemonUpgradeAndRollback(t *testing.T) {
	t.Parallel()
	r := newUpgradeRig(t)
	_, stop := r.start(t, "v1.0.0")
	r.b.gw.hello(t)
	r.upgrade(t, 1, 120)
	stop()

	// The re-exec'd process: the new version, on probation until its
	// session.
	_, stop = r.start(t, "v1.2.0")
	require.Equal(t, "v1.2.0", r.b.gw.hello(t).GetAgentVersion())
	bctest.WaitFor(t, "upgrade confirmed", func() bool { return readUpgradeJSON(t, r.b.stateDir)["state"] == "confirmed" })

	r.b.gw.command(&agentv1.Command{Id: "rb-other", Seq: 2, Kind: agent.KindDaemonRollback, Params: params(t, map[string]any{"to_version": "v0.9.0"})})
	u, _ := r.b.gw.finalUpdate(t, 2)
	require.Equal(t, agent.FailNoPrevious, u.GetFailureCode())
	require.Contains(t, u.GetMessage(), "v1.0.0")

	r.b.gw.command(&agentv1.Command{Id: "rb", Seq: 3, Kind: agent.KindDaemonRollback, Params: params(t, map[string]any{"to_version": "v1.0.0", "rollout": "rol_1"})})
	u, _ = r.b.gw.finalUpdate(t, 3)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.Equal(t, map[string]any{"from_version": "v1.2.0", "to_version": "v1.0.0", "restarting": true}, u.GetResult().AsMap())
	require.Equal(t, r.exe, bctest.Receive(t, "re-exec", r.reexec))
	fileIs(t, r.exe, fakeBcd("v1.0.0"), "the previous binary is back")
	fileIs(t, r.exe+".prev", fakeBcd("v1.2.0"), "the one it replaced is kept")
	rec := readUpgradeJSON(t, r.b.stateDir)
	require.Equal(t, "rolled_back", rec["state"])
	require.Equal(t, "v1.2.0", rec["previous_version"])
	stop()

	// A kept binary that changed on disk is not put back.
	_, _ = r.start(t, "v1.0.0")
	r.b.gw.hello(t)
	require.NoError(t, os.WriteFile(r.exe+".prev", fakeBcd("v6.6.6"), 0o755))
	r.b.gw.command(&agentv1.Command{Id: "rb-changed", Seq: 4, Kind: agent.KindDaemonRollback, Params: params(t, map[string]any{"to_version": "v1.2.0"})})
	u, _ = r.b.gw.finalUpdate(t, 4)
	require.Equal(t, agent.FailNoPrevious, u.GetFailureCode())
	require.Contains(t, u.GetMessage(), "sha256")
	fileIs(t, r.exe, fakeBcd("v1.0.0"), "the executable is untouched")
}

// An upgraded bcd that establishes no session within revert_after_seconds
// puts the previous binary back by itself and re-execs it.
func TestDaemonUpgradeWatchdogReverts(t *testing.T) {
	t.Parallel()
	r := newUpgradeRig(t)
	_, stop := r.start(t, "v1.0.0")
	r.b.gw.hello(t)
	r.upgrade(t, 1, 1)
	stop()

	// The gateway takes the new version's Hello and never answers it.
	r.b.gw.mu.Lock()
	r.b.gw.silent = 1 << 20
	r.b.gw.mu.Unlock()
	_, _ = r.start(t, "v1.2.0")
	require.Equal(t, "v1.2.0", r.b.gw.hello(t).GetAgentVersion())
	require.Equal(t, r.exe, bctest.Receive(t, "re-exec of the previous binary", r.reexec))
	fileIs(t, r.exe, fakeBcd("v1.0.0"), "the previous binary is back")
	fileIs(t, r.exe+".prev", fakeBcd("v1.2.0"), "the failed one is kept")
	rec := readUpgradeJSON(t, r.b.stateDir)
	require.Equal(t, "reverted", rec["state"])
	require.Equal(t, "v1.0.0", rec["to_version"])
	require.Contains(t, rec["reason"], "no session within 1s")
}

// A bcd that restarts as the version it was upgraded to and gets its
// session keeps it, however short the deadline was.
func TestDaemonUpgradeConfirmedBySession(t *testing.T) {
	t.Parallel()
	r := newUpgradeRig(t)
	_, stop := r.start(t, "v1.0.0")
	r.b.gw.hello(t)
	r.upgrade(t, 1, 1)
	stop()
	_, stop = r.start(t, "v1.2.0")
	r.b.gw.hello(t)
	bctest.WaitFor(t, "upgrade confirmed", func() bool { return readUpgradeJSON(t, r.b.stateDir)["state"] == "confirmed" })
	// Past the deadline nothing is reverted: a heartbeat or two later the
	// executable is still the new one.
	r.b.gw.await(t, "heartbeat", func(m *agentv1.AgentMessage) bool { return m.GetHeartbeat() != nil })
	r.b.gw.await(t, "heartbeat", func(m *agentv1.AgentMessage) bool { return m.GetHeartbeat() != nil })
	stop()
	require.Empty(t, r.reexec)
	fileIs(t, r.exe, fakeBcd("v1.2.0"), "the new binary stays")
}
