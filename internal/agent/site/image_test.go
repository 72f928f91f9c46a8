package site_test

import (
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent/site"
	"github.com/better-compute/better-compute/internal/site/pxe"
)

// TestSiteAgentCachesADeployingImage: a machine list naming a deploying
// machine's image starts the cache's fetch from the control plane, with
// the capability it carries; a digest no machine deploys is never
// fetched; the ramdisk's command line names the site's cache.
func TestSiteAgentCachesADeployingImage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const sha = "41511fc1771687405613f221a37d6ccd4659121c2a583be87dad94b479f2ae39"
	var fetched atomic.Int32
	var gotToken atomic.Value
	a, err := site.New(site.Config{StateDir: t.TempDir(), ImagesURL: "http://10.0.0.2:8080/files/sha256",
		Ramdisk: pxe.Ramdisk{Kernel: "vmlinuz", Initrd: "initrd", Cmdline: "console=ttyS0"}})
	require.NoError(t, err)
	_, err = a.FetchImage(ctx, "sha256:"+sha)
	require.ErrorContains(t, err, "no machine of this site deploys it")

	prefetched := make(chan string, 4)
	a.SetPrefetch(func(ctx context.Context, digest string) error {
		rc, err := a.FetchImage(ctx, digest)
		if err != nil {
			prefetched <- "error: " + err.Error()
			return err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		prefetched <- string(b)
		return err
	})
	ms := machines(1, "http://127.0.0.1:1")
	m := ms["machines"].([]any)[0].(map[string]any)
	m["boot"], m["state"] = "ramdisk", "deploying"
	m["image"] = map[string]any{"sha256": sha, "fetch_token": "cap"}
	_, err = a.Apply(ctx, command(t, "cmd_1", site.KindSiteMachines, "", ms))
	require.NoError(t, err)
	require.Equal(t, "error: no gateway connection to fetch images on", <-prefetched)

	a.SetFetch(func(_ context.Context, gotSHA, token string) (io.ReadCloser, error) {
		fetched.Add(1)
		gotToken.Store(gotSHA + " " + token)
		return io.NopCloser(strings.NewReader("image bytes")), nil
	})
	_, err = a.FetchImage(ctx, "sha256:"+strings.Repeat("0", 64))
	require.ErrorContains(t, err, "no machine of this site deploys it")
	require.Zero(t, fetched.Load())
	_, err = a.Apply(ctx, command(t, "cmd_2", site.KindSiteMachines, "", machinesWith(ms, 2)))
	require.NoError(t, err)
	require.Equal(t, "image bytes", <-prefetched)
	require.Equal(t, sha+" cap", gotToken.Load())

	b, err := a.Decide(ctx, pxe.Request{MAC: mustMAC(t, "52:54:00:00:00:01"), Phase: pxe.PhaseScript})
	require.NoError(t, err)
	require.Contains(t, b.(pxe.Ramdisk).Cmdline, "bc.images=http://10.0.0.2:8080/files/sha256")
}

func machinesWith(ms map[string]any, epoch int) map[string]any {
	ms["epoch"] = epoch
	return ms
}
