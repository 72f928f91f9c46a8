package rollout

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/health"
	"github.com/better-compute/better-compute/internal/store"
)

// Command kinds the controller sends (bcd applies them).
const (
	KindUpgrade  = "daemon.upgrade"
	KindRollback = "daemon.rollback"
)

// Defaults of a rollout's settings.
const (
	DefaultSoak        = 2 * time.Minute
	DefaultRevertAfter = 2 * time.Minute
	// returnMargin is added to revert_after before a node that has not come
	// back halts the rollout: bcd reverts itself at revert_after, and its
	// reconnect takes a moment more.
	returnMargin = time.Minute
	// rollbackTTL bounds a rollback command's wait for its node: a node
	// that reverted by itself comes back within revert_after.
	rollbackTTL = time.Hour
)

// ErrReleaseNotFound is what Releases.Get answers for a version that is
// not published.
var ErrReleaseNotFound = errors.New("release not found")

// Release is what a rollout needs of a published release.
type Release struct {
	Version string
	// Manifest is the signed envelope, the exact text `release sign` wrote.
	Manifest []byte
	// Platforms are the manifest's platforms, "linux-amd64", ….
	Platforms []string
}

// Releases reads published releases (the release store).
type Releases interface {
	// Get reads a release by version; an unknown version is an error that
	// errors.Is ErrReleaseNotFound.
	Get(ctx context.Context, q store.Querier, version string) (Release, error)
}

// Config wires a Module.
type Config struct {
	DB       *store.DB
	Recorder envelope.Recorder
	Clock    clock.Clock
	Logger   *slog.Logger
	// Releases may be set after New (SetReleases).
	Releases Releases
	// Fleet's Notifier and Signer send the commands (SetFleet).
	Fleet fleet.Deps
	// Enqueue inserts a River job in the caller's transaction (SetEnqueue):
	// a command's end wakes the controller.
	Enqueue func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error
	// DownloadBase is the control plane's public base URL, where nodes
	// download releases (/downloads/bcd/{version}/linux-{arch}).
	DownloadBase func() string
	// Interval is the controller's period; default 10 s.
	Interval time.Duration
}

// Module is the rollout module.
type Module struct {
	cfg     Config
	clock   clock.Clock
	log     *slog.Logger
	metrics *metrics
}

// New builds the module.
func New(cfg Config) (*Module, error) {
	if cfg.DB == nil {
		return nil, errors.New("rollout: DB is required")
	}
	m := &Module{cfg: cfg, clock: cmp.Or[clock.Clock](cfg.Clock, cfg.DB.Clock()), log: cmp.Or(cfg.Logger, slog.Default())}
	m.metrics = newMetrics()
	return m, nil
}

// SetReleases hands the module the release store.
func (m *Module) SetReleases(r Releases) { m.cfg.Releases = r }

// SetFleet hands the module the fleet's signer and notifier.
func (m *Module) SetFleet(d fleet.Deps) { m.cfg.Fleet = d }

// SetEnqueue hands the module the job inserter (built after it).
func (m *Module) SetEnqueue(fn func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error) {
	m.cfg.Enqueue = fn
}

// SetDownloadBase sets where nodes download releases from.
func (m *Module) SetDownloadBase(fn func() string) { m.cfg.DownloadBase = fn }

func (m *Module) release(ctx context.Context, q store.Querier, version string) (Release, error) {
	if m.cfg.Releases == nil {
		return Release{}, errors.New("rollout: no release store wired")
	}
	return m.cfg.Releases.Get(ctx, q, version)
}

// wake queues a controller pass in tx.
func (m *Module) wake(ctx context.Context, tx store.Tx) error {
	if m.cfg.Enqueue == nil {
		return nil
	}
	return m.cfg.Enqueue(ctx, tx, ControlArgs{}, &river.InsertOpts{MaxAttempts: 3})
}

func (m *Module) event(ctx context.Context, tx store.Tx, typ string, r *Rollout, now time.Time, data map[string]any) error {
	if m.cfg.Recorder == nil {
		return nil
	}
	d := map[string]any{"rollout_id": r.ID, "release": r.Release, "pool_id": r.PoolID, "pool": r.PoolName, "state": r.State,
		"wave": r.CurrentWave}
	for k, v := range data {
		d[k] = v
	}
	return m.cfg.Recorder.InsertEvents(ctx, tx, []envelope.Event{{Type: typ, ResourceType: "Rollout", ResourceID: r.ID, Time: now, Data: d}})
}

