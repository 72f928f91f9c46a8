package pki_test

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/cmdsig"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
)

func commandBundle(t *testing.T, a *pki.Authority) cmdsig.Bundle {
	t.Helper()
	rootsPEM, version, minVersion := a.CommandBundle()
	require.Equal(t, int64(1), version)
	require.Equal(t, int64(1), minVersion)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(rootsPEM))
	return cmdsig.Bundle{Roots: roots, MinVersion: minVersion, TrustDomain: a.TrustDomain()}
}

// TestCommandSigner: a replica's signature verifies against the bundle
// with the chain the gateway finds by the signer's serial; the worker key
// is replaced before less than half its day remains, and another
// replica (a second Load) signs with a key of its own.
func TestCommandSigner(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	ctx := t.Context()
	b := commandBundle(t, f.a)
	s := f.a.NewCommandSigner("replica-a")
	fields := cmdsig.Fields{ID: "cmd_1", NodeID: "nod_1", Seq: 1, Kind: "disk.wipe", ParamsDigest: cmdsig.Digest([]byte("{}")),
		IdempotencyKey: "k", Deadline: f.clk.Now().Add(time.Hour)}
	sign := func(s *pki.CommandSigner) cmdsig.Signature {
		var sig cmdsig.Signature
		require.NoError(t, f.db.Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			sig, err = s.SignCommand(ctx, tx, fields)
			return err
		}))
		return sig
	}
	chainOf := func(serial string) [][]byte {
		var chain [][]byte
		require.NoError(t, f.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			chain, err = f.a.CommandSignerChain(ctx, tx, serial)
			return err
		}))
		require.NotNil(t, chain, "the signer %s is findable", serial)
		return chain
	}
	first := sign(s)
	fields.TrustVersion = first.TrustVersion
	require.NoError(t, cmdsig.Verify(b, chainOf(first.Signer), first.Sig, fields, f.clk.Now()))
	require.Equal(t, first.Signer, sign(s).Signer, "one worker key until it is due")

	f.clk.Advance(13 * time.Hour)
	renewed := sign(s)
	require.NotEqual(t, first.Signer, renewed.Signer, "renewed with less than 12 hours left")
	require.NoError(t, cmdsig.Verify(b, chainOf(renewed.Signer), renewed.Sig, fields, f.clk.Now()))
	// The older command stays deliverable until its signer expires.
	require.NoError(t, cmdsig.Verify(b, chainOf(first.Signer), first.Sig, fields, f.clk.Now()))

	other, err := pki.Load(ctx, f.db, f.sealer, f.clk)
	require.NoError(t, err)
	require.NotEqual(t, renewed.Signer, sign(other.NewCommandSigner("replica-b")).Signer)

	var unknown [][]byte
	require.NoError(t, f.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		unknown, err = f.a.CommandSignerChain(ctx, tx, "abcdef")
		return err
	}))
	require.Nil(t, unknown)
}

// TestForgedCommandRootRefused: whoever writes only the database cannot
// publish a command-signing root of their own: a generation row without a
// seal the secret's holder made stops the authority from loading, and an
// edited one too.
func TestForgedCommandRootRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	f := setup(t, pki.InitOptions{})
	require.NoError(t, f.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO pki_command_cas (version, root_der, ca_der, ca_key_sealed, seal, create_time)
			SELECT 2, root_der, ca_der, ca_key_sealed, seal, create_time FROM pki_command_cas WHERE version = 1`)
		return err
	}))
	_, err := pki.Load(ctx, f.db, f.sealer, f.clk)
	require.ErrorContains(t, err, "generation 2")

	g := setup(t, pki.InitOptions{})
	other := setup(t, pki.InitOptions{})
	var rootDER []byte
	require.NoError(t, other.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT root_der FROM pki_command_cas WHERE version = 1`).Scan(&rootDER)
	}))
	require.NoError(t, g.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE pki_command_cas SET root_der = $1 WHERE version = 1`, rootDER)
		return err
	}))
	_, err = pki.Load(ctx, g.db, g.sealer, g.clk)
	require.ErrorContains(t, err, "does not match its seal")
}
