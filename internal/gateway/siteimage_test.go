package gateway_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"io"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// TestFetchSiteImageBoundToAgent: a site image capability opens only on
// the mTLS connection of the site agent it was minted for, and serves one
// complete transfer: another site's agent presenting it is refused, a
// node certificate is refused, and a second use is refused.
func TestFetchSiteImageBoundToAgent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	blob := bytes.Repeat([]byte("disk image "), 200_000) // several frames
	sum := sha256.Sum256(blob)
	sha := hex.EncodeToString(sum[:])
	_, err := f.cp.Admin().PushImage(ctx, &apiv1.PushImageHeader{Tenant: "acme", Name: "img", Kind: "raw",
		Sha256: sha, SizeBytes: int64(len(blob))}, bytes.NewReader(blob), "")
	require.NoError(t, err)

	joinSite := func(host string) *agent {
		res, err := f.cp.Admin().JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{
			Tenant: "acme", Project: "gpu", Role: "site",
		}))
		require.NoError(t, err)
		a := newAgent(t, f, host)
		req := a.joinRequest(res.Msg.GetToken())
		req.Mode = agentv1.AgentMode_AGENT_MODE_SITE
		jr, err := a.dial(nil).Join(ctx, req)
		require.NoError(t, err)
		require.Equal(t, agentv1.JoinStatus_JOIN_STATUS_ADMITTED, jr.GetStatus())
		a.nodeID = jr.GetNodeId()
		a.cert = &tls.Certificate{Certificate: jr.GetCertificateChain(), PrivateKey: a.key}
		return a
	}
	fetch := func(a *agent, token string) ([]byte, error) {
		st, err := a.dial(nil).FetchSiteImage(ctx, &agentv1.FetchSiteImageRequest{Sha256: sha, Token: token})
		if err != nil {
			return nil, err
		}
		var got []byte
		for {
			c, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return got, nil
			}
			if err != nil {
				return nil, err
			}
			got = append(got, c.GetData()...)
		}
	}
	siteA, siteB := joinSite("site-a"), joinSite("site-b")
	node := newAgent(t, f, "gpu-1")
	_, nodeTok := f.token(t, nil)
	node.join(nodeTok)

	tok, err := f.cp.App.Metal.ImageFetchToken("site_a", siteA.nodeID, sha)
	require.NoError(t, err)

	_, err = fetch(siteB, tok)
	requireCode(t, err, codes.PermissionDenied, "not issued to node "+siteB.nodeID)
	_, err = fetch(node, tok)
	requireCode(t, err, codes.PermissionDenied, "only site agents")

	got, err := fetch(siteA, tok)
	require.NoError(t, err)
	require.Equal(t, blob, got, "the agent it was minted for gets the blob")

	_, err = fetch(siteA, tok)
	requireCode(t, err, codes.PermissionDenied, "used already")
}
