package metal

// SQL over site_agent_drivers.

import (
	"context"
	"encoding/json"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// SiteDriver is a row of site_agent_drivers: a BMC driver one site agent
// reported.
type SiteDriver struct {
	SiteID       string
	NodeID       string
	Name         string
	Reports      string
	Version      string
	BuiltIn      bool
	Path         string
	Capabilities []string
	ReportTime   time.Time
}

// SiteDriversReplaceParams are a site agent's drivers as its Hello
// reported them.
type SiteDriversReplaceParams struct {
	NodeID     string
	SiteID     string
	Drivers    []SiteDriver
	ReportTime time.Time
}

// SiteDriversReplace makes p.Drivers the agent's drivers: a driver removed
// from its drivers directory is gone with the next Hello.
func SiteDriversReplace(ctx context.Context, tx store.Tx, p *SiteDriversReplaceParams) error {
	if _, err := tx.Exec(ctx, `DELETE FROM site_agent_drivers WHERE node_id = $1`, p.NodeID); err != nil {
		return err
	}
	for _, d := range p.Drivers {
		caps, err := json.Marshal(append([]string{}, d.Capabilities...))
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO site_agent_drivers (node_id, site_id, name, reports, version, built_in, path,
			capabilities, report_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			p.NodeID, p.SiteID, d.Name, d.Reports, d.Version, boolInt(d.BuiltIn), d.Path, string(caps), p.ReportTime); err != nil {
			return err
		}
	}
	return nil
}

// SiteDriverList reads the drivers a site's agents reported, by agent,
// built-ins first, then by name.
func SiteDriverList(ctx context.Context, q store.Querier, siteID string) ([]SiteDriver, error) {
	return siteDrivers(ctx, q, `site_id = $1`, siteID)
}

// SiteDriversOfNode reads the drivers one site agent reported.
func SiteDriversOfNode(ctx context.Context, q store.Querier, nodeID string) ([]SiteDriver, error) {
	return siteDrivers(ctx, q, `node_id = $1`, nodeID)
}

func siteDrivers(ctx context.Context, q store.Querier, where, arg string) ([]SiteDriver, error) {
	rows, err := q.Query(ctx, `SELECT site_id, node_id, name, reports, version, built_in, path, capabilities, report_time
		FROM site_agent_drivers WHERE `+where+` ORDER BY node_id, built_in DESC, name`, arg)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SiteDriver
	for rows.Next() {
		var (
			d       SiteDriver
			builtIn int
			caps    string
		)
		if err := rows.Scan(&d.SiteID, &d.NodeID, &d.Name, &d.Reports, &d.Version, &builtIn, &d.Path, &caps, &d.ReportTime); err != nil {
			return nil, err
		}
		d.BuiltIn = builtIn != 0
		if err := json.Unmarshal([]byte(caps), &d.Capabilities); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}
