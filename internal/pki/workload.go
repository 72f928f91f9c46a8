package pki

// Workload identity (docs/workload-identity.md): an ES256 key that signs
// short-lived JWTs naming a tenant's workload, published as a JWKS so any
// standard JWT library verifies them. Keys are read from the database on
// every use (opened keys are cached by kid and sealed bytes), so every
// replica signs with the newest key the moment one rotates it.

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/better-compute/better-compute/internal/store"
)

// WorkloadKeysPublished is how many of the newest keys the JWKS holds: the
// one signing and the one before, whose tokens are still unexpired for at
// most a token lifetime after a rotation.
const WorkloadKeysPublished = 2

func workloadKeyRef(kid string) string { return "pki/workload/" + kid + "/key" }

// WorkloadKeys signs workload tokens and serves their JWKS.
type WorkloadKeys struct {
	db     *store.DB
	sealer *Sealer

	mu     sync.Mutex
	opened map[string]openedKey
}

type openedKey struct {
	sealed []byte
	key    *ecdsa.PrivateKey
}

// NewWorkloadKeys returns the workload token signer over db's keys.
func NewWorkloadKeys(db *store.DB, s *Sealer) *WorkloadKeys {
	return &WorkloadKeys{db: db, sealer: s, opened: map[string]openedKey{}}
}

// newWorkloadKey makes a key and its row; the kid is the key's RFC 7638
// thumbprint, so it names the public key whichever replica made it.
func newWorkloadKey(s *Sealer, now time.Time) (workloadKeyRow, error) {
	key, err := newKey()
	if err != nil {
		return workloadKeyRow{}, err
	}
	tp, err := (&jose.JSONWebKey{Key: key.Public()}).Thumbprint(crypto.SHA256)
	if err != nil {
		return workloadKeyRow{}, fmt.Errorf("pki: workload key thumbprint: %w", err)
	}
	kid := base64.RawURLEncoding.EncodeToString(tp)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return workloadKeyRow{}, err
	}
	defer clear(der)
	sealed, err := s.Seal(workloadKeyRef(kid), der)
	if err != nil {
		return workloadKeyRow{}, err
	}
	return workloadKeyRow{KID: kid, KeySealed: sealed, CreateTime: now}, nil
}

// open returns a row's key, from the cache when its sealed bytes are the
// ones opened before.
func (w *WorkloadKeys) open(r workloadKeyRow) (*ecdsa.PrivateKey, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if o, ok := w.opened[r.KID]; ok && bytes.Equal(o.sealed, r.KeySealed) {
		return o.key, nil
	}
	der, err := w.sealer.Open(workloadKeyRef(r.KID), r.KeySealed)
	if err != nil {
		return nil, fmt.Errorf("pki: workload key %s: %w", r.KID, err)
	}
	defer clear(der)
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("pki: workload key %s: %w", r.KID, err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("pki: workload key %s is %T", r.KID, k)
	}
	w.opened[r.KID] = openedKey{sealed: r.KeySealed, key: key}
	return key, nil
}

// newest returns the signing key, creating the first when there is none.
func (w *WorkloadKeys) newest(ctx context.Context) (string, *ecdsa.PrivateKey, error) {
	var rows []workloadKeyRow
	if err := w.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		rows, err = workloadKeysNewest(ctx, tx, 1)
		return err
	}); err != nil {
		return "", nil, fmt.Errorf("pki: read workload keys: %w", err)
	}
	if len(rows) == 0 {
		if _, err := w.rotate(ctx, true); err != nil {
			return "", nil, err
		}
		return w.newest(ctx)
	}
	key, err := w.open(rows[0])
	return rows[0].KID, key, err
}

// Rotate makes a new signing key and returns its kid. The previous key
// stays in the JWKS (WorkloadKeysPublished), so rotate no more often than
// a token lifetime.
func (w *WorkloadKeys) Rotate(ctx context.Context) (string, error) { return w.rotate(ctx, false) }

// rotate writes a new key; onlyFirst writes it only when there is none
// (replicas starting together make one key, not one each).
func (w *WorkloadKeys) rotate(ctx context.Context, onlyFirst bool) (string, error) {
	row, err := newWorkloadKey(w.sealer, w.db.Clock().Now().UTC())
	if err != nil {
		return "", err
	}
	kid := row.KID
	err = w.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if onlyFirst {
			have, err := workloadKeysNewest(ctx, tx, 1)
			if err != nil || len(have) > 0 {
				if len(have) > 0 {
					kid = have[0].KID
				}
				return err
			}
		}
		return workloadKeyInsert(ctx, tx, row)
	})
	if err != nil {
		return "", fmt.Errorf("pki: write workload key: %w", err)
	}
	return kid, nil
}

// WorkloadSigner signs with one key, the newest when it was taken.
type WorkloadSigner struct {
	kid string
	key *ecdsa.PrivateKey
}

// Signer returns the newest key's signer (creating the first key when there
// is none). Take it before a transaction: the first key is written in one of
// its own.
func (w *WorkloadKeys) Signer(ctx context.Context) (WorkloadSigner, error) {
	kid, key, err := w.newest(ctx)
	return WorkloadSigner{kid: kid, key: key}, err
}

// KeyID is the kid of the signer's key.
func (s WorkloadSigner) KeyID() string { return s.kid }

// Sign signs claims (structs or maps jwt marshals, merged) as an ES256
// JWT, typ JWT and the key's kid in the header.
func (s WorkloadSigner) Sign(claims ...any) (string, error) {
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: s.key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), s.kid))
	if err != nil {
		return "", fmt.Errorf("pki: workload signer: %w", err)
	}
	b := jwt.Signed(sig)
	for _, c := range claims {
		b = b.Claims(c)
	}
	tok, err := b.Serialize()
	if err != nil {
		return "", fmt.Errorf("pki: sign workload token: %w", err)
	}
	return tok, nil
}

// JWKS returns the published public keys, newest first. A row whose key
// does not open under the sealing secret fails the whole set: it was not
// written by the control plane.
func (w *WorkloadKeys) JWKS(ctx context.Context) (jose.JSONWebKeySet, error) {
	var rows []workloadKeyRow
	if err := w.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		rows, err = workloadKeysNewest(ctx, tx, WorkloadKeysPublished)
		return err
	}); err != nil {
		return jose.JSONWebKeySet{}, fmt.Errorf("pki: read workload keys: %w", err)
	}
	if len(rows) == 0 {
		// The first token creates the first key; publish it before any.
		if _, _, err := w.newest(ctx); err != nil {
			return jose.JSONWebKeySet{}, err
		}
		return w.JWKS(ctx)
	}
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{}}
	for _, r := range rows {
		key, err := w.open(r)
		if err != nil {
			return jose.JSONWebKeySet{}, err
		}
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: key.Public(), KeyID: r.KID, Algorithm: string(jose.ES256), Use: "sig"})
	}
	return set, nil
}

// resealWorkloadKeys re-seals the workload keys for Reseal.
func resealWorkloadKeys(ctx context.Context, tx store.Tx, from, to *Sealer, want func([]byte) bool) (int, error) {
	rows, err := workloadKeysAll(ctx, tx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range rows {
		if !want(r.KeySealed) {
			continue
		}
		pt, err := from.Open(workloadKeyRef(r.KID), r.KeySealed)
		if err != nil {
			return n, err
		}
		sealed, err := to.Seal(workloadKeyRef(r.KID), pt)
		clear(pt)
		if err != nil {
			return n, err
		}
		if err := workloadKeyUpdate(ctx, tx, r.KID, sealed); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