// Control runs one pass over every running or halted rollout, each in a
// transaction of its own; it returns how many it moved.
func (m *Module) Control(ctx context.Context) (int, error) {
	var ids []string
	if err := m.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		ids, err = RolloutIDsInStates(ctx, tx, StateRunning, StateHalted)
		return err
	}); err != nil {
		return 0, err
	}
	moved := 0
	var errs []error
	for _, id := range ids {
		var changed bool
		err := m.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			changed, err = m.step(ctx, tx, id)
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("rollout %s: %w", id, err))
			continue
		}
		if changed {
			moved++
		}
	}
	return moved, errors.Join(errs...)
}

// nodeView is what the controller reads of a node each pass.
type nodeView struct {
	node    fleet.Node
	cmd     fleet.Command
	hasCmd  bool
	finding bool
}

func (m *Module) view(ctx context.Context, tx store.Tx, n *Node, cmdID string) (nodeView, error) {
	var v nodeView
	var err error
	if v.node, err = fleet.NodeGet(ctx, tx, "", n.NodeID); err != nil {
		return v, fmt.Errorf("node %s: %w", n.NodeID, err)
	}
	if cmdID != "" {
		if v.cmd, err = fleet.CommandGet(ctx, tx, "", cmdID); err != nil {
			return v, fmt.Errorf("command %s: %w", cmdID, err)
		}
		v.hasCmd = true
	}
	if n.SendTime != nil {
		c, err := health.OpenFindingsSince(ctx, tx, n.NodeID, *n.SendTime)
		if err != nil {
			return v, err
		}
		v.finding = c > 0
	}
	return v, nil
}

func (v nodeView) on(version string) bool {
	return v.node.Liveness == fleet.LivenessReady && v.node.AgentVersion == version
}

func commandFailed(state string) bool {
	return state == fleet.CommandFailed || state == fleet.CommandCanceled || state == fleet.CommandExpired
}

// step moves one rollout as far as its world allows, in tx.
func (m *Module) step(ctx context.Context, tx store.Tx, id string) (bool, error) {
	r, err := RolloutGetForUpdate(ctx, tx, id)
	if err != nil {
		return false, err
	}
	now := m.clock.Now().UTC()
	switch r.State {
	case StateHalted:
		return m.stepRollback(ctx, tx, &r, now)
	case StateRunning:
		return m.stepRunning(ctx, tx, &r, now)
	}
	return false, nil
}

func (m *Module) stepRunning(ctx context.Context, tx store.Tx, r *Rollout, now time.Time) (bool, error) {
	if r.WaveNotBefore != nil && now.Before(*r.WaveNotBefore) {
		return false, nil
	}
	changed := false
	if r.WaveStartTime == nil {
		r.WaveStartTime, r.WaveNotBefore, r.Message, r.UpdateTime = &now, nil, "", now
		if err := RolloutUpdate(ctx, tx, r); err != nil {
			return false, err
		}
		if err := m.event(ctx, tx, "rollout.wave_started", r, now, map[string]any{"nodes": r.WaveNodes[r.CurrentWave]}); err != nil {
			return false, err
		}
		changed = true
	}
	nodes, err := NodeList(ctx, tx, r.ID, r.CurrentWave)
	if err != nil {
		return false, err
	}
	upgrading := 0
	for i := range nodes {
		n := &nodes[i]
		switch n.State {
		case NodeUpgrading, NodeSoaking:
			v, err := m.view(ctx, tx, n, n.CommandID)
			if err != nil {
				return false, err
			}
			why := m.watch(n, v, r, now)
			if why != "" {
				return true, m.halt(ctx, tx, r, nodes, n, why, now)
			}
			if n.UpdateTime.Equal(now) {
				if err := NodeUpdate(ctx, tx, n); err != nil {
					return false, err
				}
				tx.AfterCommit(func() { m.metrics.nodeMoved(n.State) })
				changed = true
			}
			if n.State == NodeUpgrading {
				upgrading++
			}
		}
	}
	for i := range nodes {
		n := &nodes[i]
		if upgrading >= r.MaxUnavailable {
			break
		}
		if n.State != NodePending {
			continue
		}
		if err := m.sendUpgrade(ctx, tx, r, n, now); err != nil {
			return false, err
		}
		upgrading++
		changed = true
	}
	if slices.ContainsFunc(nodes, func(n Node) bool { return n.State != NodeDone }) {
		return changed, nil
	}
	// The wave is done.
	if err := m.event(ctx, tx, "rollout.wave_completed", r, now, map[string]any{"nodes": len(nodes)}); err != nil {
		return false, err
	}
	tx.AfterCommit(m.metrics.waveCompleted)
	r.UpdateTime, r.WaveStartTime = now, nil
	if r.CurrentWave == len(r.WaveNodes)-1 {
		r.State, r.EndTime, r.Message = StateCompleted, &now, ""
		if err := RolloutUpdate(ctx, tx, r); err != nil {
			return false, err
		}
		return true, m.event(ctx, tx, "rollout.completed", r, now, nil)
	}
	r.CurrentWave++
	nb := now.Add(r.PauseBetween)
	r.WaveNotBefore = &nb
	if r.PauseBetween > 0 {
		r.Message = fmt.Sprintf("wave %d starts at %s", r.CurrentWave+1, nb.Format(time.RFC3339))
	}
	if err := RolloutUpdate(ctx, tx, r); err != nil {
		return false, err
	}
	if r.PauseBetween == 0 {
		// The next wave starts in this pass.
		_, err := m.stepRunning(ctx, tx, r, now)
		return true, err
	}
	return true, nil
}

