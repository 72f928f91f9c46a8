package pki

import (
	"bytes"
	"cmp"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/store"
)

// Errors of the authority's lifecycle.
var (
	ErrNotInitialized     = errors.New("pki: not initialized")
	ErrAlreadyInitialized = errors.New("pki: already initialized")
	// ErrInvalidTrustDomain: a trust domain that is not a lowercase DNS name.
	ErrInvalidTrustDomain = errors.New("invalid trust domain")
)

// DefaultTrustDomain is the trust domain Init uses when none is given.
const DefaultTrustDomain = "better-compute.local"

// Lifetimes of the CAs.
const (
	rootLifetime         = 10 * 365 * 24 * time.Hour
	intermediateLifetime = 2 * 365 * 24 * time.Hour
	// backdate absorbs clock skew between the control plane and its peers.
	backdate = time.Minute
)

type caKind string

const (
	caRoot     caKind = "root"
	caNode     caKind = "node"
	caServing  caKind = "serving"
	caInternal caKind = "internal"
)

var intermediateKinds = []caKind{caNode, caServing, caInternal}

func keyRef(k caKind) string { return "pki/ca/" + string(k) + "/key" }

// InitOptions configure a new authority.
type InitOptions struct {
	// TrustDomain is the SPIFFE trust domain, a DNS name; default
	// DefaultTrustDomain.
	TrustDomain string
	// OfflineRoot keeps the root key out of the database: it is written to
	// RootOut/root.key (0600) with RootOut/root.crt, and Init needs RootOut.
	OfflineRoot bool
	RootOut     string
}

type ca struct {
	cert *x509.Certificate
	key  crypto.Signer // nil for an offline root
}

// Authority issues and verifies the fleet's certificates. It is safe for
// concurrent use.
type Authority struct {
	db          *store.DB
	clk         clock.Clock
	sealer      *Sealer
	trustDomain string
	joinKey     []byte
	// challengeKey seals join challenges (a key of its own, so a
	// challenge never opens as a token nor a token as a challenge).
	challengeKey []byte

	mu sync.RWMutex
	// fleet are the live CA generations, oldest first: fleet[0] serves
	// (the gateway's and replicas' certificates, the pin), the newest
	// issues node certificates; more than one while a rotation runs.
	fleet    []*fleetGen
	pin      string
	nodePool *x509.CertPool
	// tlsEpoch changes with fleet, so cached TLS material is rebuilt.
	tlsEpoch uint64
	revoked  map[string]struct{}
	// cmdGens are the command-signing generations, oldest first;
	// signerChains caches worker chains by serial.
	cmdGens      []*commandGen
	signerChains map[string][][]byte
}

// Init creates the root (10 years) and the node, serving and internal
// intermediates (2 years, signed by the root), and stores them with their
// keys sealed. It refuses with ErrAlreadyInitialized when the database
// already has an authority. Its clock is the database's.
func Init(ctx context.Context, db *store.DB, s *Sealer, opts InitOptions) (*Authority, error) {
	td := cmp.Or(opts.TrustDomain, DefaultTrustDomain)
	if err := validateTrustDomain(td); err != nil {
		return nil, err
	}
	if opts.OfflineRoot && opts.RootOut == "" {
		return nil, errors.New("pki: an offline root needs a directory to write root.crt and root.key to")
	}
	if err := db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := settingsGet(ctx, tx)
		switch {
		case err == nil:
			return ErrAlreadyInitialized
		case errors.Is(err, store.ErrNotFound):
			return nil
		}
		return err
	}); err != nil {
		return nil, err
	}

	now := db.Clock().Now()
	cas, err := makeCASet(td, now, "better-compute")
	if err != nil {
		return nil, err
	}
	root, rootKey := cas[caRoot].cert, cas[caRoot].key.(*ecdsa.PrivateKey)

	rows := make([]caRow, 0, len(cas))
	for _, k := range append([]caKind{caRoot}, intermediateKinds...) {
		c := cas[k]
		row := caRow{Kind: k, CertDER: c.cert.Raw, NotAfter: c.cert.NotAfter}
		if k != caRoot || !opts.OfflineRoot {
			der, err := x509.MarshalPKCS8PrivateKey(c.key)
			if err != nil {
				return nil, err
			}
			if row.KeySealed, err = s.Seal(keyRef(k), der); err != nil {
				return nil, err
			}
		}
		rows = append(rows, row)
	}

	// The offline root goes to disk before the database: if the commit
	// fails the files are removed, but a committed root whose key never
	// reached disk could not be recovered.
	var written []string
	if opts.OfflineRoot {
		if written, err = writeOfflineRoot(opts.RootOut, root, rootKey); err != nil {
			return nil, err
		}
		cas[caRoot].key = nil
	}
	pin := spkiPin(root)
	err = db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if err := settingsInsert(ctx, tx, settingsRow{TrustDomain: td, Pin: pin, CreateTime: now}); err != nil {
			if errors.Is(err, store.ErrUnique) {
				return ErrAlreadyInitialized
			}
			return err
		}
		for _, r := range rows {
			if err := caInsert(ctx, tx, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		for _, f := range written {
			_ = os.Remove(f)
		}
		return nil, fmt.Errorf("pki: init: %w", err)
	}
	a, err := newAuthority(db, db.Clock(), s, td, []*fleetGen{{gen: 1, cas: cas}}, nil)
	if err != nil {
		return nil, err
	}
	offline := ""
	if opts.OfflineRoot {
		offline = opts.RootOut
	}
	if a.cmdGens, err = loadCommandGens(ctx, db, s, td, offline); err != nil {
		return nil, err
	}
	return a, nil
}

