package pki

// Trust-root rotation (docs/security.md, "Rotating the roots"). A rotation
// publishes a new fleet generation (root, node, serving and internal CAs)
// and a new command-signing generation beside the old ones, and moves the
// fleet onto them without closing a session:
//
//  1. BeginRotation: the new generation issues every node certificate from
//     now on, and renewals hand out a trust bundle with both roots and a
//     command bundle with both command roots. The old generation still
//     serves (the gateway's certificate, the pin), so nodes that have not
//     renewed yet notice nothing.
//  2. AdvanceRotation, once no live node certificate of an older
//     generation is left unreplaced (every node renewed, or its old
//     certificate expired or was revoked): the new generation serves, the
//     old is retired (out of the bundle and the gateway's client pool), and
//     replicas start signing commands with the new command generation.
//  3. AdvanceRotation again, once no open command and no live worker key
//     of an older command generation is left: the old command root is
//     retired and nodes stop accepting it at their next renewal.
//
// Every check that guards a step runs inside the transaction that commits
// it; the other replicas pick the step up at their next Refresh.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// Errors of a rotation.
var (
	// ErrRotationInProgress: BeginRotation while a rotation runs.
	ErrRotationInProgress = errors.New("pki: a rotation is already in progress")
	// ErrRotationWaiting: AdvanceRotation could not take its next step
	// yet; the returned status says what it waits for.
	ErrRotationWaiting = errors.New("pki: the rotation is waiting")
)

// fleetGen is one fleet CA generation: a root and its intermediates.
type fleetGen struct {
	gen int64
	cas map[caKind]*ca
}

// setFleet installs the live generations (oldest first) and what derives
// from them. The caller holds a.mu or owns a.
func (a *Authority) setFleet(gens []*fleetGen) {
	pool := x509.NewCertPool()
	for _, g := range gens {
		pool.AddCert(g.cas[caNode].cert)
		pool.AddCert(g.cas[caRoot].cert)
	}
	a.fleet, a.nodePool, a.pin = gens, pool, spkiPin(gens[0].cas[caRoot].cert)
	a.tlsEpoch++
}

// serving is the generation whose serving and internal CAs issue the
// gateway's and replicas' certificates.
func (a *Authority) serving() *fleetGen {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.fleet[0]
}

// issuing is the generation that issues node certificates: the newest.
func (a *Authority) issuing() *fleetGen {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.fleet[len(a.fleet)-1]
}

// liveCAs returns the kind's CA of every live generation.
func (a *Authority) liveCAs(k caKind) []*x509.Certificate {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make([]*x509.Certificate, len(a.fleet))
	for i, g := range a.fleet {
		out[i] = g.cas[k].cert
	}
	return out
}

// ServingGeneration is the fleet generation that serves now; a replica
// certificate from an older one is replaced (internal/replica).
func (a *Authority) ServingGeneration() int64 { return a.serving().gen }

