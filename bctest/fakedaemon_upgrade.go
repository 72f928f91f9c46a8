package bctest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/release"
)

// Command kinds of bcd's self-upgrade, and their failure codes.
const (
	KindDaemonUpgrade  = "daemon.upgrade"
	KindDaemonRollback = "daemon.rollback"

	FailReleaseUntrusted = "RELEASE_UNTRUSTED"
	FailReleaseInvalid   = "RELEASE_INVALID"
	FailDownload         = "DOWNLOAD_FAILED"
	FailNoPrevious       = "NO_PREVIOUS"
)

// daemonCommands applies daemon.upgrade and daemon.rollback as bcd does,
// but without a binary: the manifest is verified for real, the download
// and probe are skipped, and the "re-exec" builds a new agent on the same
// state dir reporting the new version, after the final update is on
// record (the agent's command log resends it to the new session if the
// old one closed first).
type daemonCommands struct{ d *FakeDaemon }

func (h daemonCommands) Apply(ctx context.Context, c *agentv1.Command) (*structpb.Struct, error) {
	d := h.d
	cur := d.version()
	switch c.GetKind() {
	case KindDaemonUpgrade:
		f := c.GetParams().GetFields()
		if len(d.cfg.ReleaseKeys) == 0 {
			return nil, agent.CommandError(FailReleaseUntrusted, errors.New("no release public key is configured"))
		}
		m, _, err := release.Verify([]byte(f["manifest"].GetStringValue()), d.cfg.ReleaseKeys)
		switch {
		case errors.Is(err, release.ErrUnknownKey), errors.Is(err, release.ErrBadSignature):
			return nil, agent.CommandError(FailReleaseUntrusted, err)
		case err != nil:
			return nil, agent.CommandError(FailReleaseInvalid, err)
		}
		if _, ok := m.Binary("linux-" + runtime.GOARCH); !ok {
			return nil, agent.CommandError(FailReleaseInvalid, fmt.Errorf("release %s has no linux-%s binary", m.Version, runtime.GOARCH))
		}
		if m.Version == cur {
			return structpb.NewStruct(map[string]any{"from_version": cur, "to_version": cur, "restarting": false})
		}
		if f["url"].GetStringValue() == "" {
			return nil, agent.CommandError(FailDownload, errors.New("params: url is required"))
		}
		d.reexecAfter(c.GetSeq(), m.Version, cur)
		return structpb.NewStruct(map[string]any{"from_version": cur, "to_version": m.Version, "restarting": true})
	case KindDaemonRollback:
		to := c.GetParams().GetFields()["to_version"].GetStringValue()
		if to == cur {
			return structpb.NewStruct(map[string]any{"restarting": false})
		}
		if prev := d.cfg.PreviousVersion; prev == "" || prev != to {
			return nil, agent.CommandError(FailNoPrevious, fmt.Errorf("the kept binary is %q, not %s", prev, to))
		}
		d.reexecAfter(c.GetSeq(), to, cur)
		return structpb.NewStruct(map[string]any{"from_version": cur, "to_version": to, "restarting": true})
	}
	return nil, agent.CommandError(agent.FailUnknownKind, fmt.Errorf("unknown command kind %q", c.GetKind()))
}

// version is bcd's version as the node reports it.
func (d *FakeDaemon) version() string {
	if d.cfg.Version == "" {
		return "sim"
	}
	return d.cfg.Version
}

// Version is the version the node runs now (Hello.agent_version).
func (d *FakeDaemon) Version() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.version()
}

// reexecAfter restarts the node on version once the command with seq is
// recorded as applied, keeping prev as the binary to roll back to.
func (d *FakeDaemon) reexecAfter(seq uint64, version, prev string) {
	a := d.Agent
	go func() {
		// The command log records the final update right after Apply
		// returns; bcd re-execs only after that.
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for a.LastAppliedSeq() < seq {
			<-tick.C
		}
		if err := d.reexec(version, prev); err != nil {
			d.cfg.Logger.Error("fake daemon: re-exec", "version", version, "err", err)
		}
	}()
}

func (d *FakeDaemon) reexec(version, prev string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return nil
	}
	if err := d.stopLocked(); err != nil {
		return err
	}
	d.cfg.Version, d.cfg.PreviousVersion = version, prev
	bad := d.cfg.BadVersions[version]
	if bad == VersionGone {
		return nil
	}
	if err := d.build(); err != nil {
		return err
	}
	if bad == VersionFinding {
		// Held by the agent and sent in its first status report.
		d.ReportHealthEvent(&agentv1.HealthEvent{Kind: "gpu.xid", Code: 13, Severity: "error", Message: "bad release " + version})
	}
	d.startLocked()
	return nil
}