// Load reads the authority from the database and opens its keys. It returns
// ErrNotInitialized on a database without one. A nil clk uses the database's.
func Load(ctx context.Context, db *store.DB, s *Sealer, clk clock.Clock) (*Authority, error) {
	if clk == nil {
		clk = db.Clock()
	}
	var (
		st      fleetState
		revoked []string
	)
	err := db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		if st, err = loadFleet(ctx, tx, s); err != nil {
			return err
		}
		revoked, err = certRevokedList(ctx, tx)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrNotInitialized) {
			return nil, err
		}
		return nil, fmt.Errorf("pki: load: %w", err)
	}
	a, err := newAuthority(db, clk, s, st.trustDomain, st.gens, revoked)
	if err != nil {
		return nil, err
	}
	if a.cmdGens, err = loadCommandGens(ctx, db, s, st.trustDomain, ""); err != nil {
		return nil, err
	}
	return a, nil
}

// LoadOrInit loads the authority, creating it first on a database without
// one; created reports whether it did.
//
// It moves CA keys sealed under the raw secret by an earlier release under
// the derived key (ResealLegacy) once they have opened.
func LoadOrInit(ctx context.Context, db *store.DB, s *Sealer, clk clock.Clock, opts InitOptions) (*Authority, bool, error) {
	a, err := Load(ctx, db, s, clk)
	if err == nil {
		if _, err := ResealLegacy(ctx, db, s); err != nil {
			return nil, false, err
		}
		return a, false, nil
	}
	if !errors.Is(err, ErrNotInitialized) {
		return nil, false, err
	}
	a, err = Init(ctx, db, s, opts)
	if errors.Is(err, ErrAlreadyInitialized) {
		// Another replica won the race.
		a, err = Load(ctx, db, s, clk)
		return a, false, err
	}
	if err != nil {
		return nil, false, err
	}
	if clk != nil {
		a.clk = clk
	}
	return a, true, nil
}

func newAuthority(db *store.DB, clk clock.Clock, s *Sealer, td string, gens []*fleetGen, revoked []string) (*Authority, error) {
	jk, err := s.deriveKey(joinKeyInfo)
	if err != nil {
		return nil, err
	}
	ck, err := s.deriveKey(challengeKeyInfo)
	if err != nil {
		return nil, err
	}
	a := &Authority{
		db: db, clk: clk, sealer: s, trustDomain: td, joinKey: jk, challengeKey: ck,
		revoked: make(map[string]struct{}, len(revoked)), signerChains: map[string][][]byte{},
	}
	a.setFleet(gens)
	for _, s := range revoked {
		a.revoked[s] = struct{}{}
	}
	return a, nil
}

// TrustDomain returns the SPIFFE trust domain.
func (a *Authority) TrustDomain() string { return a.trustDomain }

// Pin returns the lowercase hex SHA-256 of the root certificate's
// SubjectPublicKeyInfo: what a join token carries and an agent checks on
// its first dial.
func (a *Authority) Pin() string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.pin
}

