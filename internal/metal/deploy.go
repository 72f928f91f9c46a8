package metal

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/sealbox"
	"github.com/better-compute/better-compute/internal/store"
)

// The deploy path on a real site: the site agent fetches the image from
// the control plane by digest (ImageFetchPath, with a capability minted
// for its site) into its cache, the ramdisk streams it from the site's
// HTTP server and writes it after verifying it, and machine.configure
// writes a single-use node join token (sealed to the ramdisk's key) and the
// gateway address into the image's config slot; the deployed OS joins
// with it, and its first inventory report ends the deploy's os-joined
// step.

// ImageFetchPath is the control plane's HTTP route a site agent fetches a
// deploying machine's image from: ImageFetchPath + sha256 + "?token=...".
const ImageFetchPath = "/v1/site-images/sha256/"

// imageFetchTTL bounds a fetch capability: long enough for a deploy's
// ramdisk boot and a slow first fetch.
const imageFetchTTL = 2 * time.Hour

// MachineLabel is the label a deployed machine's node carries: the
// machine's id. The join token the deploy mints sets it.
const MachineLabel = "bettercompute.io/machine"

// nodeTokenCreator marks the join tokens the deploy mints (created_by).
const nodeTokenCreator = "system:metal"

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

// imageFetchToken mints the capability to fetch blob sha for site siteID.
func (r *Runtime) imageFetchToken(siteID, sha string) (string, error) {
	if r.sealer == nil {
		return "", errors.New("no sealer (BETTER_COMPUTE_SECRET) to mint an image fetch token")
	}
	exp := r.clock.Now().Add(imageFetchTTL).Unix()
	sealed, err := r.sealer.Seal(fetchSealRef(sha), []byte(siteID+" "+strconv.FormatInt(exp, 10)))
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(sealed), nil
}

// ImageFetchHandler serves a blob to a site agent holding a fetch
// capability for it (GET ImageFetchPath{sha256}?token=): the token opens
// only for that digest, and only until it expires. open reads the image
// catalog's blob.
func (r *Runtime) ImageFetchHandler(open func(sha string) (*os.File, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		sha := strings.TrimPrefix(req.URL.Path, ImageFetchPath)
		if !imagesig.ValidDigest(sha) {
			http.Error(w, "want "+ImageFetchPath+"<64 lower-case hex digits>", http.StatusBadRequest)
			return
		}
		raw, err := base64.RawURLEncoding.DecodeString(req.URL.Query().Get("token"))
		if err != nil || len(raw) == 0 || r.sealer == nil {
			http.Error(w, "a fetch token is required", http.StatusUnauthorized)
			return
		}
		claim, err := r.sealer.Open(fetchSealRef(sha), raw)
		if err != nil {
			http.Error(w, "the fetch token is not for this image", http.StatusForbidden)
			return
		}
		_, expText, _ := strings.Cut(string(claim), " ")
		exp, err := strconv.ParseInt(expText, 10, 64)
		if err != nil || !r.clock.Now().Before(time.Unix(exp, 0)) {
			http.Error(w, "the fetch token expired", http.StatusForbidden)
			return
		}
		f, err := open(sha)
		if err != nil {
			http.Error(w, "no such image blob", http.StatusNotFound)
			return
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			http.Error(w, "stat failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Cache-Control", "no-store")
		http.ServeContent(w, req, "", st.ModTime(), f)
	})
}

// siteImage is what the site agent needs to cache a deploying machine's
// image: its digest and where to fetch it (ImageFetchPath with a token).
func (r *Runtime) siteImage(ctx context.Context, q store.Querier, siteID, imageID string) (map[string]any, error) {
	var sha string
	if err := q.QueryRow(ctx, `SELECT sha256 FROM images WHERE id = $1`, imageID).Scan(&sha); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil // deleted: the deploy's write step fails on its own
		}
		return nil, err
	}
	fetch, err := r.ImageFetchURL(siteID, sha)
	if err != nil {
		return nil, err
	}
	return map[string]any{"sha256": sha, "fetch": fetch}, nil
}

// ImageFetchURL is the path (with its capability) site siteID fetches blob
// sha from: ImageFetchPath + sha + "?token=...".
func (r *Runtime) ImageFetchURL(siteID, sha string) (string, error) {
	tok, err := r.imageFetchToken(siteID, sha)
	if err != nil {
		return "", err
	}
	return ImageFetchPath + sha + "?token=" + tok, nil
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
	case KindBurnIn:
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
	var labels string
	err := q.QueryRow(ctx, `SELECT labels FROM join_tokens WHERE node_id = $1 AND created_by = $2`, nodeID, nodeTokenCreator).Scan(&labels)
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
	_, err = r.Engine.SignalTx(ctx, tx, m.ID, provision.KindAwaitRejoin, provision.Result{Output: map[string]any{"node_id": nodeID}})
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
		var state, digest string
		err := tx.QueryRow(ctx, `SELECT state, inventory_digest FROM nodes WHERE id = $1`, id).Scan(&state, &digest)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if state != "retired" && digest != "" {
			return r.NodeReported(ctx, tx, id)
		}
	}
	return nil
}

// deployedNodes are the nodes a machine's deploys joined as: a wipe ends
// them (their OS is gone).
func deployedNodes(ctx context.Context, q store.Querier, machineID string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT node_id, labels FROM join_tokens WHERE created_by = $1 AND node_id <> '' AND labels LIKE $2`,
		nodeTokenCreator, "%"+machineID+"%")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, labels string
		if err := rows.Scan(&id, &labels); err != nil {
			return nil, err
		}
		var l map[string]string
		if json.Unmarshal([]byte(cmp.Or(labels, "{}")), &l) == nil && l[MachineLabel] == machineID {
			out = append(out, id)
		}
	}
	return out, rows.Err()
}
