package pki_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/pki"
)

func FuzzParseCSR(f *testing.F) {
	// The committed corpus (testdata/fuzz/FuzzParseCSR) holds P-256, P-384,
	// Ed25519 and RSA requests and broken ones; add a fresh one too.
	f.Add(newCSR(f, p256(f), "seed"))
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(f, err)
	f.Add(newCSR(f, ed, "seed"))
	f.Fuzz(func(t *testing.T, der []byte) {
		csr, err := pki.ParseCSR(der)
		if err != nil {
			require.ErrorIs(t, err, pki.ErrBadCSR)
			return
		}
		require.NotNil(t, csr.PublicKey)
		require.NoError(t, csr.CheckSignature())
		require.LessOrEqual(t, len(der), pki.MaxCSRSize)
	})
}

func FuzzOpenJoinToken(f *testing.F) {
	// A fixed secret, so that committed seeds sealed under it decrypt and
	// reach the claim checks (their pin header is another root's).
	s, err := pki.NewSealer("ZnV6ei1zZWNyZXQtZnV6ei1zZWNyZXQtZnV6ei0zMmI=")
	require.NoError(f, err)
	clk := bctest.NewSimClock(time.Time{})
	a, err := pki.Init(f.Context(), newDB(f, clk), s, pki.InitOptions{})
	require.NoError(f, err)
	token, err := a.SealJoinToken(pki.JoinClaims{TokenID: "jt_seed", TenantID: "tnt_1", ProjectID: "prj_1", ExpiresAt: clk.Now().Add(time.Hour)})
	require.NoError(f, err)
	f.Add(token)
	f.Add(strings.TrimPrefix(token, "bcjt_"+a.Pin()+"."))
	f.Fuzz(func(t *testing.T, in string) {
		// As given, and as the JWE of a token with this authority's pin, so
		// the fuzzer reaches the JWE parser without guessing the pin.
		for _, tok := range []string{in, "bcjt_" + a.Pin() + "." + in} {
			c, err := a.OpenJoinToken(tok)
			if err != nil {
				if !errors.Is(err, pki.ErrTokenMalformed) && !errors.Is(err, pki.ErrTokenExpired) && !errors.Is(err, pki.ErrTokenForeign) {
					t.Fatalf("untyped error: %v", err)
				}
				continue
			}
			require.NotEmpty(t, c.TokenID)
			require.True(t, clk.Now().Before(c.ExpiresAt))
			pin, err := pki.TokenPin(tok)
			require.NoError(t, err)
			require.Equal(t, a.Pin(), pin)
		}
	})
}
