package metal_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/store"
)

// TestImageFetchCapability: the control plane serves an image blob to a
// site agent only with a capability minted for that digest and that agent
// (its certificate's node id), only until it expires, and for one complete
// transfer; an incomplete one frees it for a retry.
func TestImageFetchCapability(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	rt, blobs := f.cp.App.Metal, f.cp.App.Blobs.Open
	img, _ := f.image(t, "sample", true)
	sha, site := img.GetSha256(), f.site.GetId()
	tok, err := rt.ImageFetchToken(site, "nod_site_a", sha)
	require.NoError(t, err)

	other := strings.Repeat("ab", 32)
	otherTok, err := rt.ImageFetchToken(site, "nod_site_a", other)
	require.NoError(t, err)
	for _, c := range []struct {
		node, sha, token, why string
	}{
		{"nod_site_a", sha, "", "no token"},
		{"nod_site_a", sha, "AAAA", "a token that does not open"},
		{"nod_site_a", other, tok, "another digest's token"},
		{"nod_site_a", "not-a-digest", tok, "a malformed digest"},
		{"nod_site_b", sha, tok, "another site agent's token"},
	} {
		_, _, err := rt.OpenSiteImage(ctx, c.node, c.sha, c.token, blobs)
		require.ErrorIs(t, err, metal.ErrImageFetchDenied, c.why)
	}

	// The legitimate fetch, cut short: the capability stays usable.
	file, finish, err := rt.OpenSiteImage(ctx, "nod_site_a", sha, tok, blobs)
	require.NoError(t, err)
	require.NoError(t, file.Close())
	finish(false)
	file, finish, err = rt.OpenSiteImage(ctx, "nod_site_a", sha, tok, blobs)
	require.NoError(t, err)
	// While one transfer runs, the capability serves no other.
	_, _, err = rt.OpenSiteImage(ctx, "nod_site_a", sha, tok, blobs)
	require.ErrorIs(t, err, metal.ErrImageFetchDenied)
	b, err := io.ReadAll(file)
	require.NoError(t, err)
	require.NoError(t, file.Close())
	finish(true)
	sum := sha256.Sum256(b)
	require.Equal(t, sha, hex.EncodeToString(sum[:]))
	_, _, err = rt.OpenSiteImage(ctx, "nod_site_a", sha, tok, blobs)
	require.ErrorIs(t, err, metal.ErrImageFetchDenied, "a second use")
	require.ErrorContains(t, err, "used already")

	// A valid capability for a blob that is gone: not found, and not used up.
	_, _, err = rt.OpenSiteImage(ctx, "nod_site_a", other, otherTok, blobs)
	require.ErrorIs(t, err, metal.ErrImageFetchNoBlob)

	fresh, err := rt.ImageFetchToken(site, "nod_site_a", sha)
	require.NoError(t, err)
	f.cp.Clock.Advance(2*time.Hour + time.Second)
	_, _, err = rt.OpenSiteImage(ctx, "nod_site_a", sha, fresh, blobs)
	require.ErrorIs(t, err, metal.ErrImageFetchDenied)
	require.ErrorContains(t, err, "expired")
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