// watch moves an upgrading or soaking node on (setting UpdateTime to now
// when it did) and returns why the rollout must halt, or "".
func (m *Module) watch(n *Node, v nodeView, r *Rollout, now time.Time) string {
	if v.finding {
		return fmt.Sprintf("node %s: a health finding opened after its upgrade", n.NodeName)
	}
	switch n.State {
	case NodeUpgrading:
		if v.hasCmd && commandFailed(v.cmd.State) {
			return fmt.Sprintf("node %s: %s %s: %s %s", n.NodeName, KindUpgrade, v.cmd.State, v.cmd.FailureCode, v.cmd.Message)
		}
		if v.hasCmd && v.cmd.State == fleet.CommandSucceeded && v.on(r.Release) {
			n.State, n.SoakTime, n.UpdateTime = NodeSoaking, &now, now
			if r.Soak == 0 {
				n.State = NodeDone
			}
			return ""
		}
		if n.SendTime != nil && now.After(n.SendTime.Add(r.Revert+returnMargin)) {
			return fmt.Sprintf("node %s: not back on %s within %s of its upgrade", n.NodeName, r.Release, r.Revert+returnMargin)
		}
	case NodeSoaking:
		if v.node.AgentVersion != r.Release && v.node.AgentVersion != "" {
			return fmt.Sprintf("node %s: runs %s again while soaking on %s", n.NodeName, v.node.AgentVersion, r.Release)
		}
		if !v.on(r.Release) {
			// Down while soaking: the soak starts again when it is back,
			// unless it stays away past the deadline.
			if now.After(n.SoakTime.Add(r.Revert + returnMargin)) {
				return fmt.Sprintf("node %s: %s while soaking", n.NodeName, v.node.Liveness)
			}
			return ""
		}
		if !now.Before(n.SoakTime.Add(r.Soak)) {
			n.State, n.UpdateTime = NodeDone, now
		}
	}
	return ""
}

func (m *Module) sendUpgrade(ctx context.Context, tx store.Tx, r *Rollout, n *Node, now time.Time) error {
	rel, err := m.release(ctx, tx, r.Release)
	if err != nil {
		return fmt.Errorf("release %s: %w", r.Release, err)
	}
	node, err := fleet.NodeGet(ctx, tx, "", n.NodeID)
	if err != nil {
		return fmt.Errorf("node %s: %w", n.NodeID, err)
	}
	url := m.downloadURL(r.Release, nodePlatform(node, rel.Platforms))
	id, err := fleet.SendSystemCommand(ctx, tx, m.cfg.Fleet.Notifier, fleet.SystemCommand{
		TenantID: node.TenantID, NodeID: node.ID, Kind: KindUpgrade, CreatedBy: "system:rollout", Time: now, Signer: m.cfg.Fleet.Signer,
		IdempotencyKey: r.ID + "/upgrade/" + node.ID, TTL: r.Revert + returnMargin,
		Params: map[string]any{"manifest": string(rel.Manifest), "url": url, "revert_after_seconds": int64(r.Revert / time.Second), "rollout": r.ID},
	})
	if err != nil {
		return err
	}
	n.FromVersion, n.State, n.CommandID, n.SendTime, n.UpdateTime, n.Message = node.AgentVersion, NodeUpgrading, id, &now, now, ""
	if err := NodeUpdate(ctx, tx, n); err != nil {
		return err
	}
	tx.AfterCommit(func() { m.metrics.nodeMoved(NodeUpgrading) })
	return nil
}

