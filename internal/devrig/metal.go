package devrig

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/server"
)

// Names dev --sim-machines gives what it makes in tenant sim.
const (
	Site         = "sim-site"
	SampleImage  = "sample"
	devSampleKey = "dev-sample"
)

// devStepDelay is how long each simulated machine step takes: long enough
// to see a machine commissioning, short enough that a whole lifecycle
// takes seconds.
const devStepDelay = 200 * time.Millisecond

// startSimMachines brings up site sim-site in tenant sim with n simulated
// machines (Redfish BMC emulators on loopback behind an in-process site
// agent) and a signed sample image. The machines' identities live in
// <state-dir>/sim-machines.json, so a restart brings the same BMCs back on
// the same ports and enrolls only what the database lacks.
func startSimMachines(ctx context.Context, rt *metal.Runtime, api, adminKey, stateDir string, n int) (*bctest.SimSite, error) {
	c := client.New(api, adminKey)
	if err := ensureSimTenant(ctx, c); err != nil {
		return nil, err
	}
	site, err := c.Sites.Get(ctx, connect.NewRequest(&apiv1.GetSiteRequest{Tenant: "sim", Site: Site}))
	if client.Code(err) == "NOT_FOUND" {
		var cr *connect.Response[apiv1.CreateSiteResponse]
		cr, err = c.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "sim", Name: Site,
			Networks: []string{"127.0.0.0/8"}, Description: "dev --sim-machines: simulated BMCs on loopback"}))
		if err == nil {
			site = &connect.Response[apiv1.GetSiteResponse]{Msg: &apiv1.GetSiteResponse{Site: cr.Msg.GetSite()}}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("site %s: %w", Site, err)
	}
	specsPath := filepath.Join(stateDir, "sim-machines.json")
	var specs []bctest.SimMachineSpec
	switch b, err := os.ReadFile(specsPath); {
	case err == nil:
		if err := json.Unmarshal(b, &specs); err != nil {
			return nil, fmt.Errorf("%s: %w (remove it to start the simulated machines afresh)", specsPath, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	sim := bctest.StartSimSite(rt, site.Msg.GetSite().GetId())
	sim.SetStepDelay(devStepDelay)
	fail := func(err error) (*bctest.SimSite, error) {
		sim.Close()
		return nil, err
	}
	for i := range n {
		var (
			m   *bctest.SimMachine
			err error
		)
		if i < len(specs) {
			m, err = sim.RestoreMachine(specs[i])
		} else {
			m, err = sim.NewMachine(fmt.Sprintf("sim-m%d", i+1))
		}
		if err != nil {
			return fail(fmt.Errorf("%w (the BMC addresses are kept in %s)", err, specsPath))
		}
		if i >= len(specs) {
			specs = append(specs, m.Spec())
		}
		_, err = c.Machines.Get(ctx, connect.NewRequest(&apiv1.GetMachineRequest{Tenant: "sim", Machine: m.Name}))
		if client.Code(err) == "NOT_FOUND" {
			_, err = c.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "sim", Site: Site, Name: m.Name,
				BmcDriver: "redfish", BmcAddress: m.BMCAddress, BmcUsername: m.Username, BmcPassword: m.Password, Mac: m.MAC,
				HardwareProfile: "sim-8xh100"}))
		}
		if err != nil {
			return fail(fmt.Errorf("machine %s: %w", m.Name, err))
		}
	}
	b, err := json.MarshalIndent(specs, "", "  ")
	if err != nil {
		return fail(err)
	}
	// The file holds the simulated BMCs' passwords: private, as the admin
	// key is.
	if err := server.WriteSecretFile(specsPath, string(b)+"\n", true); err != nil {
		return fail(err)
	}
	if err := ensureSampleImage(ctx, c); err != nil {
		return fail(fmt.Errorf("sample image: %w", err))
	}
	return sim, nil
}

// ensureSimTenant creates tenant sim unless it exists.
func ensureSimTenant(ctx context.Context, c *client.Client) error {
	// Look before creating: on a restart it exists, and a create refused
	// ALREADY_EXISTS would be logged on every start.
	if _, err := c.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: "sim"})); client.Code(err) == "NOT_FOUND" {
		if _, err := c.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "sim", DisplayName: "Simulated fleet"})); err != nil && client.Code(err) != "ALREADY_EXISTS" {
			return err
		}
	} else if err != nil {
		return err
	}
	return nil
}

// sampleDisk is the sample image dev puts in the catalog: 64 KiB with an
// MBR boot signature. The simulated ramdisk checks its digest and
// signatures as a real one would, and writes nothing but the digest.
func sampleDisk() []byte {
	b := bytes.Repeat([]byte{0}, 64<<10)
	copy(b, "better-compute dev sample image\n")
	b[510], b[511] = 0x55, 0xaa
	return b
}

// ensureSampleImage pushes the sample image to tenant sim and signs it
// with a key put on sim's allowlist, unless it is there already.
func ensureSampleImage(ctx context.Context, c *client.Client) error {
	if _, err := c.Images.Get(ctx, connect.NewRequest(&apiv1.GetImageRequest{Tenant: "sim", Image: SampleImage})); client.Code(err) != "NOT_FOUND" {
		return err
	}
	disk := sampleDisk()
	sum := sha256.Sum256(disk)
	res, err := c.PushImage(ctx, &apiv1.PushImageHeader{Tenant: "sim", Name: SampleImage, Kind: "raw",
		Sha256: hex.EncodeToString(sum[:]), SizeBytes: int64(len(disk))}, bytes.NewReader(disk), "")
	if err != nil {
		return err
	}
	// A key made for this one signature: its private half is never kept.
	signer, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	if err != nil {
		return err
	}
	if _, err := c.SignerKeys.Add(ctx, connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: "sim", Name: devSampleKey + "-" + shortFingerprint(signer.Public.Fingerprint),
		PublicKey: signer.Public.PEM()})); err != nil {
		return err
	}
	img := res.GetImage()
	sig, err := signer.Sign(imagesig.Payload(img.GetName(), img.GetKind(), img.GetSha256()))
	if err != nil {
		return err
	}
	_, err = c.Images.Sign(ctx, connect.NewRequest(&apiv1.SignImageRequest{Tenant: "sim", Image: img.GetId(),
		KeyFingerprint: signer.Public.Fingerprint, Signature: sig}))
	return err
}

// shortFingerprint is the tail of a key fingerprint, to name the key.
func shortFingerprint(fp string) string {
	if len(fp) > 8 {
		fp = fp[len(fp)-8:]
	}
	return strings.ToLower(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '0'
	}, fp))
}
