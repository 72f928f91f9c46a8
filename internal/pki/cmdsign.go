package pki

// Command signing (docs/security.md): a root of its own, kept apart from the
// fleet's root so a node certificate can never sign a command; an online CA
// it certifies; and per-replica worker keys of 24 hours, held in memory only,
// that sign every command row as it is inserted.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/better-compute/better-compute/internal/cmdsig"
	"github.com/better-compute/better-compute/internal/store"
)

// Worker certificates live 24 hours and are replaced when less than half
// remains, so a signed command stays deliverable for at least 12 hours.
const (
	workerLifetime = 24 * time.Hour
	workerRenewAt  = 12 * time.Hour
)

// commandGen is one command-signing generation.
type commandGen struct {
	version int64
	root    *x509.Certificate
	ca      *x509.Certificate
	caKey   *ecdsa.PrivateKey
	retired bool
	// active: replicas sign with it (a published generation is pinned
	// by nodes first; see rotate.go).
	active bool
}

func commandRootRef(version int64) string {
	return "pki/command/" + strconv.FormatInt(version, 10) + "/root-key"
}
func commandCARef(version int64) string {
	return "pki/command/" + strconv.FormatInt(version, 10) + "/ca-key"
}
func commandSealRef(version int64) string {
	return "pki/command/" + strconv.FormatInt(version, 10) + "/seal"
}

// commandSealed is what a generation's seal covers.
func commandSealed(version int64, rootDER, caDER []byte) []byte {
	h := sha256.New()
	_ = binary.Write(h, binary.BigEndian, version)
	_ = binary.Write(h, binary.BigEndian, uint32(len(rootDER)))
	h.Write(rootDER)
	h.Write(caDER)
	return h.Sum(nil)
}

type commandCARow struct {
	Version       int64
	RootDER       []byte
	RootKeySealed []byte
	CADER         []byte
	CAKeySealed   []byte
	Seal          []byte
	CreateTime    time.Time
	RetireTime    *time.Time
	ActivateTime  *time.Time
}

