// Package kubeletdra is a test kubelet for DRA drivers. It speaks the
// kubelet's side of the real protocols over unix sockets: it watches a
// plugin registration directory as the kubelet's plugin watcher does,
// asks each new socket for its PluginInfo, checks it as the kubelet's DRA
// handler does and reports the verdict with NotifyRegistrationStatus;
// then it calls the driver's DRAPlugin (v1) and DRAResourceHealth (v1)
// services as the kubelet's DRA manager does. The API side (claims,
// slices) is the test's fake clientset.
//
// Tests only: nothing outside tests may import it.
package kubeletdra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Plugin is a DRA driver the kubelet registered.
type Plugin struct {
	Name string
	// Endpoint is the DRA socket the driver named in its PluginInfo.
	Endpoint string
	// Services are the PluginInfo's supported versions: the gRPC services
	// the driver offers ("v1.DRAPlugin", "v1.DRAResourceHealth", ...).
	Services []string
	// Socket is the registration socket it came through.
	Socket string

	conn   *grpc.ClientConn
	dra    drapb.DRAPluginClient
	health drahealthv1.DRAResourceHealthClient
}

// Kubelet watches one plugin registration directory.
type Kubelet struct {
	dir     string
	watcher *fsnotify.Watcher
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu sync.Mutex
	// plugins by driver name, registered now.
	plugins map[string]*Plugin
	// refused records registrations the kubelet turned down, by socket.
	refused map[string]error
	changed chan struct{}
}

// Start watches dir (created if missing) for registration sockets.
func Start(ctx context.Context, dir string) (*Kubelet, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("kubeletdra: create %s: %w", dir, err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("kubeletdra: watch: %w", err)
	}
	if err := w.Add(dir); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("kubeletdra: watch %s: %w", dir, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	k := &Kubelet{
		dir: dir, watcher: w, cancel: cancel,
		plugins: map[string]*Plugin{}, refused: map[string]error{}, changed: make(chan struct{}),
	}
	// Sockets made before the watch started, as the plugin watcher's
	// initial walk finds them.
	entries, err := os.ReadDir(dir)
	if err != nil {
		k.Close()
		return nil, fmt.Errorf("kubeletdra: read %s: %w", dir, err)
	}
	for _, e := range entries {
		k.found(ctx, filepath.Join(dir, e.Name()))
	}
	k.wg.Add(1)
	go k.watch(ctx)
	return k, nil
}

// Close stops watching and drops every connection.
func (k *Kubelet) Close() {
	k.cancel()
	_ = k.watcher.Close()
	k.wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.plugins {
		_ = p.conn.Close()
	}
	k.plugins = map[string]*Plugin{}
}

func (k *Kubelet) watch(ctx context.Context) {
	defer k.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-k.watcher.Events:
			if !ok {
				return
			}
			switch {
			case ev.Has(fsnotify.Create):
				k.found(ctx, ev.Name)
			case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
				k.gone(ev.Name)
			}
		case _, ok := <-k.watcher.Errors:
			if !ok {
				return
			}
		}
	}
}

// found registers the socket at path, in the background as the
// kubelet's reconciler does, so a slow plugin holds up no other.
func (k *Kubelet) found(ctx context.Context, path string) {
	// The plugin watcher skips hidden files and anything not a socket.
	if strings.HasPrefix(filepath.Base(path), ".") {
		return
	}
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		return
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		err := k.register(ctx, path)
		if err != nil && ctx.Err() == nil {
			k.mu.Lock()
			k.refused[path] = err
			k.notifyLocked()
			k.mu.Unlock()
		}
	}()
}

// register follows the kubelet's plugin registration: GetInfo, the DRA
// handler's checks, then NotifyRegistrationStatus with the verdict.
func (k *Kubelet) register(ctx context.Context, socket string) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial %s: %w", socket, err)
	}
	defer func() { _ = conn.Close() }()
	reg := registerapi.NewRegistrationClient(conn)
	// The socket file exists from bind(); WaitForReady rides out the
	// moment before listen(), as the kubelet's retries do.
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("GetInfo %s: %w", socket, err)
	}
	p, verdict := k.validate(info)
	p.Socket = socket
	status := &registerapi.RegistrationStatus{PluginRegistered: verdict == nil}
	if verdict != nil {
		status.Error = verdict.Error()
	} else {
		p.conn, err = grpc.NewClient("unix://"+p.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("dial DRA endpoint %s: %w", p.Endpoint, err)
		}
		p.dra = drapb.NewDRAPluginClient(p.conn)
		p.health = drahealthv1.NewDRAResourceHealthClient(p.conn)
		k.mu.Lock()
		if old, ok := k.plugins[p.Name]; ok {
			_ = old.conn.Close()
		}
		k.plugins[p.Name] = p
		k.mu.Unlock()
	}
	// The kubelet tells the plugin, then publishes the registration.
	_, err = reg.NotifyRegistrationStatus(ctx, status)
	k.mu.Lock()
	k.notifyLocked()
	k.mu.Unlock()
	if verdict != nil {
		return verdict
	}
	if err != nil {
		return fmt.Errorf("NotifyRegistrationStatus %s: %w", socket, err)
	}
	return nil
}

