package providerpools

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/providers"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

// Reconcile is the level-triggered pass over every provider instance:
// booting instances whose server's bcd joined turn running (and those
// whose tokens all expired unused fail); then, per account, the servers
// the provider lists are matched with the rows: a server no live instance
// owns is deleted (an orphan), and a live instance whose server is gone is
// given a new one while it never joined, or reported lost once it had.
// It returns how many things it changed.
func (m *Module) Reconcile(ctx context.Context) (int, error) {
	var open []Row
	if err := m.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		open, err = listOpen(ctx, tx)
		return err
	}); err != nil {
		return 0, err
	}
	changed := 0
	for _, r := range open {
		if r.ServerID == "" || r.Desired == DesiredDeleted {
			continue
		}
		n, err := m.checkJoined(ctx, r.InstanceID)
		if err != nil {
			return changed, err
		}
		changed += n
	}
	var accounts []string
	if err := m.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		accounts, err = accountsInUse(ctx, tx)
		return err
	}); err != nil {
		return changed, err
	}
	var errs []error
	for _, id := range accounts {
		n, err := m.reconcileAccount(ctx, id)
		changed += n
		if err != nil {
			// One account's outage does not hold the others back.
			m.cfg.Logger.Warn("provider pools: reconcile account", "account_id", id, "err", err)
			errs = append(errs, err)
		}
	}
	return changed, errors.Join(errs...)
}

func (m *Module) checkJoined(ctx context.Context, instanceID string) (int, error) {
	n := 0
	err := m.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		r, err := get(ctx, tx, instanceID, store.ForUpdate(tx))
		if err != nil {
			return err
		}
		in, err := vps.InstanceByID(ctx, tx, instanceID, store.ForUpdate(tx))
		if err != nil {
			return err
		}
		evs, err := m.joinedTx(ctx, tx, &r, &in, m.cfg.Clock.Now())
		if err != nil || len(evs) == 0 {
			return err
		}
		n = 1
		return m.cfg.Recorder.InsertEvents(ctx, tx, evs)
	})
	return n, err
}

// reconcileAccount matches one account's servers with its rows. The
// servers are listed before the rows are read: a row always commits before
// its server is asked for, so a server listed is never mistaken for an
// orphan of a row not yet read.
func (m *Module) reconcileAccount(ctx context.Context, accountID string) (int, error) {
	p, a, err := m.provider(ctx, accountID)
	if err != nil {
		return 0, err
	}
	servers, err := p.List(ctx)
	if err != nil {
		return 0, fmt.Errorf("list %s's servers: %w", a.Name, err)
	}
	var rows []Row
	if err := m.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err = listAccount(ctx, tx, accountID)
		return err
	}); err != nil {
		return 0, err
	}
	byID := make(map[string]Row, len(rows))
	for _, r := range rows {
		byID[r.InstanceID] = r
	}
	listed := map[string]bool{}
	changed := 0
	for _, srv := range servers {
		if srv.InstanceID == "" {
			continue
		}
		listed[srv.InstanceID] = true
		r, ok := byID[srv.InstanceID]
		if ok && !r.Done {
			continue // its instance's: converge deletes it when the instance goes
		}
		if err := p.Delete(ctx, srv.InstanceID); err != nil {
			return changed, fmt.Errorf("delete orphan server %s: %w", srv.ID, err)
		}
		changed++
		tenant := a.TenantID
		if ok {
			tenant = r.TenantID
		}
		if err := m.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			return m.cfg.Recorder.InsertEvents(ctx, tx, []envelope.Event{{Type: "provider.server_orphan_deleted", TenantID: tenant,
				ResourceType: "ProviderAccount", ResourceID: a.ID,
				Data: map[string]any{"server_id": srv.ID, "instance_id": srv.InstanceID, "name": srv.Name}}})
		}); err != nil {
			return changed, err
		}
	}
	for _, r := range rows {
		if r.Done || r.ServerID == "" || r.Desired == DesiredDeleted || listed[r.InstanceID] {
			continue
		}
		// A list can miss a server made after it: ask for this one.
		if _, err := p.Get(ctx, r.InstanceID); !errors.Is(err, providers.ErrNotFound) {
			if err != nil {
				return changed, fmt.Errorf("get the server of %s: %w", r.InstanceID, err)
			}
			continue
		}
		if err := m.serverGone(ctx, r.InstanceID); err != nil {
			return changed, err
		}
		changed++
	}
	return changed, nil
}

