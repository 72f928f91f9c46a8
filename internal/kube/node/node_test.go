package node

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// apiServer speaks the part of the Kubernetes API a node watcher uses:
// list and watch of /api/v1/nodes (JSON), honouring nothing but what the
// test tells it, so the watcher's own filtering is tested too.
type apiServer struct {
	t  *testing.T
	mu sync.Mutex
	rv int
	// nodes by name
	nodes map[string]*corev1.Node
	// selectors are the fieldSelectors the client sent.
	selectors []string
	watchers  []chan metav1.WatchEvent
}

func newAPIServer(t *testing.T, nodes ...*corev1.Node) (*apiServer, kubernetes.Interface) {
	s := &apiServer{t: t, nodes: map[string]*corev1.Node{}}
	for _, n := range nodes {
		s.put(n)
	}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	require.NoError(t, err)
	return s, c
}

// put stores n under a new resource version; it returns the event.
func (s *apiServer) put(n *corev1.Node) metav1.WatchEvent {
	s.rv++
	n = n.DeepCopy()
	n.ResourceVersion = itoa(s.rv)
	n.APIVersion, n.Kind = "v1", "Node"
	typ := "MODIFIED"
	if _, ok := s.nodes[n.Name]; !ok {
		typ = "ADDED"
	}
	s.nodes[n.Name] = n
	raw, err := json.Marshal(n)
	require.NoError(s.t, err)
	return metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: raw}}
}

// update changes a node and tells every watcher, whatever it selected.
func (s *apiServer) update(n *corev1.Node) {
	s.mu.Lock()
	ev := s.put(n)
	ws := append([]chan metav1.WatchEvent(nil), s.watchers...)
	s.mu.Unlock()
	for _, w := range ws {
		w <- ev
	}
}

func (s *apiServer) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/nodes" {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	s.mu.Lock()
	s.selectors = append(s.selectors, q.Get("fieldSelector"))
	var items []corev1.Node
	for _, n := range s.nodes {
		if q.Get("fieldSelector") == "metadata.name="+n.Name {
			items = append(items, *n)
		}
	}
	rv := itoa(s.rv)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if q.Get("watch") != "true" {
		_ = json.NewEncoder(w).Encode(&corev1.NodeList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "NodeList"},
			ListMeta: metav1.ListMeta{ResourceVersion: rv}, Items: items})
		return
	}
	ch := make(chan metav1.WatchEvent, 16)
	s.mu.Lock()
	s.watchers = append(s.watchers, ch)
	s.mu.Unlock()
	enc := json.NewEncoder(w)
	flush := func() { w.(http.Flusher).Flush() }
	if q.Get("sendInitialEvents") == "true" {
		// A streaming list: the current objects, then the bookmark that
		// ends them.
		for _, n := range items {
			raw, _ := json.Marshal(n)
			_ = enc.Encode(metav1.WatchEvent{Type: "ADDED", Object: runtime.RawExtension{Raw: raw}})
		}
		raw, _ := json.Marshal(&corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
			ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv, Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
		_ = enc.Encode(metav1.WatchEvent{Type: "BOOKMARK", Object: runtime.RawExtension{Raw: raw}})
	}
	flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case ev := <-ch:
			_ = enc.Encode(ev)
			flush()
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func gpuNode(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

var prefixes = []string{"bcd.dev/", "nvidia.com/", "feature.node.kubernetes.io/pci-10de"}

// TestWatcherFollowsItsNode: the watcher reads its own Node's labels over
// the real client (list, then watch, selecting that Node by name), reports
// only those under its prefixes, and follows their changes.
func TestWatcherFollowsItsNode(t *testing.T) {
	t.Parallel()
	srv, client := newAPIServer(t,
		gpuNode("gpu-node-1", map[string]string{"bcd.dev/pool": "h100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
			"feature.node.kubernetes.io/pci-10de.present": "true", "kubernetes.io/hostname": "gpu-node-1"}),
		gpuNode("gpu-node-2", map[string]string{"bcd.dev/pool": "a100"}))
	w, err := New(Config{Client: client, Name: "gpu-node-1", Prefixes: prefixes})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	got, err := w.Labels(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"bcd.dev/pool": "h100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
		"feature.node.kubernetes.io/pci-10de.present": "true"}, got)

	// Another Node's change (a server that ignored the selector) is not
	// this node's; its own change is.
	changed := w.Changed()
	srv.update(gpuNode("gpu-node-2", map[string]string{"bcd.dev/pool": "b200"}))
	srv.update(gpuNode("gpu-node-1", map[string]string{"bcd.dev/pool": "a100", "kubernetes.io/hostname": "gpu-node-1"}))
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("no change seen")
	}
	got, err = w.Labels(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"bcd.dev/pool": "a100"}, got)

	srv.mu.Lock()
	defer srv.mu.Unlock()
	require.NotEmpty(t, srv.selectors)
	for _, s := range srv.selectors {
		require.Equal(t, "metadata.name=gpu-node-1", s, "the watcher asks for its own Node only")
	}
}

// TestWatcherChangesOnlyOnReportedLabels: a change to labels bcd does not
// report, or to another Node, wakes nobody; a deleted Node reports none.
func TestWatcherChangesOnlyOnReportedLabels(t *testing.T) {
	t.Parallel()
	w, err := New(Config{Client: &kubernetes.Clientset{}, Name: "n1", Prefixes: prefixes})
	require.NoError(t, err)
	w.observe(gpuNode("n1", map[string]string{"bcd.dev/pool": "x", "other": "1"}), false)
	ch := w.Changed()
	w.observe(gpuNode("n1", map[string]string{"bcd.dev/pool": "x", "other": "2"}), false)
	w.observe(gpuNode("n2", map[string]string{"bcd.dev/pool": "y"}), false)
	select {
	case <-ch:
		t.Fatal("woken by a label bcd does not report, or by another Node")
	default:
	}
	w.observe(gpuNode("n1", map[string]string{"bcd.dev/pool": "x"}), true)
	<-ch
	got, err := w.Labels(t.Context())
	require.NoError(t, err)
	require.Empty(t, got)
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	c := &kubernetes.Clientset{}
	for name, cfg := range map[string]Config{
		"no client":    {Name: "n"},
		"no name":      {Client: c},
		"empty prefix": {Client: c, Name: "n", Prefixes: []string{"bcd.dev/", ""}},
	} {
		_, err := New(cfg)
		require.Error(t, err, name)
	}
}

func TestFilter(t *testing.T) {
	t.Parallel()
	require.Equal(t, map[string]string{"nvidia.com/gpu.count": "8"},
		Filter(map[string]string{"nvidia.com/gpu.count": "8", "nvidia.comx/y": "1", "kubernetes.io/arch": "amd64"}, []string{"nvidia.com/"}))
	require.Empty(t, Filter(map[string]string{"a": "b"}, nil))
}