// validate is the kubelet's check of a DRA PluginInfo.
func (k *Kubelet) validate(info *registerapi.PluginInfo) (*Plugin, error) {
	p := &Plugin{Name: info.Name, Endpoint: info.Endpoint, Services: info.SupportedVersions}
	switch {
	case info.Type != registerapi.DRAPlugin:
		return p, fmt.Errorf("plugin type %q is not %q", info.Type, registerapi.DRAPlugin)
	case info.Name == "":
		return p, errors.New("plugin name is empty")
	case !filepath.IsAbs(info.Endpoint):
		return p, fmt.Errorf("plugin endpoint %q is not an absolute path", info.Endpoint)
	case !slices.Contains(info.SupportedVersions, drapb.DRAPluginService):
		return p, fmt.Errorf("plugin %s offers none of the DRA services this kubelet speaks (%s): %v", info.Name, drapb.DRAPluginService, info.SupportedVersions)
	}
	return p, nil
}

// gone deregisters the plugin whose registration socket was removed.
func (k *Kubelet) gone(socket string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for name, p := range k.plugins {
		if p.Socket == socket {
			_ = p.conn.Close()
			delete(k.plugins, name)
			k.notifyLocked()
		}
	}
}

func (k *Kubelet) notifyLocked() {
	close(k.changed)
	k.changed = make(chan struct{})
}

// Changed is closed at the next registration, refusal or deregistration.
func (k *Kubelet) Changed() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.changed
}

// Lookup returns a registered plugin.
func (k *Kubelet) Lookup(name string) (*Plugin, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.plugins[name]
	return p, ok
}

// Refused returns the registrations turned down, by socket.
func (k *Kubelet) Refused() map[string]error {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]error, len(k.refused))
	for s, err := range k.refused {
		out[s] = err
	}
	return out
}

// Plugin waits until the driver name is registered.
func (k *Kubelet) Plugin(ctx context.Context, name string) (*Plugin, error) {
	for {
		changed := k.Changed()
		if p, ok := k.Lookup(name); ok {
			return p, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kubeletdra: waiting for plugin %s: %w", name, context.Cause(ctx))
		case <-changed:
		}
	}
}

// Gone waits until the driver name is not registered.
func (k *Kubelet) Gone(ctx context.Context, name string) error {
	for {
		changed := k.Changed()
		if _, ok := k.Lookup(name); !ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubeletdra: waiting for plugin %s to go: %w", name, context.Cause(ctx))
		case <-changed:
		}
	}
}

func claimRefs(claims []*resourceapi.ResourceClaim) []*drapb.Claim {
	out := make([]*drapb.Claim, 0, len(claims))
	for _, c := range claims {
		out = append(out, &drapb.Claim{Namespace: c.Namespace, Uid: string(c.UID), Name: c.Name})
	}
	return out
}

// Prepare calls NodePrepareResources for the claims, as the kubelet does
// before a pod's containers start: the driver reads the claims from the
// API itself. Like the kubelet, it holds a response lacking a claim to be
// an error; a claim's own failure is in its entry's Error.
func (p *Plugin) Prepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) (map[string]*drapb.NodePrepareResourceResponse, error) {
	resp, err := p.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claimRefs(claims)})
	if err != nil {
		return nil, fmt.Errorf("NodePrepareResources: %w", err)
	}
	for _, c := range claims {
		if _, ok := resp.Claims[string(c.UID)]; !ok {
			return nil, fmt.Errorf("NodePrepareResources left out claim %s/%s", c.Namespace, c.Name)
		}
	}
	return resp.Claims, nil
}

// Unprepare calls NodeUnprepareResources for the claims, as the kubelet
// does once no pod uses them.
func (p *Plugin) Unprepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) (map[string]*drapb.NodeUnprepareResourceResponse, error) {
	resp, err := p.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claimRefs(claims)})
	if err != nil {
		return nil, fmt.Errorf("NodeUnprepareResources: %w", err)
	}
	for _, c := range claims {
		if _, ok := resp.Claims[string(c.UID)]; !ok {
			return nil, fmt.Errorf("NodeUnprepareResources left out claim %s/%s", c.Namespace, c.Name)
		}
	}
	return resp.Claims, nil
}

// WatchHealth opens the DRAResourceHealth stream the kubelet keeps open
// to a driver that offers it.
func (p *Plugin) WatchHealth(ctx context.Context) (grpc.ServerStreamingClient[drahealthv1.NodeWatchResourcesResponse], error) {
	if !slices.Contains(p.Services, drahealthv1.DRAResourceHealthService) {
		return nil, fmt.Errorf("plugin %s does not offer %s", p.Name, drahealthv1.DRAResourceHealthService)
	}
	return p.health.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
}