// serverGone handles a live instance whose server the provider no longer
// has: one that never joined gets a new server; one that had is lost (its
// disk went with the server), reported and no longer metered.
func (m *Module) serverGone(ctx context.Context, instanceID string) error {
	return m.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		r, err := get(ctx, tx, instanceID, store.ForUpdate(tx))
		if err != nil || r.Done || r.ServerID == "" || r.Desired == DesiredDeleted {
			return err
		}
		in, err := vps.InstanceByID(ctx, tx, instanceID, store.ForUpdate(tx))
		if err != nil {
			return err
		}
		now := m.cfg.Clock.Now()
		gone := r.ServerID
		from := in.State
		var ev envelope.Event
		if in.State == vps.StateBooting || in.State == vps.StatePending {
			r.ServerID, r.Attempts = "", r.Attempts+1
			in.State, in.ProviderServerID, in.Address = vps.StatePending, "", ""
			ev = instanceEvent("instance.server_recreating", &in, map[string]any{"gone_server_id": gone})
		} else {
			in.State, in.Message = vps.StateLost, truncate("server "+gone+" is gone at the provider")
			if r.ActiveSince != nil && r.ActiveUntil == nil {
				r.ActiveUntil = &now
			}
			ev = instanceEvent("instance.lost", &in, map[string]any{"gone_server_id": gone})
		}
		in.UpdateTime, r.UpdateTime = now, now
		if ok, err := vps.InstanceSave(ctx, tx, &in, from); err != nil || !ok {
			return errors.Join(err, errMoved(ok))
		}
		done := in.State == vps.StateLost
		if err := save(ctx, tx, &r, done); err != nil {
			return err
		}
		if done {
			if err := m.revokeUnused(ctx, tx, &in); err != nil {
				return err
			}
		} else if err := m.enqueue(ctx, tx, in.ID); err != nil {
			return err
		}
		return m.cfg.Recorder.InsertEvents(ctx, tx, []envelope.Event{ev})
	})
}

// CloudInit is the user data of a provider pool's server: it writes the
// join token where only root reads it and starts bcd, which joins once and
// removes the token file. The image must carry bcd at /usr/local/bin/bcd
// (docs/providers.md). The document is a secret: never logged.
func CloudInit(token, gateway string, sshKeys []string) string {
	var b strings.Builder
	b.WriteString("#cloud-config\n")
	if len(sshKeys) > 0 {
		b.WriteString("ssh_authorized_keys:\n")
		for _, k := range sshKeys {
			fmt.Fprintf(&b, "  - %q\n", k)
		}
	}
	b.WriteString("write_files:\n")
	b.WriteString("  - path: /etc/bcd/join.env\n    permissions: \"0600\"\n    content: |\n")
	fmt.Fprintf(&b, "      BCD_JOIN_TOKEN=%s\n", token)
	b.WriteString("  - path: /etc/systemd/system/bcd.service\n    permissions: \"0644\"\n    content: |\n")
	b.WriteString("      [Unit]\n      Description=Better Compute node agent\n      After=network-online.target\n      Wants=network-online.target\n")
	b.WriteString("      [Service]\n")
	fmt.Fprintf(&b, "      ExecStart=/usr/local/bin/bcd --server %s --token-env-file /etc/bcd/join.env\n", gateway)
	b.WriteString("      EnvironmentFile=-/etc/bcd/join.env\n      Restart=always\n      RestartSec=5\n")
	b.WriteString("      [Install]\n      WantedBy=multi-user.target\n")
	b.WriteString("runcmd:\n  - [systemctl, daemon-reload]\n  - [systemctl, enable, --now, bcd.service]\n")
	return b.String()
}

// TokenFromCloudInit reads the join token back out of CloudInit's document
// (what a simulated server's bcd does with its user data).
func TokenFromCloudInit(userData string) (string, bool) {
	for _, l := range strings.Split(userData, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "BCD_JOIN_TOKEN="); ok {
			return v, true
		}
	}
	return "", false
}