// newCommandGeneration creates generation version: a root (10 years) and
// the CA it certifies (2 years). With offlineDir the root's key is written
// there (command-root-<version>.key, 0600) and kept out of the database.
func newCommandGeneration(s *Sealer, td string, version int64, now time.Time, offlineDir string) (commandCARow, *commandGen, error) {
	rootKey, err := newKey()
	if err != nil {
		return commandCARow{}, nil, err
	}
	rootTmpl := caTemplate("better-compute command-signing root v"+strconv.FormatInt(version, 10), td, now, now.Add(rootLifetime), 1)
	root, err := sign(rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	if err != nil {
		return commandCARow{}, nil, fmt.Errorf("pki: command-signing root: %w", err)
	}
	caKey, err := newKey()
	if err != nil {
		return commandCARow{}, nil, err
	}
	ca, err := sign(caTemplate("better-compute command-signing CA v"+strconv.FormatInt(version, 10), td, now,
		minTime(now.Add(intermediateLifetime), root.NotAfter), 0), root, caKey.Public(), rootKey)
	if err != nil {
		return commandCARow{}, nil, fmt.Errorf("pki: command-signing CA: %w", err)
	}
	row := commandCARow{Version: version, RootDER: root.Raw, CADER: ca.Raw, CreateTime: now}
	caDER, err := x509.MarshalPKCS8PrivateKey(caKey)
	if err != nil {
		return commandCARow{}, nil, err
	}
	defer clear(caDER)
	if row.CAKeySealed, err = s.Seal(commandCARef(version), caDER); err != nil {
		return commandCARow{}, nil, err
	}
	if offlineDir == "" {
		rootDER, err := x509.MarshalPKCS8PrivateKey(rootKey)
		if err != nil {
			return commandCARow{}, nil, err
		}
		defer clear(rootDER)
		if row.RootKeySealed, err = s.Seal(commandRootRef(version), rootDER); err != nil {
			return commandCARow{}, nil, err
		}
	} else if err := writeOfflineKey(offlineDir, "command-root-"+strconv.FormatInt(version, 10), root, rootKey); err != nil {
		return commandCARow{}, nil, err
	}
	if row.Seal, err = s.Seal(commandSealRef(version), commandSealed(version, root.Raw, ca.Raw)); err != nil {
		return commandCARow{}, nil, err
	}
	return row, &commandGen{version: version, root: root, ca: ca, caKey: caKey}, nil
}

func writeOfflineKey(dir, name string, cert *x509.Certificate, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	defer clear(der)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	defer clear(keyPEM)
	keyFile := filepath.Join(dir, name+".key")
	if err := writeNewFile(keyFile, keyPEM, 0o600); err != nil {
		return fmt.Errorf("pki: offline %s: %w", name, err)
	}
	if err := writeNewFile(filepath.Join(dir, name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o644); err != nil {
		return fmt.Errorf("pki: offline %s: %w", name, err)
	}
	return nil
}

// openCommandGen checks a stored generation against its seal and opens its
// CA key. A generation the sealing secret's holder did not write fails
// here: a database-only attacker cannot publish a root of their own.
func openCommandGen(s *Sealer, r commandCARow) (*commandGen, error) {
	want, err := s.Open(commandSealRef(r.Version), r.Seal)
	if err != nil {
		return nil, fmt.Errorf("pki: command-signing generation %d: its seal does not open: %w", r.Version, err)
	}
	if !bytes.Equal(want, commandSealed(r.Version, r.RootDER, r.CADER)) {
		return nil, fmt.Errorf("pki: command-signing generation %d does not match its seal", r.Version)
	}
	root, err := x509.ParseCertificate(r.RootDER)
	if err != nil {
		return nil, fmt.Errorf("pki: command-signing root %d: %w", r.Version, err)
	}
	ca, err := x509.ParseCertificate(r.CADER)
	if err != nil {
		return nil, fmt.Errorf("pki: command-signing CA %d: %w", r.Version, err)
	}
	if err := ca.CheckSignatureFrom(root); err != nil {
		return nil, fmt.Errorf("pki: command-signing CA %d is not signed by its root: %w", r.Version, err)
	}
	der, err := s.Open(commandCARef(r.Version), r.CAKeySealed)
	if err != nil {
		return nil, fmt.Errorf("pki: command-signing CA key %d: %w", r.Version, err)
	}
	k, err := parseKeyFor(der, ca)
	if err != nil {
		return nil, fmt.Errorf("pki: command-signing CA key %d: %w", r.Version, err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("pki: command-signing CA key %d is %T", r.Version, k)
	}
	return &commandGen{version: r.Version, root: root, ca: ca, caKey: key, retired: r.RetireTime != nil, active: r.ActivateTime != nil}, nil
}

// loadCommandGens reads and checks the command-signing generations,
// creating the first when there is none (an authority made before command
// signing gets an online one; see InitOptions.OfflineRoot for new ones).
func loadCommandGens(ctx context.Context, db *store.DB, s *Sealer, td, offlineDir string) ([]*commandGen, error) {
	var rows []commandCARow
	if err := db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		rows, err = commandCAList(ctx, tx)
		return err
	}); err != nil {
		return nil, fmt.Errorf("pki: load command-signing roots: %w", err)
	}
	if len(rows) == 0 {
		row, _, err := newCommandGeneration(s, td, 1, db.Clock().Now(), offlineDir)
		if err != nil {
			return nil, err
		}
		row.ActivateTime = &row.CreateTime
		err = db.Write(ctx, func(ctx context.Context, tx store.Tx) error { return commandCAInsert(ctx, tx, row) })
		if err != nil && !errors.Is(err, store.ErrUnique) { // another replica made it first: read theirs
			return nil, fmt.Errorf("pki: create the command-signing root: %w", err)
		}
		return loadCommandGens(ctx, db, s, td, "")
	}
	gens := make([]*commandGen, 0, len(rows))
	for _, r := range rows {
		g, err := openCommandGen(s, r)
		if err != nil {
			return nil, err
		}
		gens = append(gens, g)
	}
	return gens, nil
}

// CommandBundle is what a node pins to verify commands: the PEM of every
// command-signing root not retired, and the trust version (the newest
// generation's). The lowest version it accepts is the oldest root's.
func (a *Authority) CommandBundle() (rootsPEM []byte, version, minVersion int64) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var buf bytes.Buffer
	for _, g := range a.cmdGens {
		if g.retired {
			continue
		}
		if minVersion == 0 {
			minVersion = g.version
		}
		version = g.version
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: g.root.Raw})
	}
	return buf.Bytes(), version, minVersion
}

func (a *Authority) currentCommandGen() *commandGen {
	a.mu.RLock()
	defer a.mu.RUnlock()
	for i := len(a.cmdGens) - 1; i >= 0; i-- {
		if !a.cmdGens[i].retired && a.cmdGens[i].active {
			return a.cmdGens[i]
		}
	}
	return nil
}

