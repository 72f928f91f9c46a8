package bctest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/better-compute/better-compute/bctest/redfish"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/nodesig"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/steprecord"
	"github.com/better-compute/better-compute/internal/store"
)

// What a dedicated-root lease's teardown needs of a simulated site: a
// machine whose BMC rotates passwords (IPMI), a firmware inventory the
// ramdisk signs, and BMC steps whose results the site agent signs with a
// node key the control plane's node CA issued, kept as the gateway keeps
// them (commands and node_reports).

// siteSigner is the simulated site agent's node identity.
type siteSigner struct {
	db          *store.DB
	nodeID      string
	tenantID    string
	trustDomain string
	certDER     []byte
	key         crypto.Signer
}

// AddIPMIMachine adds a machine enrolled with an IPMI BMC address on
// loopback that nothing answers: the simulated site plays its power (and
// a password rotation) in memory. BMCAddress is host:port, the ipmi
// driver's form.
func (s *SimSite) AddIPMIMachine(t testing.TB, name string) *SimMachine {
	t.Helper()
	spec := SimMachineSpec{Name: name, Username: "admin", Password: "Ipmi-pw-0001"}
	var b [5]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			t.Fatal(err)
		}
		mac := fmt.Sprintf("52:54:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3])
		if _, dup := simMACs.LoadOrStore(mac, true); !dup {
			spec.MAC = mac
			break
		}
	}
	m := &SimMachine{Name: name, MAC: spec.MAC, Username: spec.Username, Password: spec.Password, Power: &redfish.MemoryPower{},
		BMCDriver: "ipmi", inMemoryBMC: true}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ipmiPorts++
	m.BMCAddress = fmt.Sprintf("127.0.0.%d:623", 10+s.ipmiPorts)
	s.machines[m.BMCAddress] = m
	return m
}

// SetFirmware sets what the machine's ramdisk reports as its firmware
// (BIOS and board); a change between a commissioning and a lease's
// teardown is drift.
func (m *SimMachine) SetFirmware(fw map[string]any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.firmware = fw
}

func (m *SimMachine) firmwareReport() map[string]any {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.firmware == nil {
		return map[string]any{"bios_vendor": "SimBIOS", "bios_version": "1.0.0", "bios_date": "01/01/2026",
			"board_vendor": "Sim", "board_name": "SIM-8XH100", "product_name": "sim-8xh100"}
	}
	return m.firmware
}

// SignSiteReports gives the simulated site agent a node identity of role
// site, issued by the control plane's node CA: from then on each BMC step
// (power, rotation) becomes a command row for that node and its success a
// node-signed report, as bcd --mode site's through the gateway. Without it
// BMC steps leave no signed evidence (a lease's teardown quarantines).
func (s *SimSite) SignSiteReports(t testing.TB, cp *ControlPlane) {
	t.Helper()
	ctx := context.Background()
	var tenantID string
	now := time.Now()
	nodeID := envelope.NewID("node", now)
	must(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		if tenantID, err = metal.SiteTenant(ctx, tx, s.siteID); err != nil {
			return err
		}
		return fleet.NodeInsert(ctx, tx, &fleet.NodeInsertParams{ID: nodeID, Name: "sim-site-" + s.siteID, TenantID: tenantID,
			State: "active", Liveness: "ready", Mode: "site", SiteID: s.siteID, CreateTime: now, LastHeartbeat: &now})
	}))
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: nodeID}}, key)
	must(t, err)
	chain, _, err := cp.PKI.IssueNode(ctx, csr, nodeID, pki.RoleSite, time.Hour)
	must(t, err)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.signer = &siteSigner{db: cp.App.DB, nodeID: nodeID, tenantID: tenantID, trustDomain: cp.PKI.TrustDomain(), certDER: chain[0], key: key}
}

// siteStep reports whether kind is a step the site agent itself carries
// out (a BMC call), not the ramdisk.
func siteStep(kind string) bool {
	switch kind {
	case metal.KindPowerCycle, metal.KindPowerOff, metal.KindPowerOn, metal.KindBMCRotate:
		return true
	}
	return false
}

// command records a BMC step as the command a site agent would be sent
// (and the key's site dispatch, as metal.SiteCommands records it), and
// returns its id (the step's handle).
func (g *siteSigner) command(ctx context.Context, t metal.Target, run provision.StepRun) (string, error) {
	now := time.Now()
	id := envelope.NewID(fleet.CommandIDPrefix, now)
	kind := metal.CommandBMCPower
	if run.Kind == metal.KindBMCRotate {
		kind = metal.CommandBMCRotate
	}
	err := g.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, _, err := fleet.CommandInsert(ctx, tx, &fleet.CommandInsertParams{ID: id, TenantID: g.tenantID, NodeID: g.nodeID, Kind: kind,
			IdempotencyKey: run.IdempotencyKey, CreatedBy: "system:metal", Deadline: now.Add(5 * time.Minute), CreateTime: now}); err != nil {
			return err
		}
		_, _, err := metal.SiteDispatchInsert(ctx, tx, &metal.SiteDispatch{IdempotencyKey: run.IdempotencyKey, SiteID: t.SiteID,
			MachineID: t.MachineID, NodeID: g.nodeID, CommandID: id, CreateTime: now})
		return err
	})
	return id, err
}

// report keeps the site node's signed success for a command.
func (g *siteSigner) report(ctx context.Context, commandID string, result map[string]any) error {
	res, err := structpb.NewStruct(result)
	if err != nil {
		return err
	}
	u := &agentv1.CommandUpdate{CommandId: commandID, State: agentv1.CommandState_COMMAND_STATE_SUCCEEDED, Result: res}
	if err := nodesig.Sign(g.key, g.trustDomain, g.nodeID, u); err != nil {
		return err
	}
	signed, err := nodesig.Bytes(g.trustDomain, g.nodeID, u)
	if err != nil {
		return err
	}
	now := time.Now()
	return g.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return fleet.NodeReportInsert(ctx, tx, fleet.NodeReport{ID: envelope.NewID("nrp", now), NodeID: g.nodeID, Kind: "command.succeeded",
			Subject: commandID, CertDER: g.certDER, Signed: signed, Signature: u.GetNodeSignature(), CreateTime: now})
	})
}

// signStep signs a ramdisk step's output with the running ramdisk's key
// (steprecord), as bcd --mode ramdisk does for inventory and burn-in.
func signStep(key crypto.Signer, t metal.Target, run provision.StepRun, out map[string]any) provision.Result {
	if key == nil {
		return provision.Result{Output: out}
	}
	signed, err := steprecord.Sign(key, steprecord.Record{MachineID: t.MachineID, WorkflowID: run.WorkflowID, Kind: run.Kind,
		Time: time.Now(), Output: out})
	if err != nil {
		return provision.Result{Error: err.Error()}
	}
	return provision.Result{Output: signed}
}
