package metal_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/store"
)

// TestImageFetchCapability: the control plane serves an image blob to a
// site agent only with a capability minted for that digest, and only until
// it expires.
func TestImageFetchCapability(t *testing.T) {
	t.Parallel()
	f := setup(t)
	img, _ := f.image(t, "sample", true)
	get := func(path string) (int, string) {
		t.Helper()
		res, err := http.Get(f.cp.URL + path)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	path, err := f.cp.App.Metal.ImageFetchURL(f.site.GetId(), img.GetSha256())
	require.NoError(t, err)
	code, body := get(path)
	require.Equal(t, http.StatusOK, code, body)
	sum := sha256.Sum256([]byte(body))
	require.Equal(t, img.GetSha256(), hex.EncodeToString(sum[:]))

	_, tok, _ := strings.Cut(path, "?token=")
	other := strings.Repeat("ab", 32)
	for _, c := range []struct {
		path string
		code int
		why  string
	}{
		{metal.ImageFetchPath + img.GetSha256(), http.StatusUnauthorized, "no token"},
		{metal.ImageFetchPath + img.GetSha256() + "?token=AAAA", http.StatusForbidden, "a token that does not open"},
		{metal.ImageFetchPath + other + "?token=" + tok, http.StatusForbidden, "another digest's token"},
		{metal.ImageFetchPath + "not-a-digest?token=" + tok, http.StatusBadRequest, "a malformed digest"},
	} {
		code, body := get(c.path)
		require.Equal(t, c.code, code, "%s: %s", c.why, body)
	}
	// A digest with a valid token but no blob: not found.
	missing, err := f.cp.App.Metal.ImageFetchURL(f.site.GetId(), other)
	require.NoError(t, err)
	code, _ = get(missing)
	require.Equal(t, http.StatusNotFound, code)

	f.cp.Clock.Advance(2*time.Hour + time.Second)
	code, body = get(path)
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "expired")
}

// TestNodeReportedIgnoresOtherNodes: an inventory report of a node that
// did not join with a deploy's token changes no machine.
func TestNodeReportedIgnoresOtherNodes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	err := f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return f.cp.App.Metal.NodeReported(ctx, tx, "nod_unknown")
	})
	require.NoError(t, err)
}
