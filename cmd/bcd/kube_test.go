package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKubernetesKeysInConfigFile: --kubernetes and --kubelet-dir can come
// from the config file (TOML and YAML), and flags still win.
func TestKubernetesKeysInConfigFile(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"bcd.toml": "kubernetes = true\nkubelet_dir = \"/srv/kubelet\"\n",
		"bcd.yaml": "kubernetes: true\nkubelet_dir: /srv/kubelet\n",
	} {
		p := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		fc, err := loadConfigFile(p)
		require.NoError(t, err, name)
		o := options{kube: kubeOptions{kubeletDir: "/var/lib/kubelet"}}
		o.merge(fc, map[string]bool{})
		require.True(t, o.kube.enabled, name)
		require.Equal(t, "/srv/kubelet", o.kube.kubeletDir, name)
		o = options{kube: kubeOptions{kubeletDir: "/flag"}}
		o.merge(fc, map[string]bool{"kubelet-dir": true})
		require.Equal(t, "/flag", o.kube.kubeletDir, name)
	}
	require.ErrorContains(t, (&kubeOptions{enabled: true, kubeletDir: "/var/lib/kubelet"}).validate("site"), "only --mode node")
	require.ErrorContains(t, (&kubeOptions{enabled: true, kubeletDir: "kubelet"}).validate("node"), "absolute")
}
