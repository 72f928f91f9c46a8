package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKubeJoinTokens: a DaemonSet's bcd reads its own Node's token from the
// Secret's volume, and only when the environment has none.
func TestKubeJoinTokens(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "gpu-node-1"), []byte("bcjt_node1\n"), 0o400))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "gpu-node-2"), []byte("bcjt_node2\n"), 0o400))
	k := kubeNodeOptions{name: "gpu-node-1", joinTokens: dir}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	getenv := k.tokenEnv(noenv, log)
	require.Equal(t, "bcjt_node1", getenv("BCD_JOIN_TOKEN"))
	require.Empty(t, getenv("OTHER"))
	env := k.tokenEnv(func(n string) string {
		if n == "BCD_JOIN_TOKEN" {
			return "bcjt_env"
		}
		return ""
	}, log)
	require.Equal(t, "bcjt_env", env("BCD_JOIN_TOKEN"), "the environment wins")
	missing := kubeNodeOptions{name: "gpu-node-3", joinTokens: dir}
	require.Empty(t, missing.tokenEnv(noenv, log)("BCD_JOIN_TOKEN"), "no key for this Node: no token")
}

func TestKubeNodeFlags(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		k    kubeNodeOptions
		want string
	}{
		"tokens without a node": {kubeNodeOptions{joinTokens: "/etc/bcd/join-tokens"}, "--kube-join-tokens"},
		"a path as node name":   {kubeNodeOptions{name: "../x"}, "not a Node name"},
		"an empty prefix":       {kubeNodeOptions{name: "n", labels: "bcd.dev/,,nvidia.com/"}, "empty prefix"},
	} {
		err := tc.k.validate()
		require.ErrorContains(t, err, tc.want, name)
	}
	require.NoError(t, (&kubeNodeOptions{name: "gpu-node-1", labels: "bcd.dev/, nvidia.com/"}).validate())
	require.Equal(t, []string{"bcd.dev/", "nvidia.com/"}, (&kubeNodeOptions{labels: "bcd.dev/, nvidia.com/"}).prefixes())
}

// TestKubeNodeOutsideACluster: adopting a Node with neither a kubeconfig
// nor a pod's service account fails before bcd does anything else.
func TestKubeNodeOutsideACluster(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"--server", "127.0.0.1:1", "--state-dir", t.TempDir(), "--hardware", "fake:dgxh100",
		"--kube-node-name", "gpu-node-1", "--kube-kubeconfig", filepath.Join(t.TempDir(), "missing")}, noenv, strings.NewReader(""), &stderr)
	require.ErrorContains(t, err, "kubeconfig")
}
