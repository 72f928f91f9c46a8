package pki

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"

	"github.com/better-compute/better-compute/internal/store"
)

// SignForTest signs tmpl with one of the authority's CAs ("node",
// "serving", ...), so tests can forge leaves a real CA signed.
func (a *Authority) SignForTest(kind string, tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
	c := a.issuing().cas[caKind(kind)]
	return sign(tmpl, c.cert, pub, c.key)
}

// CAForTest returns one of the authority's CA certificates.
func (a *Authority) CAForTest(kind string) *x509.Certificate {
	return a.issuing().cas[caKind(kind)].cert
}

// SealLegacyForTest seals the way releases before the derived key did:
// raw key id, nonce, ciphertext under the raw secret.
func (s *Sealer) SealLegacyForTest(ref string, plaintext []byte) []byte {
	ns := s.legacyAEAD.NonceSize()
	out := make([]byte, keyIDLen+ns)
	copy(out, s.legacyKeyID[:])
	if _, err := rand.Read(out[keyIDLen:]); err != nil {
		panic(err)
	}
	return s.legacyAEAD.Seal(out, out[keyIDLen:], plaintext, []byte(ref))
}

// OpenLegacyForTest opens sealed the way releases before the derived key
// did, with the raw secret only.
func (s *Sealer) OpenLegacyForTest(ref string, sealed []byte) ([]byte, error) {
	ns := s.legacyAEAD.NonceSize()
	if len(sealed) < keyIDLen+ns {
		return nil, ErrSealed
	}
	return s.legacyAEAD.Open(nil, sealed[keyIDLen:keyIDLen+ns], sealed[keyIDLen+ns:], []byte(ref))
}

// CAKeysSealedForTest returns each online CA's sealed key by kind.
func CAKeysSealedForTest(ctx context.Context, db *store.DB) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err := caList(ctx, tx)
		for _, r := range rows {
			if r.KeySealed != nil {
				out[string(r.Kind)] = r.KeySealed
			}
		}
		return err
	})
	return out, err
}

// SetCAKeySealedForTest overwrites one CA's sealed key.
func SetCAKeySealedForTest(ctx context.Context, db *store.DB, kind string, sealed []byte) error {
	return db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return caKeyUpdate(ctx, tx, caKind(kind), sealed)
	})
}

// KeyRefForTest is the ref a CA's key is sealed under.
func KeyRefForTest(kind string) string { return keyRef(caKind(kind)) }

// CopyGenerationForTest overwrites generation gen in to with from's row.
func CopyGenerationForTest(ctx context.Context, from, to *store.DB, gen int64) error {
	var g genRow
	if err := from.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		g, err = genGet(ctx, tx, gen)
		return err
	}); err != nil {
		return err
	}
	return to.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM pki_generations WHERE generation = $1`, gen); err != nil {
			return err
		}
		return genInsert(ctx, tx, g)
	})
}
