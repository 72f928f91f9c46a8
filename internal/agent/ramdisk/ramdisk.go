// Package ramdisk is what bcd does in --mode ramdisk, inside the
// commissioning initramfs: it reads the machine's inventory from sysfs,
// wipes its drives and signs what it did (the attested wipe), writes a
// signed image after verifying it, and collects logs.
//
// It carries out only the ramdisk's command kinds; the node agent's
// (allocations, processes, drains) are refused by the agent before they
// reach it. It must never write a drive the command did not name or that
// is not a disk of this machine, and never write an image whose digest
// and signature did not verify first.
package ramdisk

import (
	"cmp"
	"context"
	"crypto"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/steprecord"
)

// Command kinds the ramdisk carries out.
const (
	KindInventoryRefresh = "inventory.refresh"
	KindDiskWipe         = "disk.wipe"
	KindImageWrite       = "image.write"
	KindLogsCollect      = "logs.collect"
	KindConfigure        = "machine.configure"
	KindBurnIn           = "burnin.run"
)

// Kinds lists the ramdisk's command kinds.
func Kinds() []string {
	return []string{KindInventoryRefresh, KindDiskWipe, KindImageWrite, KindConfigure, KindBurnIn, KindLogsCollect}
}

// IsKind reports whether kind is a ramdisk kind.
func IsKind(kind string) bool { return slices.Contains(Kinds(), kind) }

// ErrInvalidParams wraps a command's bad params.
var ErrInvalidParams = errors.New("invalid params")

// Config configures a Ramdisk. Zero values take the defaults noted.
type Config struct {
	// SysfsRoot is where sys/ and proc/ are read from (default "/").
	SysfsRoot string
	// DevRoot is where block device nodes live (default "/dev").
	DevRoot string
	// AllowFileDisks lets disk.wipe and image.write take a regular file
	// as a drive. Only a simulated machine (tests, a rig) may: on a real
	// one every drive is a block device.
	AllowFileDisks bool
	// SpoolDir stages a downloaded image until it verified (default
	// os.TempDir(); in the initramfs a tmpfs, so an image must fit in RAM).
	SpoolDir string
	// TrustedImageKeys are the keys an image must be signed with; none
	// means image.write refuses every image.
	TrustedImageKeys []imagesig.PublicKey
	// ImagesURL is where image.write fetches an image by digest when its
	// command names no url: the site's cache (bc.images= on the kernel
	// command line, "http://SITE/files/sha256").
	ImagesURL string
	// Server is the gateway host:port (or comma-separated list) this
	// ramdisk joined (bc.server=); machine.configure hands it to the
	// deployed OS unless told another.
	Server string
	// HTTP downloads images (default a client with a 1 h timeout).
	HTTP *http.Client
	// Samples is the number of random blocks read back after a wipe
	// (default 64).
	Samples int
	// Logs returns the agent's recent log lines for logs.collect.
	Logs  func() string
	Clock clock.Clock
}

// Ramdisk applies ramdisk commands.
type Ramdisk struct{ cfg Config }

// New returns a Ramdisk.
func New(cfg Config) *Ramdisk {
	cfg.SysfsRoot = cmp.Or(cfg.SysfsRoot, "/")
	cfg.DevRoot = cmp.Or(cfg.DevRoot, "/dev")
	cfg.SpoolDir = cmp.Or(cfg.SpoolDir, os.TempDir())
	cfg.Samples = cmp.Or(cfg.Samples, 64)
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: time.Hour}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	return &Ramdisk{cfg: cfg}
}

// Identity is who the ramdisk is to the control plane: its node id and
// the private key of its mTLS certificate, which signs wipe records.
type Identity struct {
	NodeID string
	Key    crypto.Signer
}

// Apply carries out one command and returns its result.
func (r *Ramdisk) Apply(ctx context.Context, kind string, params map[string]any, id Identity) (map[string]any, error) {
	switch kind {
	case KindInventoryRefresh:
		inv, err := r.Inventory()
		if err != nil {
			return nil, err
		}
		return r.attest(kind, params, id, inv.Output())
	case KindDiskWipe:
		return r.wipeCommand(ctx, params, id)
	case KindImageWrite:
		return r.imageCommand(ctx, params)
	case KindConfigure:
		return r.configureCommand(params, id)
	case KindBurnIn:
		out, err := r.burnInCommand(ctx, params)
		if err != nil {
			return nil, err
		}
		return r.attest(kind, params, id, out)
	case KindLogsCollect:
		return r.collectLogs(), nil
	}
	return nil, fmt.Errorf("%w: %q is not a ramdisk command kind", ErrInvalidParams, kind)
}

// attest signs a step's output with the ramdisk's key when the command
// names the machine and workflow it runs for (steprecord): the control
// plane takes a firmware baseline, and a lease's teardown its firmware and
// diagnostics, only from signed results.
func (r *Ramdisk) attest(kind string, params map[string]any, id Identity, out map[string]any) (map[string]any, error) {
	machineID, workflowID := paramString(params, "machine_id"), paramString(params, "workflow_id")
	if machineID == "" || workflowID == "" || id.Key == nil {
		return out, nil
	}
	return steprecord.Sign(id.Key, steprecord.Record{MachineID: machineID, WorkflowID: workflowID, NodeID: id.NodeID, Kind: kind,
		Time: r.cfg.Clock.Now(), Output: out})
}

func paramString(params map[string]any, name string) string {
	s, _ := params[name].(string)
	return s
}

func paramStrings(params map[string]any, name string) ([]string, error) {
	v, ok := params[name]
	if !ok || v == nil {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: %s: must be a list of strings", ErrInvalidParams, name)
	}
	out := make([]string, 0, len(list))
	for _, e := range list {
		s, ok := e.(string)
		if !ok || s == "" {
			return nil, fmt.Errorf("%w: %s: must be a list of strings", ErrInvalidParams, name)
		}
		out = append(out, s)
	}
	return out, nil
}