// CommandSignerChain returns a worker certificate and its CA (DER) by the
// worker's serial, for the gateway to send with a command; nil when no such
// worker certificate was ever issued.
func (a *Authority) CommandSignerChain(ctx context.Context, q store.Querier, serial string) ([][]byte, error) {
	a.mu.RLock()
	chain, ok := a.signerChains[serial]
	a.mu.RUnlock()
	if ok {
		return chain, nil
	}
	version, der, err := commandSignerGet(ctx, q, serial)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, g := range a.cmdGens {
		if g.version == version {
			chain = [][]byte{der, g.ca.Raw}
			a.signerChains[serial] = chain
			return chain, nil
		}
	}
	return nil, nil
}

// CommandSigner signs command rows with this replica's worker key.
type CommandSigner struct {
	a       *Authority
	replica string

	mu        sync.Mutex
	key       *ecdsa.PrivateKey
	cert      *x509.Certificate
	version   int64
	confirmed bool // the certificate's row is known committed
}

// NewCommandSigner returns the signer of one replica; its first worker key
// is made on its first signature.
func (a *Authority) NewCommandSigner(replica string) *CommandSigner {
	return &CommandSigner{a: a, replica: replica}
}

// SignCommand signs f in tx, the transaction that inserts the command. A
// new worker certificate's row is written in the same transaction until a
// later one sees it committed, so a command never names a signer the
// gateway cannot find.
func (s *CommandSigner) SignCommand(ctx context.Context, tx store.Tx, f cmdsig.Fields) (cmdsig.Signature, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.a.clk.Now()
	g := s.a.currentCommandGen()
	if g == nil {
		return cmdsig.Signature{}, errors.New("pki: no command-signing generation is current")
	}
	if s.cert == nil || s.version != g.version || s.cert.NotAfter.Sub(now) < workerRenewAt {
		if err := s.renew(g, now); err != nil {
			return cmdsig.Signature{}, err
		}
	}
	serial := serialString(s.cert.SerialNumber)
	if !s.confirmed {
		found, err := commandSignerExists(ctx, tx, serial)
		switch {
		case err != nil:
			return cmdsig.Signature{}, err
		case found:
			s.confirmed = true
		default:
			if err := commandSignerInsert(ctx, tx, serial, s.version, s.cert.Raw, s.replica, s.cert.NotAfter, now); err != nil {
				return cmdsig.Signature{}, err
			}
		}
	}
	f.TrustDomain, f.TrustVersion = s.a.trustDomain, s.version
	sig, err := cmdsig.Sign(s.key, f)
	if err != nil {
		return cmdsig.Signature{}, fmt.Errorf("pki: sign command: %w", err)
	}
	return cmdsig.Signature{TrustVersion: s.version, Signer: serial, Sig: sig}, nil
}

func (s *CommandSigner) renew(g *commandGen, now time.Time) error {
	key, err := newKey()
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "command signer " + s.replica, Organization: []string{"better-compute"}, OrganizationalUnit: []string{s.a.trustDomain}},
		NotBefore:   now.Add(-backdate),
		NotAfter:    minTime(now.Add(workerLifetime), g.ca.NotAfter),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		URIs:        []*url.URL{cmdsig.SignerURI(s.a.trustDomain, s.replica)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}
	cert, err := sign(tmpl, g.ca, key.Public(), g.caKey)
	if err != nil {
		return fmt.Errorf("pki: issue a worker certificate: %w", err)
	}
	s.key, s.cert, s.version, s.confirmed = key, cert, g.version, false
	return nil
}

// resealCommandGens re-seals the command-signing keys and seals that want
// selects; it counts each value re-sealed.
func resealCommandGens(ctx context.Context, tx store.Tx, from, to *Sealer, want func([]byte) bool) (int, error) {
	rows, err := commandCAList(ctx, tx)
	if err != nil {
		return 0, err
	}
	n := 0
	move := func(ref string, sealed []byte) ([]byte, error) {
		if sealed == nil || !want(sealed) {
			return sealed, nil
		}
		pt, err := from.Open(ref, sealed)
		if err != nil {
			return nil, err
		}
		defer clear(pt)
		n++
		return to.Seal(ref, pt)
	}
	for _, r := range rows {
		root, err := move(commandRootRef(r.Version), r.RootKeySealed)
		if err != nil {
			return n, err
		}
		ca, err := move(commandCARef(r.Version), r.CAKeySealed)
		if err != nil {
			return n, err
		}
		seal, err := move(commandSealRef(r.Version), r.Seal)
		if err != nil {
			return n, err
		}
		if err := commandCAKeysUpdate(ctx, tx, r.Version, root, ca, seal); err != nil {
			return n, err
		}
	}
	return n, nil
}
