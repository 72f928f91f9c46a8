// Package node adopts bcd's own Kubernetes Node: it watches that one Node
// and hands bcd the labels an operator chose to report (by key prefix:
// bcd.dev/pool, Node Feature Discovery's feature.node.kubernetes.io/…,
// GPU Feature Discovery's nvidia.com/…), so the control plane's pools can
// select the node by them.
//
// It must never write to the API server, nor read any Node but its own:
// the labels of other nodes are not this node's to report.
package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Config says which Node to adopt and which of its labels to report.
type Config struct {
	// Client reads the Node; it needs get, list and watch on nodes.
	Client kubernetes.Interface
	// Name is the Node's name (the downward API's spec.nodeName).
	Name string
	// Prefixes are the label-key prefixes reported; a label whose key
	// starts with none of them stays in the cluster. Empty reports none.
	Prefixes []string
	Logger   *slog.Logger
}

// Watcher keeps the reported labels of one Node current. Run feeds it;
// Labels and Changed read it.
type Watcher struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	labels  map[string]string // reported (filtered); nil until the first sync
	synced  chan struct{}     // closed at the first sync
	changed chan struct{}     // closed, and replaced, when labels change
}

// New checks cfg and returns a Watcher that Run must feed.
func New(cfg Config) (*Watcher, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("node: Client is required")
	case cfg.Name == "":
		return nil, errors.New("node: Name is required (the downward API's spec.nodeName, in NODE_NAME)")
	}
	for i, p := range cfg.Prefixes {
		if p == "" {
			return nil, fmt.Errorf("node: Prefixes[%d]: must not be empty (an empty prefix would report every label)", i)
		}
	}
	return &Watcher{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default()).With("node_name", cfg.Name),
		synced: make(chan struct{}), changed: make(chan struct{})}, nil
}

// Run lists and watches the Node until ctx ends, keeping the labels
// current. It returns nil when ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	// The field selector makes the API server send this Node only; the
	// handlers check the name again all the same.
	sel := fields.OneTermEqualSelector("metadata.name", w.cfg.Name).String()
	nodes := w.cfg.Client.CoreV1().Nodes()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return nodes.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return nodes.Watch(ctx, o)
		},
	}
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Node{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { w.observe(obj, false) },
			UpdateFunc: func(_, obj any) { w.observe(obj, false) },
			DeleteFunc: func(obj any) { w.observe(obj, true) },
		},
	})
	ctrl.RunWithContext(ctx)
	return nil
}

func (w *Watcher) observe(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	n, ok := obj.(*corev1.Node)
	if !ok || n.Name != w.cfg.Name {
		return
	}
	next := map[string]string{}
	if !deleted {
		next = Filter(n.Labels, w.cfg.Prefixes)
	} else {
		// A deleted Node has no labels to report; a re-registered one
		// brings its own.
		w.log.Warn("the Node was deleted; reporting no labels until it is back")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	first := w.labels == nil
	if !first && maps.Equal(w.labels, next) {
		return
	}
	w.labels = next
	if first {
		close(w.synced)
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

// Labels waits for the first sync (or ctx) and returns the reported labels.
func (w *Watcher) Labels(ctx context.Context) (map[string]string, error) {
	select {
	case <-w.synced:
	case <-ctx.Done():
		return nil, fmt.Errorf("node %s: labels not read yet: %w", w.cfg.Name, context.Cause(ctx))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.labels), nil
}

// Changed is closed at the next change of the reported labels.
func (w *Watcher) Changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// Filter returns the labels whose key starts with one of prefixes.
func Filter(labels map[string]string, prefixes []string) map[string]string {
	out := map[string]string{}
	for k, v := range labels {
		for _, p := range prefixes {
			if strings.HasPrefix(k, p) {
				out[k] = v
				break
			}
		}
	}
	return out
}

// RESTConfig is the client configuration bcd reads its Node with: the
// kubeconfig file at path (the kubelet's, /var/lib/kubelet/kubeconfig, for
// a bcd outside any pod), or the pod's in-cluster service account when
// path is empty.
func RESTConfig(path string) (*rest.Config, error) {
	if path == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (no kubeconfig given): %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return c, nil
}
