package metal

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/images"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/sealbox"
	"github.com/better-compute/better-compute/internal/store"
)

// The deploy path on a real site: the site agent fetches the image from
// the control plane by digest over its mutually authenticated gateway
// connection (FetchSiteImage, with a capability minted for the site's
// boot lease holder) into its cache, the ramdisk streams it from the
// site's HTTP server and writes it after verifying it, and
// machine.configure writes a single-use node join token (sealed to the
// ramdisk's key) and the gateway address into the image's config slot; the
// deployed OS joins with it, and its first inventory report ends the
// deploy's os-joined step.

// imageFetchTTL bounds a fetch capability: long enough for a deploy's
// ramdisk boot and a slow first fetch.
const imageFetchTTL = 2 * time.Hour

// MachineLabel is the label a deployed machine's node carries: the
// machine's id. The join token the deploy mints sets it.
const MachineLabel = "bettercompute.io/machine"

// nodeTokenCreator marks the join tokens the deploy mints (created_by).
const nodeTokenCreator = "system:metal"

// ErrImageFetchDenied: an image fetch capability is missing, malformed,
// for another digest or another node, expired, or used already.
var ErrImageFetchDenied = errors.New("metal: image fetch refused")

// ErrImageFetchNoBlob: the capability holds but the blob is gone.
var ErrImageFetchNoBlob = errors.New("metal: no such image blob")

// NodeTokenRequest is what a deploy's node join token binds.
type NodeTokenRequest struct {
	TenantID    string
	MachineID   string
	MachineName string
	SiteID      string
	WorkflowID  string
	// TTL bounds the token: the deployed OS joins within the deploy.
	TTL time.Duration
}

func fetchSealRef(sha string) string { return "image-fetch/" + sha }

// fetchClaim is what a fetch capability seals: the site and the node (the
// site agent's certificate identity) it was minted for, a random id that
// makes it single-use, and its expiry.
type fetchClaim struct {
	SiteID  string `json:"site"`
	NodeID  string `json:"node"`
	TokenID string `json:"id"`
	Expires int64  `json:"exp"`
}

// ImageFetchToken mints the capability for site agent nodeID of site
// siteID to fetch blob sha once, over its gateway connection.
func (r *Runtime) ImageFetchToken(siteID, nodeID, sha string) (string, error) {
	if r.sealer == nil {
		return "", errors.New("no sealer (BETTER_COMPUTE_SECRET) to mint an image fetch token")
	}
	if siteID == "" || nodeID == "" {
		return "", errors.New("an image fetch token needs a site and a node")
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", err
	}
	claim, err := json.Marshal(fetchClaim{SiteID: siteID, NodeID: nodeID, TokenID: base64.RawURLEncoding.EncodeToString(id[:]),
		Expires: r.clock.Now().Add(imageFetchTTL).Unix()})
	if err != nil {
		return "", err
	}
	sealed, err := r.sealer.Seal(fetchSealRef(sha), claim)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(sealed), nil
}

// OpenSiteImage serves a capability that site agent nodeID (the identity
// of its verified client certificate) presents for blob sha: the token
// opens only for that digest and that node, only until it expires, and for
// one transfer. The caller streams the blob and calls finish with whether
// the transfer completed: a complete one uses the capability up, an
// incomplete one frees it for the site's retry. open reads the image
// catalog's blob.
func (r *Runtime) OpenSiteImage(ctx context.Context, nodeID, sha, token string, open func(sha string) (*os.File, error)) (*os.File, func(complete bool), error) {
	if !imagesig.ValidDigest(sha) {
		return nil, nil, fmt.Errorf("%w: want a digest of 64 lower-case hex digits", ErrImageFetchDenied)
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) == 0 || r.sealer == nil {
		return nil, nil, fmt.Errorf("%w: a fetch token is required", ErrImageFetchDenied)
	}
	pt, err := r.sealer.Open(fetchSealRef(sha), raw)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: the fetch token is not for this image", ErrImageFetchDenied)
	}
	var c fetchClaim
	if err := json.Unmarshal(pt, &c); err != nil || c.TokenID == "" || c.NodeID == "" {
		return nil, nil, fmt.Errorf("%w: the fetch token is malformed", ErrImageFetchDenied)
	}
	if c.NodeID != nodeID {
		return nil, nil, fmt.Errorf("%w: the fetch token was not issued to node %s", ErrImageFetchDenied, nodeID)
	}
	now, exp := r.clock.Now(), time.Unix(c.Expires, 0)
	if !now.Before(exp) {
		return nil, nil, fmt.Errorf("%w: the fetch token expired", ErrImageFetchDenied)
	}
	var claimed bool
	err = r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		claimed, err = SiteImageFetchClaim(ctx, tx, c.TokenID, nodeID, sha, now, exp)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	if !claimed {
		return nil, nil, fmt.Errorf("%w: the fetch token was used already", ErrImageFetchDenied)
	}
	release := func() {
		// Detached: the fetch's own context is usually what ended it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			return SiteImageFetchRelease(ctx, tx, c.TokenID)
		}); err != nil {
			r.log.Warn("free an image fetch capability after an incomplete transfer", "node", nodeID, "digest", sha, "err", err)
		}
	}
	f, err := open(sha)
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("%w: %s", ErrImageFetchNoBlob, sha)
	}
	return f, func(complete bool) {
		if !complete {
			release()
		}
	}, nil
}

