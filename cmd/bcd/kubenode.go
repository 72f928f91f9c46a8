package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/kubernetes"

	"github.com/better-compute/better-compute/internal/kube/node"
)

// kubeNodeOptions adopt the Kubernetes Node bcd runs on: its labels become
// the node's reported labels, and its join token may come from a Secret
// with one key per Node.
type kubeNodeOptions struct {
	name       string
	kubeconfig string
	labels     string
	joinTokens string
}

func (k *kubeNodeOptions) register(fs interface {
	StringVar(p *string, name, value, usage string)
}) {
	fs.StringVar(&k.name, "kube-node-name", "", "the Kubernetes Node bcd runs on (the downward API's spec.nodeName); bcd reports its labels and watches them. Empty: no Node is adopted")
	fs.StringVar(&k.kubeconfig, "kube-kubeconfig", "", "with --kube-node-name: kubeconfig to read the Node with (the kubelet's, /var/lib/kubelet/kubeconfig, outside a pod); empty: the pod's service account")
	fs.StringVar(&k.labels, "kube-node-labels", "bcd.dev/,nvidia.com/,feature.node.kubernetes.io/pci-10de", "with --kube-node-name: comma-separated label-key prefixes of the Node's labels to report; pools select nodes by them")
	fs.StringVar(&k.joinTokens, "kube-join-tokens", "", "with --kube-node-name: directory of join tokens, one file per Node name (a Secret's volume); read when BCD_JOIN_TOKEN is empty and bcd has not joined")
}

func (k *kubeNodeOptions) validate() error {
	if k.name == "" {
		if k.joinTokens != "" {
			return errors.New("--kube-join-tokens: needs --kube-node-name, which names the token's file")
		}
		return nil
	}
	if strings.ContainsAny(k.name, "/\x00") || k.name == "." || k.name == ".." {
		return fmt.Errorf("--kube-node-name %q: not a Node name", k.name)
	}
	for p := range strings.SplitSeq(k.labels, ",") {
		if strings.TrimSpace(p) == "" && k.labels != "" {
			return fmt.Errorf("--kube-node-labels %q: an empty prefix would report every label", k.labels)
		}
	}
	return nil
}

func (k *kubeNodeOptions) prefixes() []string {
	if k.labels == "" {
		return nil
	}
	var out []string
	for p := range strings.SplitSeq(k.labels, ",") {
		out = append(out, strings.TrimSpace(p))
	}
	return out
}

// kubeNode is the adopted Node; nil when bcd adopts none, and its methods
// then give the agent nothing.
type kubeNode struct {
	w      *node.Watcher
	source string
	// name and client are the Node's, for the DRA driver's slices.
	name   string
	client kubernetes.Interface
}

// start adopts the Node --kube-node-name names: it watches it until ctx
// ends and returns getenv reading the Node's join token from
// --kube-join-tokens when BCD_JOIN_TOKEN is empty.
func (k *kubeNodeOptions) start(ctx context.Context, getenv func(string) string, log *slog.Logger) (*kubeNode, func(string) string, error) {
	if k.name == "" {
		return nil, getenv, nil
	}
	cfg, err := node.RESTConfig(k.kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("--kube-node-name: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("--kube-node-name: %w", err)
	}
	w, err := node.New(node.Config{Client: client, Name: k.name, Prefixes: k.prefixes(), Logger: log})
	if err != nil {
		return nil, nil, err
	}
	go func() { _ = w.Run(ctx) }()
	return &kubeNode{w: w, source: "kubernetes/node/" + k.name, name: k.name, client: client}, k.tokenEnv(getenv, log), nil
}

// tokenEnv reads BCD_JOIN_TOKEN from DIR/NODE_NAME when the environment
// has none: a DaemonSet shares one Secret, and each node its own key.
func (k *kubeNodeOptions) tokenEnv(getenv func(string) string, log *slog.Logger) func(string) string {
	if k.joinTokens == "" {
		return getenv
	}
	return func(name string) string {
		v := getenv(name)
		if name != "BCD_JOIN_TOKEN" || v != "" {
			return v
		}
		b, err := os.ReadFile(filepath.Join(k.joinTokens, k.name))
		if err != nil {
			log.Warn("no join token for this Node", "path", filepath.Join(k.joinTokens, k.name), "err", err)
			return ""
		}
		return strings.TrimSpace(string(b))
	}
}

func (n *kubeNode) labels() func(context.Context) (map[string]string, error) {
	if n == nil {
		return nil
	}
	return n.w.Labels
}

func (n *kubeNode) changed() func() <-chan struct{} {
	if n == nil {
		return nil
	}
	return n.w.Changed
}

func (n *kubeNode) labelsSource() string {
	if n == nil {
		return ""
	}
	return n.source
}