// makeCASet creates a root (10 years) and the node, serving and internal
// CAs it signs (2 years).
func makeCASet(td string, now time.Time, cnPrefix string) (map[caKind]*ca, error) {
	rootKey, err := newKey()
	if err != nil {
		return nil, err
	}
	rootTmpl := caTemplate(cnPrefix+" root CA", td, now, now.Add(rootLifetime), 1)
	root, err := sign(rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	if err != nil {
		return nil, fmt.Errorf("pki: create root: %w", err)
	}
	cas := map[caKind]*ca{caRoot: {cert: root, key: rootKey}}
	for _, k := range intermediateKinds {
		key, err := newKey()
		if err != nil {
			return nil, err
		}
		notAfter := minTime(now.Add(intermediateLifetime), root.NotAfter)
		c, err := sign(caTemplate(cnPrefix+" "+string(k)+" CA", td, now, notAfter, 0), root, key.Public(), rootKey)
		if err != nil {
			return nil, fmt.Errorf("pki: create %s CA: %w", k, err)
		}
		cas[k] = &ca{cert: c, key: key}
	}
	return cas, nil
}

// genKeyRef is the associated data a generation's CA key is sealed under;
// generation 1 keeps the refs it always had.
func genKeyRef(gen int64, k caKind) string {
	if gen == 1 {
		return keyRef(k)
	}
	return "pki/generation/" + strconv.FormatInt(gen, 10) + "/" + string(k) + "/key"
}

func genSealRef(gen int64) string { return "pki/generation/" + strconv.FormatInt(gen, 10) + "/seal" }

// genSealed is what a generation's seal covers: its number and its four
// certificates.
func genSealed(r genRow) []byte {
	h := sha256.New()
	_ = binary.Write(h, binary.BigEndian, r.Gen)
	for _, der := range [][]byte{r.RootDER, r.NodeDER, r.ServingDER, r.InternalDER} {
		_ = binary.Write(h, binary.BigEndian, uint32(len(der)))
		h.Write(der)
	}
	return h.Sum(nil)
}

// newFleetGeneration creates generation gen, sealed. With offlineDir the
// root's key goes to offlineDir/root-<gen>.key (0600) beside root-<gen>.crt
// and is not stored.
func newFleetGeneration(s *Sealer, td string, gen int64, now time.Time, offlineDir string) (genRow, error) {
	cas, err := makeCASet(td, now, fmt.Sprintf("better-compute g%d", gen))
	if err != nil {
		return genRow{}, err
	}
	r := genRow{Gen: gen, RootDER: cas[caRoot].cert.Raw, NodeDER: cas[caNode].cert.Raw,
		ServingDER: cas[caServing].cert.Raw, InternalDER: cas[caInternal].cert.Raw, CreateTime: now}
	sealKey := func(k caKind) ([]byte, error) {
		der, err := x509.MarshalPKCS8PrivateKey(cas[k].key)
		if err != nil {
			return nil, err
		}
		defer clear(der)
		return s.Seal(genKeyRef(gen, k), der)
	}
	for k, dst := range map[caKind]*[]byte{caNode: &r.NodeKey, caServing: &r.ServingKey, caInternal: &r.InternalKey} {
		if *dst, err = sealKey(k); err != nil {
			return genRow{}, err
		}
	}
	if offlineDir != "" {
		name := "root-" + strconv.FormatInt(gen, 10)
		if err := writeOfflineKey(offlineDir, name, cas[caRoot].cert, cas[caRoot].key.(*ecdsa.PrivateKey)); err != nil {
			return genRow{}, err
		}
	} else if r.RootKey, err = sealKey(caRoot); err != nil {
		return genRow{}, err
	}
	if r.Seal, err = s.Seal(genSealRef(gen), genSealed(r)); err != nil {
		return genRow{}, err
	}
	return r, nil
}

// openFleetGeneration checks a stored generation against its seal and
// opens its keys: one written without the sealing secret is refused, so a
// database-only attacker cannot slip a root of their own into the bundle.
func openFleetGeneration(s *Sealer, r genRow) (*fleetGen, error) {
	want, err := s.Open(genSealRef(r.Gen), r.Seal)
	if err != nil {
		return nil, fmt.Errorf("pki: generation %d: its seal does not open: %w", r.Gen, err)
	}
	if !bytes.Equal(want, genSealed(r)) {
		return nil, fmt.Errorf("pki: generation %d does not match its seal", r.Gen)
	}
	g := &fleetGen{gen: r.Gen, cas: map[caKind]*ca{}}
	for k, v := range map[caKind][2][]byte{caRoot: {r.RootDER, r.RootKey}, caNode: {r.NodeDER, r.NodeKey},
		caServing: {r.ServingDER, r.ServingKey}, caInternal: {r.InternalDER, r.InternalKey}} {
		c, err := openCA(s, genKeyRef(r.Gen, k), v[0], v[1])
		if err != nil {
			return nil, fmt.Errorf("pki: generation %d %s CA: %w", r.Gen, k, err)
		}
		g.cas[k] = c
	}
	return g, checkCASet(g)
}

// openCA parses a CA certificate and opens its sealed key (nil: offline).
func openCA(s *Sealer, ref string, der, sealed []byte) (*ca, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &ca{cert: cert}
	if sealed != nil {
		pt, err := s.Open(ref, sealed)
		if err != nil {
			return nil, fmt.Errorf("its key does not open (is %s the secret this authority was created with?): %w", SecretEnv, err)
		}
		if c.key, err = parseKeyFor(pt, cert); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// checkCASet checks that every intermediate has its key and is signed by
// the generation's root.
func checkCASet(g *fleetGen) error {
	root := g.cas[caRoot]
	if root == nil {
		return fmt.Errorf("pki: generation %d: the root CA is missing", g.gen)
	}
	for _, k := range intermediateKinds {
		c := g.cas[k]
		if c == nil || c.key == nil {
			return fmt.Errorf("pki: generation %d: the %s CA or its key is missing", g.gen, k)
		}
		if err := c.cert.CheckSignatureFrom(root.cert); err != nil {
			return fmt.Errorf("pki: generation %d: the %s CA is not signed by the root: %w", g.gen, k, err)
		}
	}
	return nil
}

// fleetState is what loadFleet reads.
type fleetState struct {
	trustDomain string
	serving     int64
	gens        []*fleetGen // live, oldest first
}

// loadFleet reads and checks the live generations: generation 1 from
// pki_cas (trusted through the stored pin), later ones from
// pki_generations (through their seals). The serving generation's root
// must match the stored pin.
func loadFleet(ctx context.Context, q store.Querier, s *Sealer) (fleetState, error) {
	set, err := settingsGet(ctx, q)
	if errors.Is(err, store.ErrNotFound) {
		return fleetState{}, ErrNotInitialized
	}
	if err != nil {
		return fleetState{}, err
	}
	st := fleetState{trustDomain: set.TrustDomain, serving: set.ServingGeneration}
	if set.ServingGeneration <= 1 {
		rows, err := caList(ctx, q)
		if err != nil {
			return fleetState{}, err
		}
		g := &fleetGen{gen: 1, cas: map[caKind]*ca{}}
		for _, r := range rows {
			c, err := openCA(s, keyRef(r.Kind), r.CertDER, r.KeySealed)
			if err != nil {
				return fleetState{}, fmt.Errorf("pki: load %s CA: %w", r.Kind, err)
			}
			g.cas[r.Kind] = c
		}
		if err := checkCASet(g); err != nil {
			return fleetState{}, err
		}
		st.gens = append(st.gens, g)
	}
	rows, err := genList(ctx, q, set.ServingGeneration)
	if err != nil {
		return fleetState{}, err
	}
	for _, r := range rows {
		g, err := openFleetGeneration(s, r)
		if err != nil {
			return fleetState{}, err
		}
		st.gens = append(st.gens, g)
	}
	if len(st.gens) == 0 || st.gens[0].gen != set.ServingGeneration {
		return fleetState{}, fmt.Errorf("pki: the serving generation %d is missing", set.ServingGeneration)
	}
	if got := spkiPin(st.gens[0].cas[caRoot].cert); got != set.Pin {
		return fleetState{}, fmt.Errorf("pki: the serving root does not match the stored pin %s", set.Pin)
	}
	return st, nil
}

// Refresh reloads what other replicas may have changed: the revocation set,
// the live fleet generations and the command-signing generations.
func (a *Authority) Refresh(ctx context.Context) error {
	var (
		serials []string
		st      fleetState
		cmdRows []commandCARow
	)
	err := a.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		if serials, err = certRevokedList(ctx, tx); err != nil {
			return err
		}
		if st, err = loadFleet(ctx, tx, a.sealer); err != nil {
			return err
		}
		cmdRows, err = commandCAList(ctx, tx)
		return err
	})
	if err != nil {
		return fmt.Errorf("pki: refresh: %w", err)
	}
	cmdGens := make([]*commandGen, 0, len(cmdRows))
	for _, r := range cmdRows {
		g, err := openCommandGen(a.sealer, r)
		if err != nil {
			return fmt.Errorf("pki: refresh: %w", err)
		}
		cmdGens = append(cmdGens, g)
	}
	set := make(map[string]struct{}, len(serials))
	for _, s := range serials {
		set[s] = struct{}{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.revoked = set
	if len(cmdGens) > 0 {
		a.cmdGens = cmdGens
	}
	if changedFleet(a.fleet, st.gens) {
		a.setFleet(st.gens)
	}
	return nil
}

func changedFleet(old, cur []*fleetGen) bool {
	if len(old) != len(cur) {
		return true
	}
	for i := range old {
		if old[i].gen != cur[i].gen {
			return true
		}
	}
	return false
}

// Straggler is a node certificate that holds a rotation back: live, not
// revoked, not replaced by a renewal, and issued by an older generation.
type Straggler struct {
	NodeID     string
	Serial     string
	Generation int64
	NotAfter   time.Time
}

// OldSigner is a worker key of an older command generation that is still
// live and whose replica has no newer one yet.
type OldSigner struct {
	Serial   string
	Replica  string
	Version  int64
	NotAfter time.Time
}

// RotationStatus is where a rotation stands.
type RotationStatus struct {
	// Serving and Newest are fleet generations; they differ while nodes
	// move onto Newest.
	Serving, Newest int64
	// CommandActive is the command generation replicas sign with;
	// CommandPublished the newest nodes pin; CommandOldest the oldest
	// not retired.
	CommandActive, CommandPublished, CommandOldest int64
	// Stragglers hold step 2 back; OldSigners and OpenOldCommands step 3.
	Stragglers      []Straggler
	OldSigners      []OldSigner
	OpenOldCommands int
}

// InProgress reports whether a rotation has steps left.
func (s RotationStatus) InProgress() bool {
	return s.Newest > s.Serving || s.CommandPublished > s.CommandActive || s.CommandOldest < s.CommandActive
}

// Phase names the step a rotation waits on, for operators.
func (s RotationStatus) Phase() string {
	switch {
	case s.Newest > s.Serving || s.CommandPublished > s.CommandActive:
		return "moving nodes"
	case s.CommandOldest < s.CommandActive:
		return "retiring the old command root"
	}
	return "steady"
}

// OpenCommands counts the open commands signed under a command generation
// at or below version, in tx (the fleet module's commands, which this
// package does not read itself).
type OpenCommands func(ctx context.Context, tx store.Tx, version int64) (int, error)

// Rotation reads where a rotation stands.
func (a *Authority) Rotation(ctx context.Context, open OpenCommands) (RotationStatus, error) {
	var st RotationStatus
	err := a.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		st, err = rotationStatus(ctx, tx, open)
		return err
	})
	return st, err
}

func rotationStatus(ctx context.Context, tx store.Tx, open OpenCommands) (RotationStatus, error) {
	set, err := settingsGet(ctx, tx)
	if errors.Is(err, store.ErrNotFound) {
		return RotationStatus{}, ErrNotInitialized
	}
	if err != nil {
		return RotationStatus{}, err
	}
	st := RotationStatus{Serving: set.ServingGeneration, Newest: set.ServingGeneration}
	if st.Newest, err = genNewest(ctx, tx, st.Newest); err != nil {
		return st, err
	}
	cmds, err := commandCAList(ctx, tx)
	if err != nil {
		return st, err
	}
	for _, c := range cmds {
		if c.RetireTime != nil {
			continue
		}
		if st.CommandOldest == 0 {
			st.CommandOldest = c.Version
		}
		st.CommandPublished = c.Version
		if c.ActivateTime != nil {
			st.CommandActive = c.Version
		}
	}
	if st.Newest > st.Serving {
		if st.Stragglers, err = certStragglers(ctx, tx, st.Newest); err != nil {
			return st, err
		}
	}
	if st.CommandOldest < st.CommandActive {
		if st.OldSigners, err = commandSignersOlder(ctx, tx, st.CommandActive); err != nil {
			return st, err
		}
		if open != nil {
			if st.OpenOldCommands, err = open(ctx, tx, st.CommandActive-1); err != nil {
				return st, err
			}
		}
	}
	return st, nil
}

// BeginRotation publishes a new fleet generation and a new command-signing
// generation (step 1). An offline serving root makes the new roots offline
// too: their keys are written to offlineDir, which is then required.
func (a *Authority) BeginRotation(ctx context.Context, offlineDir string) (RotationStatus, error) {
	if a.RootOffline() && offlineDir == "" {
		return RotationStatus{}, errors.New("pki: the root is kept offline: name a directory for the new roots' keys")
	}
	if !a.RootOffline() {
		offlineDir = ""
	}
	if offlineDir != "" {
		if err := os.MkdirAll(offlineDir, 0o700); err != nil {
			return RotationStatus{}, fmt.Errorf("pki: offline roots: %w", err)
		}
	}
	var (
		st      RotationStatus
		written []string
	)
	err := a.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		for _, f := range written { // a retried transaction starts over
			_ = os.Remove(f)
		}
		written = nil
		var err error
		if st, err = rotationStatus(ctx, tx, nil); err != nil {
			return err
		}
		if st.InProgress() {
			return ErrRotationInProgress
		}
		now := a.clk.Now()
		g, err := newFleetGeneration(a.sealer, a.trustDomain, st.Newest+1, now, offlineDir)
		if err != nil {
			return err
		}
		if offlineDir != "" {
			written = append(written, offlineFiles(offlineDir, "root-"+strconv.FormatInt(g.Gen, 10))...)
		}
		c, _, err := newCommandGeneration(a.sealer, a.trustDomain, st.CommandPublished+1, now, offlineDir)
		if err != nil {
			return err
		}
		if offlineDir != "" {
			written = append(written, offlineFiles(offlineDir, "command-root-"+strconv.FormatInt(c.Version, 10))...)
		}
		if err := genInsert(ctx, tx, g); err != nil {
			return err
		}
		if err := commandCAInsert(ctx, tx, c); err != nil {
			return err
		}
		st.Newest, st.CommandPublished = g.Gen, c.Version
		return nil
	})
	if err != nil {
		for _, f := range written {
			_ = os.Remove(f)
		}
		return st, err
	}
	return st, a.Refresh(ctx)
}