// siteImage is what the site agent nodeID needs to cache a deploying
// machine's image: its digest and the capability to fetch it.
func (r *Runtime) siteImage(ctx context.Context, q store.Querier, siteID, nodeID, imageID string) (map[string]any, error) {
	sha, err := images.ImageSHA256(ctx, q, imageID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil // deleted: the deploy's write step fails on its own
		}
		return nil, err
	}
	tok, err := r.ImageFetchToken(siteID, nodeID, sha)
	if err != nil {
		return nil, err
	}
	return map[string]any{"sha256": sha, "fetch_token": tok}, nil
}

// bootDisk is the disk a deploy writes: the first disk the machine's
// inventory lists (the ramdisk lists them in kernel order).
func bootDisk(inv map[string]any) (disk string, size int64, err error) {
	disks, _ := inv["disks"].([]any)
	for _, d := range disks {
		m, _ := d.(map[string]any)
		if dev, _ := m["device"].(string); dev != "" {
			sz, _ := m["size_bytes"].(float64)
			return dev, int64(sz), nil
		}
	}
	return "", 0, errors.New("the machine's inventory lists no disk: inspect or commission it first")
}

// RamdiskStepParams are the params of a ramdisk step's command, built in
// the transaction that queues it for the ramdisk node nodeID.
func (r *Runtime) RamdiskStepParams(ctx context.Context, tx store.Tx, run provision.StepRun, nodeID string) (map[string]any, error) {
	params := map[string]any{}
	switch run.Kind {
	case KindDiskWipe:
		// The signed record names them, so it cannot be replayed onto
		// another machine or a later wipe.
		params["machine_id"], params["workflow_id"] = run.TargetID, run.WorkflowID
	case KindInventory:
		// The ramdisk signs its inventory for this machine and workflow
		// (steprecord): a commissioning's firmware becomes the baseline a
		// lease's teardown is held to.
		params["machine_id"], params["workflow_id"] = run.TargetID, run.WorkflowID
	case KindBurnIn:
		params["machine_id"], params["workflow_id"] = run.TargetID, run.WorkflowID
		on, _ := run.Input["burn_in"].(bool)
		params["enabled"] = on
		if s, ok := run.Input["burn_in_seconds"].(float64); ok && s > 0 {
			params["duration_seconds"] = s
		}
	case KindImageWrite, KindConfigure:
		m, err := MachineByID(ctx, tx, run.TargetID, "")
		if err != nil {
			return nil, err
		}
		device, _, err := bootDisk(m.Inventory)
		if err != nil {
			return nil, err
		}
		img, _ := run.Input["image"].(map[string]any)
		if img == nil {
			return nil, errors.New("the workflow has no image to write")
		}
		params["device"] = device
		if run.Kind == KindImageWrite {
			// The ramdisk fetches it from the site's cache by digest and
			// checks it against the descriptor and the keys before it
			// writes a byte.
			for _, k := range []string{"name", "kind", "sha256", "size_bytes", "signatures"} {
				params[k] = img[k]
			}
			params["trusted_keys"] = run.Input["trusted_keys"]
			break
		}
		params["size_bytes"], params["machine_id"] = img["size_bytes"], m.ID
		if key, _ := run.Input["ssh_authorized_key"].(string); run.Input["lease_id"] != nil {
			// A lease's OS answers to the lessee: root's key, and no
			// platform join token, so it never becomes a platform node.
			params["root_authorized_key"] = key
			break
		}
		_, pub, err := ramdiskOf(ctx, tx, m.ID, run.WorkflowID)
		if err != nil {
			return nil, err
		}
		if len(pub) == 0 {
			return nil, fmt.Errorf("machine %s: no ramdisk joined for workflow %s to seal the join token to", m.ID, run.WorkflowID)
		}
		if r.nodeTokens == nil {
			return nil, errors.New("this control plane mints no node join tokens (no PKI)")
		}
		token, err := r.nodeTokens(ctx, tx, NodeTokenRequest{TenantID: m.TenantID, MachineID: m.ID, MachineName: m.Name,
			SiteID: m.SiteID, WorkflowID: run.WorkflowID, TTL: time.Hour})
		if err != nil {
			return nil, fmt.Errorf("mint the node join token: %w", err)
		}
		// Sealed to the ramdisk's key: the command row holds nothing a
		// database reader could join with.
		if params["join_token_sealed"], err = sealbox.Seal(pub, "join/"+m.ID, []byte(token)); err != nil {
			return nil, err
		}
	}
	return params, nil
}