func (m *Module) downloadURL(version, platform string) string {
	base := ""
	if m.cfg.DownloadBase != nil {
		base = strings.TrimRight(m.cfg.DownloadBase(), "/")
	}
	return base + "/downloads/bcd/" + version + "/" + platform
}

// nodePlatform picks the release platform of a node: its arch label
// (kubernetes.io/arch or arch, as joined or reported) when set, else
// linux-amd64, or the release's only platform.
func nodePlatform(n fleet.Node, platforms []string) string {
	arch := ""
	for _, labels := range []string{n.Labels, n.ReportedLabels} {
		var l map[string]string
		if json.Unmarshal([]byte(labels), &l) == nil {
			arch = cmp.Or(arch, l["kubernetes.io/arch"], l["arch"])
		}
	}
	if arch != "" {
		return "linux-" + arch
	}
	if len(platforms) == 1 {
		return platforms[0]
	}
	return "linux-amd64"
}

// halt stops the rollout at failed: it is marked failed, and every node of
// the wave the rollout sent an upgrade gets a daemon.rollback to the
// version it ran before.
func (m *Module) halt(ctx context.Context, tx store.Tx, r *Rollout, wave []Node, failed *Node, why string, now time.Time) error {
	m.log.Warn("rollout halted", "rollout", r.ID, "reason", why)
	failed.State, failed.Message = NodeFailed, why
	rolling := 0
	for i := range wave {
		n := &wave[i]
		if n.NodeID == failed.NodeID {
			n = failed
		}
		if n.CommandID == "" {
			continue
		}
		node, err := fleet.NodeGet(ctx, tx, "", n.NodeID)
		if err != nil {
			return fmt.Errorf("node %s: %w", n.NodeID, err)
		}
		id, err := fleet.SendSystemCommand(ctx, tx, m.cfg.Fleet.Notifier, fleet.SystemCommand{
			TenantID: node.TenantID, NodeID: n.NodeID, Kind: KindRollback, CreatedBy: "system:rollout", Time: now, Signer: m.cfg.Fleet.Signer,
			IdempotencyKey: r.ID + "/rollback/" + n.NodeID, TTL: rollbackTTL,
			Params: map[string]any{"to_version": n.FromVersion, "rollout": r.ID},
		})
		if err != nil {
			return err
		}
		n.RollbackCmdID, n.UpdateTime = id, now
		if err := NodeUpdate(ctx, tx, n); err != nil {
			return err
		}
		rolling++
	}
	r.State, r.Message, r.UpdateTime = StateHalted, why, now
	if err := RolloutUpdate(ctx, tx, r); err != nil {
		return err
	}
	tx.AfterCommit(func() { m.metrics.halted(); m.metrics.nodeMoved(NodeFailed) })
	return m.event(ctx, tx, "rollout.halted", r, now, map[string]any{"reason": why, "node": failed.NodeName, "node_id": failed.NodeID,
		"rolling_back": rolling})
}

// stepRollback watches a halted rollout's rollbacks: a node back on its
// from_version is rolled back; when all are, so is the rollout.
func (m *Module) stepRollback(ctx context.Context, tx store.Tx, r *Rollout, now time.Time) (bool, error) {
	nodes, err := NodeList(ctx, tx, r.ID, r.CurrentWave)
	if err != nil {
		return false, err
	}
	changed, waiting := false, 0
	for i := range nodes {
		n := &nodes[i]
		if n.RollbackCmdID == "" || n.RolledBack {
			continue
		}
		v, err := m.view(ctx, tx, &Node{NodeID: n.NodeID}, n.RollbackCmdID)
		if err != nil {
			return false, err
		}
		if v.cmd.State == fleet.CommandSucceeded && v.on(n.FromVersion) {
			n.RolledBack, n.UpdateTime = true, now
			if n.State != NodeFailed {
				n.State = NodeRolledBack
			}
			if err := NodeUpdate(ctx, tx, n); err != nil {
				return false, err
			}
			tx.AfterCommit(func() { m.metrics.nodeMoved(NodeRolledBack) })
			changed = true
			continue
		}
		waiting++
	}
	if waiting > 0 {
		return changed, nil
	}
	r.State, r.EndTime, r.UpdateTime = StateRolledBack, &now, now
	if err := RolloutUpdate(ctx, tx, r); err != nil {
		return false, err
	}
	return true, m.event(ctx, tx, "rollout.rolled_back", r, now, map[string]any{"reason": r.Message})
}