func offlineFiles(dir, name string) []string {
	return []string{filepath.Join(dir, name+".key"), filepath.Join(dir, name+".crt")}
}

// AdvanceRotation takes every step whose condition holds now, checked in
// the transaction that takes it, and returns where the rotation stands:
// ErrRotationWaiting when a step is left that cannot be taken yet.
func (a *Authority) AdvanceRotation(ctx context.Context, open OpenCommands) (RotationStatus, error) {
	var st RotationStatus
	err := a.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		if st, err = rotationStatus(ctx, tx, open); err != nil {
			return err
		}
		now := a.clk.Now()
		if st.Newest > st.Serving || st.CommandPublished > st.CommandActive {
			if len(st.Stragglers) > 0 {
				return nil
			}
			// Every live node certificate is of the newest generation,
			// and came with the bundles that hold the new roots.
			if st.Newest > st.Serving {
				g, err := genGet(ctx, tx, st.Newest)
				if err != nil {
					return err
				}
				root, err := x509.ParseCertificate(g.RootDER)
				if err != nil {
					return err
				}
				if err := settingsServe(ctx, tx, st.Newest, spkiPin(root)); err != nil {
					return err
				}
			}
			if err := commandCAActivate(ctx, tx, st.CommandPublished, now); err != nil {
				return err
			}
			// The old command generation retires in a later call: the
			// replicas must see the activation first.
			st, err = rotationStatus(ctx, tx, open)
			return err
		}
		if st.CommandOldest < st.CommandActive && len(st.OldSigners) == 0 && st.OpenOldCommands == 0 {
			if err := commandCARetire(ctx, tx, st.CommandActive-1, now); err != nil {
				return err
			}
			st, err = rotationStatus(ctx, tx, open)
			return err
		}
		return nil
	})
	if err != nil {
		return st, err
	}
	if err := a.Refresh(ctx); err != nil {
		return st, err
	}
	if st.InProgress() {
		return st, ErrRotationWaiting
	}
	return st, nil
}