// machineOfNode is the machine a node joined for: the deploy's join token
// (created by the lifecycle, labelled with the machine) that admitted it.
func machineOfNode(ctx context.Context, q store.Querier, nodeID string) (string, error) {
	labels, err := fleet.JoinTokenLabelsOfNode(ctx, q, nodeID, nodeTokenCreator)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var l map[string]string
	if err := json.Unmarshal([]byte(cmp.Or(labels, "{}")), &l); err != nil {
		return "", fmt.Errorf("join token of node %s: labels: %w", nodeID, err)
	}
	return l[MachineLabel], nil
}

// NodeReported is the gateway's hook for a node's inventory report, in its
// transaction: a deployed machine's OS that joined with the deploy's token
// ends the deploy's os-joined step. Any other node, or a report when no
// step awaits it, changes nothing.
func (r *Runtime) NodeReported(ctx context.Context, tx store.Tx, nodeID string) error {
	machineID, err := machineOfNode(ctx, tx, nodeID)
	if err != nil || machineID == "" {
		return err
	}
	m, err := MachineByID(ctx, tx, machineID, "")
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if m.State != StateDeploying && m.State != StateRescuing && m.Operation != OpRescueEndDisk {
		return nil
	}
	_, err = r.Engine.SignalProvingTx(ctx, tx, m.ID, provision.KindAwaitRejoin, KindPowerCycle, provision.Result{Output: map[string]any{"node_id": nodeID}})
	var apiErr *envelope.Error
	if errors.As(err, &apiErr) && apiErr.Code == envelope.CodeFailedPrecondition {
		r.log.Info("deployed node reported while its machine awaits nothing", "machine", m.ID, "node", nodeID)
		return nil
	}
	return err
}

// osJoinedTx ends a deploy's os-joined step when its OS already joined and
// reported before the step began to await it (the boot-disk step's result
// can reach the control plane after the OS's first report): called once
// the step before it completed, in that transaction.
func (r *Runtime) osJoinedTx(ctx context.Context, tx store.Tx, machineID string) error {
	ids, err := deployedNodes(ctx, tx, machineID)
	if err != nil {
		return err
	}
	for _, id := range ids {
		n, err := fleet.NodeStatusGet(ctx, tx, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if n.State != "retired" && n.InventoryDigest != "" {
			return r.NodeReported(ctx, tx, id)
		}
	}
	return nil
}

// deployedNodes are the nodes a machine's deploys joined as: a wipe ends
// them (their OS is gone).
func deployedNodes(ctx context.Context, q store.Querier, machineID string) ([]string, error) {
	toks, err := fleet.JoinTokenListAdmitting(ctx, q, nodeTokenCreator, machineID)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range toks {
		var l map[string]string
		if json.Unmarshal([]byte(cmp.Or(t.Labels, "{}")), &l) == nil && l[MachineLabel] == machineID {
			out = append(out, t.NodeID)
		}
	}
	return out, nil
}

// MachineOfNode names the machine a node was deployed on (its join token's
// MachineLabel), "" for a node that is no machine's.
func MachineOfNode(ctx context.Context, q store.Querier, nodeID string) (string, error) {
	n, err := fleet.NodeGet(ctx, q, "", nodeID)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	// Labels are written as a JSON object by the fleet; one that does not
	// decode names no machine.
	var l map[string]string
	_ = json.Unmarshal([]byte(cmp.Or(n.Labels, "{}")), &l)
	return l[MachineLabel], nil
}
