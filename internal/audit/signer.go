package audit

import (
	"context"
	"fmt"

	"golang.org/x/mod/sumdb/note"

	"github.com/better-compute/better-compute/internal/store"
)

// Sealer seals the checkpoint key at rest (pki.Sealer).
type Sealer interface {
	Seal(ref string, plaintext []byte) ([]byte, error)
	Open(ref string, sealed []byte) ([]byte, error)
}

// signerRef is the sealed key's ref: a sealed blob moved elsewhere does not
// open.
const signerRef = "audit/checkpoint-key"

// LoadOrInitSigner returns the checkpoint signing key, generating it (an
// Ed25519 note key named origin) on first use and keeping it sealed in
// audit_signer. A key already stored keeps its own name. created reports
// whether this call made it.
func LoadOrInitSigner(ctx context.Context, db *store.DB, s Sealer, origin string) (signer note.Signer, verifier string, created bool, err error) {
	row, err := readSigner(ctx, db)
	if isNotFound(err) {
		skey, vkey, gerr := NewLogKey(origin)
		if gerr != nil {
			return nil, "", false, fmt.Errorf("audit: generate checkpoint key: %w", gerr)
		}
		sealed, serr := s.Seal(signerRef, []byte(skey))
		if serr != nil {
			return nil, "", false, fmt.Errorf("audit: seal checkpoint key: %w", serr)
		}
		err = db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			return signerInsert(ctx, tx, signerRow{Origin: origin, Verifier: vkey, KeySealed: sealed, CreateTime: db.Clock().Now()})
		})
		if err != nil {
			return nil, "", false, fmt.Errorf("audit: store checkpoint key: %w", err)
		}
		// Another replica may have stored its key first: use what is stored.
		row, err = readSigner(ctx, db)
		created = err == nil && row.Verifier == vkey
	}
	if err != nil {
		return nil, "", false, fmt.Errorf("audit: read checkpoint key: %w", err)
	}
	skey, err := s.Open(signerRef, row.KeySealed)
	if err != nil {
		return nil, "", false, fmt.Errorf("audit: open checkpoint key: %w", err)
	}
	signer, err = note.NewSigner(string(skey))
	if err != nil {
		return nil, "", false, fmt.Errorf("audit: checkpoint key: %w", err)
	}
	return signer, row.Verifier, created, nil
}

func readSigner(ctx context.Context, db *store.DB) (row signerRow, err error) {
	err = db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		row, err = signerGet(ctx, tx)
		return err
	})
	return row, err
}