// TrustBundlePEM returns the live roots in PEM, the serving one first: what
// agents trust for the gateway. During a rotation it holds the old root and
// the new, so a node that renewed trusts the gateway before and after it
// switches.
func (a *Authority) TrustBundlePEM() []byte {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var buf bytes.Buffer
	for _, g := range a.fleet {
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: g.cas[caRoot].cert.Raw})
	}
	return buf.Bytes()
}

// NodeCAPool returns what the gateway trusts for client certificates: the
// node CA and the root of every live generation.
func (a *Authority) NodeCAPool() *x509.CertPool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.nodePool.Clone()
}

// RootOffline reports whether the serving root's key is kept outside the
// database.
func (a *Authority) RootOffline() bool { return a.serving().cas[caRoot].key == nil }

// CAInfo describes one CA for operators.
type CAInfo struct {
	Kind       string // root, node, serving or internal
	Generation int64
	Subject    string
	NotAfter   time.Time
	// Offline: the key is not in the database (an offline root).
	Offline bool
}

// Summary is what an operator needs to know about the authority, and what
// an agent needs (the pin). It holds nothing secret.
type Summary struct {
	TrustDomain string
	Pin         string
	CreateTime  time.Time
	// ServingGeneration is the fleet generation that serves; CAs lists it
	// and any newer one a rotation published, each root first.
	ServingGeneration int64
	CAs               []CAInfo
	// CommandRoots are the command-signing generations, oldest first.
	CommandRoots []CommandRootInfo
}

// CommandRootInfo describes one command-signing generation.
type CommandRootInfo struct {
	Version  int64
	Subject  string
	NotAfter time.Time
	Offline  bool // the root's key is not in the database
	Retired  bool
}

// Inspect reads the authority's public parts without the sealing secret.
func Inspect(ctx context.Context, db *store.DB) (Summary, error) {
	var (
		sum  Summary
		rows []caRow
		gens []genRow
	)
	err := db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		set, err := settingsGet(ctx, tx)
		if errors.Is(err, store.ErrNotFound) {
			return ErrNotInitialized
		}
		if err != nil {
			return err
		}
		sum.TrustDomain, sum.Pin, sum.CreateTime, sum.ServingGeneration = set.TrustDomain, set.Pin, set.CreateTime, set.ServingGeneration
		if rows, err = caList(ctx, tx); err != nil {
			return err
		}
		if gens, err = genList(ctx, tx, set.ServingGeneration); err != nil {
			return err
		}
		gens, err := commandCAList(ctx, tx)
		for _, g := range gens {
			c, perr := x509.ParseCertificate(g.RootDER)
			if perr != nil {
				return fmt.Errorf("pki: command-signing root %d: %w", g.Version, perr)
			}
			sum.CommandRoots = append(sum.CommandRoots, CommandRootInfo{Version: g.Version, Subject: c.Subject.String(),
				NotAfter: c.NotAfter, Offline: g.RootKeySealed == nil, Retired: g.RetireTime != nil})
		}
		return err
	})
	if err != nil {
		return Summary{}, err
	}
	order := map[caKind]int{caRoot: 0, caNode: 1, caServing: 2, caInternal: 3}
	if sum.ServingGeneration <= 1 {
		sum.CAs = make([]CAInfo, len(rows))
		for _, r := range rows {
			cert, err := x509.ParseCertificate(r.CertDER)
			if err != nil {
				return Summary{}, fmt.Errorf("pki: %s CA: %w", r.Kind, err)
			}
			sum.CAs[order[r.Kind]] = CAInfo{Kind: string(r.Kind), Generation: 1, Subject: cert.Subject.String(), NotAfter: cert.NotAfter, Offline: r.KeySealed == nil}
		}
	}
	for _, g := range gens {
		for _, k := range append([]caKind{caRoot}, intermediateKinds...) {
			der, key := map[caKind][2][]byte{caRoot: {g.RootDER, g.RootKey}, caNode: {g.NodeDER, g.NodeKey},
				caServing: {g.ServingDER, g.ServingKey}, caInternal: {g.InternalDER, g.InternalKey}}[k][0], g.RootKey
			cert, err := x509.ParseCertificate(der)
			if err != nil {
				return Summary{}, fmt.Errorf("pki: generation %d %s CA: %w", g.Gen, k, err)
			}
			sum.CAs = append(sum.CAs, CAInfo{Kind: string(k), Generation: g.Gen, Subject: cert.Subject.String(), NotAfter: cert.NotAfter,
				Offline: k == caRoot && key == nil})
		}
	}
	return sum, nil
}