// resealGenerations re-seals the rotated-in generations' keys and seals
// that want selects; it counts each value re-sealed.
func resealGenerations(ctx context.Context, tx store.Tx, from, to *Sealer, want func([]byte) bool) (int, error) {
	rows, err := genList(ctx, tx, 2)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range rows {
		changed := false
		move := func(ref string, sealed *[]byte) error {
			if *sealed == nil || !want(*sealed) {
				return nil
			}
			pt, err := from.Open(ref, *sealed)
			if err != nil {
				return err
			}
			defer clear(pt)
			if *sealed, err = to.Seal(ref, pt); err != nil {
				return err
			}
			n++
			changed = true
			return nil
		}
		for k, p := range map[caKind]*[]byte{caRoot: &r.RootKey, caNode: &r.NodeKey, caServing: &r.ServingKey, caInternal: &r.InternalKey} {
			if err := move(genKeyRef(r.Gen, k), p); err != nil {
				return n, fmt.Errorf("generation %d %s key: %w", r.Gen, k, err)
			}
		}
		if err := move(genSealRef(r.Gen), &r.Seal); err != nil {
			return n, fmt.Errorf("generation %d seal: %w", r.Gen, err)
		}
		if changed {
			if err := genKeysUpdate(ctx, tx, r); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// IssuingGeneration is the generation new node certificates come from.
func (a *Authority) IssuingGeneration() int64 { return a.issuing().gen }

// NodeCA is the CA that issues node certificates now.
func (a *Authority) NodeCA() *x509.Certificate { return a.issuing().cas[caNode].cert }