// Reseal re-seals every sealed value this package keeps (the CA keys) from
// one secret to another in one transaction, and returns how many. Join
// tokens are keyed by the secret too: those issued before a rotation no
// longer open after it. Load the authority again with the new Sealer.
func Reseal(ctx context.Context, db *store.DB, from, to *Sealer) (int, error) {
	return reseal(ctx, db, from, to, func([]byte) bool { return true })
}

// ResealLegacy re-seals, under s's derived key, the CA keys an earlier
// release sealed under the raw secret, and returns how many. It is the
// upgrade step LoadOrInit runs; rows already sealed under the derived key
// are left as they are, so replicas starting together only repeat a no-op.
func ResealLegacy(ctx context.Context, db *store.DB, s *Sealer) (int, error) {
	return reseal(ctx, db, s, s, s.Legacy)
}

func reseal(ctx context.Context, db *store.DB, from, to *Sealer, want func(sealed []byte) bool) (int, error) {
	n := 0
	err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		n = 0
		rows, err := caList(ctx, tx)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if r.KeySealed == nil || !want(r.KeySealed) {
				continue
			}
			pt, err := from.Open(keyRef(r.Kind), r.KeySealed)
			if err != nil {
				return err
			}
			sealed, err := to.Seal(keyRef(r.Kind), pt)
			clear(pt)
			if err != nil {
				return err
			}
			if err := caKeyUpdate(ctx, tx, r.Kind, sealed); err != nil {
				return err
			}
			n++
		}
		m, err := resealCommandGens(ctx, tx, from, to, want)
		n += m
		if err != nil {
			return err
		}
		m, err = resealGenerations(ctx, tx, from, to, want)
		n += m
		if err != nil {
			return err
		}
		m, err = resealWorkloadKeys(ctx, tx, from, to, want)
		n += m
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("pki: reseal: %w", err)
	}
	return n, nil
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func newSerial() (*big.Int, error) {
	// 128 random bits, positive and never zero.
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, err
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

// serialString is how a serial is written in pki_certs and NodeIdentity:
// lowercase hex.
func serialString(n *big.Int) string { return n.Text(16) }

func caTemplate(cn, td string, now, notAfter time.Time, maxPathLen int) *x509.Certificate {
	return &x509.Certificate{
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"better-compute"}, OrganizationalUnit: []string{td}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            maxPathLen,
		MaxPathLenZero:        maxPathLen == 0,
	}
}

// sign fills the serial and signs tmpl with parent's key.
func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) (*x509.Certificate, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

func spkiPin(c *x509.Certificate) string {
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:])
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// parseKeyFor parses a PKCS#8 key and checks that it belongs to cert.
func parseKeyFor(der []byte, cert *x509.Certificate) (crypto.Signer, error) {
	k, err := x509.ParsePKCS8PrivateKey(der)
	clear(der)
	if err != nil {
		return nil, err
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported key type %T", k)
	}
	pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("the key does not match the certificate")
	}
	return signer, nil
}

func writeOfflineRoot(dir string, root *x509.Certificate, key *ecdsa.PrivateKey) ([]string, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	defer clear(der)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: offline root: %w", err)
	}
	crt, keyFile := filepath.Join(dir, "root.crt"), filepath.Join(dir, "root.key")
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	defer clear(keyPEM)
	// Never replace files: they may hold another authority's root.
	if err := writeNewFile(keyFile, keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("pki: offline root: %w", err)
	}
	if err := writeNewFile(crt, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw}), 0o644); err != nil {
		_ = os.Remove(keyFile)
		return nil, fmt.Errorf("pki: offline root: %w", err)
	}
	return []string{keyFile, crt}, nil
}

func writeNewFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return err
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// validateTrustDomain accepts a lowercase DNS name, which is also a valid
// SPIFFE trust domain.
func validateTrustDomain(td string) error {
	bad := func(why string) error { return fmt.Errorf("pki: %w %q: %s", ErrInvalidTrustDomain, td, why) }
	if len(td) > 253 {
		return bad("longer than 253 characters")
	}
	if td == "" {
		return bad("empty")
	}
	for _, label := range strings.Split(td, ".") {
		if label == "" || len(label) > 63 {
			return bad("each dot-separated label must be 1 to 63 characters")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return bad("a label must not start or end with a hyphen")
		}
		for _, r := range label {
			if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
				return bad("use lowercase letters, digits, hyphens and dots")
			}
		}
	}
	return nil
}
