// Package kubelet is a test kubelet for bcd's device plugin: it speaks the
// kubelet's real protocols over unix sockets in a directory of its own.
// It serves Registration on device-plugins/kubelet.sock and, like the
// kubelet's device manager, dials each plugin that registers, asks its
// options and follows its ListAndWatch stream; it calls the plugin's
// Allocate and GetPreferredAllocation when a test asks; and it serves
// PodResourcesLister on pod-resources/kubelet.sock with the pods a test
// adds. Restart makes it come back as a restarted kubelet does: every
// socket in device-plugins removed, a new kubelet.sock, no plugin known.
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Namespace is the namespace of the pods AddPod adds.
const Namespace = "default"

// Registration is one Register call the kubelet took.
type Registration struct {
	Version, Endpoint, ResourceName string
	Options                         *v1beta1.DevicePluginOptions
}

// Kubelet is the test kubelet.
type Kubelet struct {
	dir string

	mu      sync.Mutex
	changed chan struct{}
	regs    []Registration
	// plugin is the latest registered plugin's connection.
	plugin  *grpc.ClientConn
	options *v1beta1.DevicePluginOptions
	// devices is the latest ListAndWatch list (ID → health) and lists
	// how many lists arrived from the latest plugin.
	devices   map[string]string
	lists     int
	streamErr error
	pods      map[string][]string
	reg       *grpc.Server
	pr        *grpc.Server
	cancel    context.CancelFunc
	closed    bool
}

// Start serves under dir (created): dir/device-plugins/kubelet.sock and
// dir/pod-resources/kubelet.sock.
func Start(dir string) (*Kubelet, error) {
	k := &Kubelet{dir: dir, changed: make(chan struct{}), pods: map[string][]string{}}
	for _, d := range []string{k.DevicePluginDir(), filepath.Dir(k.PodResourcesSocket())} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("kubelet: %w", err)
		}
	}
	if err := k.start(); err != nil {
		return nil, err
	}
	return k, nil
}

// DevicePluginDir is the device-plugins directory (bcd --kubelet-dir's
// device-plugins).
func (k *Kubelet) DevicePluginDir() string { return filepath.Join(k.dir, "device-plugins") }

// PodResourcesSocket is the PodResources socket.
func (k *Kubelet) PodResourcesSocket() string {
	return filepath.Join(k.dir, "pod-resources", "kubelet.sock")
}

func (k *Kubelet) start() error {
	ctx, cancel := context.WithCancel(context.Background())
	// As the kubelet's device manager does at start: sockets left in the
	// directory are gone, plugins must register again.
	entries, err := os.ReadDir(k.DevicePluginDir())
	if err != nil {
		cancel()
		return fmt.Errorf("kubelet: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			_ = os.Remove(filepath.Join(k.DevicePluginDir(), e.Name()))
		}
	}
	_ = os.Remove(k.PodResourcesSocket())
	rl, err := net.Listen("unix", filepath.Join(k.DevicePluginDir(), "kubelet.sock"))
	if err != nil {
		cancel()
		return fmt.Errorf("kubelet: %w", err)
	}
	pl, err := net.Listen("unix", k.PodResourcesSocket())
	if err != nil {
		cancel()
		_ = rl.Close()
		return fmt.Errorf("kubelet: %w", err)
	}
	reg := grpc.NewServer()
	v1beta1.RegisterRegistrationServer(reg, &registration{k: k, ctx: ctx})
	pr := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(pr, &lister{k: k})
	go func() { _ = reg.Serve(rl) }()
	go func() { _ = pr.Serve(pl) }()
	k.mu.Lock()
	k.reg, k.pr, k.cancel = reg, pr, cancel
	k.mu.Unlock()
	return nil
}

func (k *Kubelet) stop() {
	k.mu.Lock()
	reg, pr, cancel, plugin := k.reg, k.pr, k.cancel, k.plugin
	k.reg, k.pr, k.cancel, k.plugin = nil, nil, nil, nil
	k.devices, k.options, k.lists, k.streamErr = nil, nil, 0, nil
	k.notifyLocked()
	k.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if plugin != nil {
		_ = plugin.Close()
	}
	if reg != nil {
		reg.Stop()
	}
	if pr != nil {
		pr.Stop()
	}
}

// Restart stops the kubelet and starts it again: the plugin must
// register again. Pods survive (they run on).
func (k *Kubelet) Restart() error {
	k.stop()
	return k.start()
}

// Close stops the kubelet.
func (k *Kubelet) Close() {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	k.closed = true
	k.mu.Unlock()
	k.stop()
}

func (k *Kubelet) notifyLocked() {
	close(k.changed)
	k.changed = make(chan struct{})
}

// State is what the kubelet knows of its device plugin.
type State struct {
	// Registrations are every Register call taken, oldest first.
	Registrations []Registration
	// Options are what the latest plugin's GetDevicePluginOptions said.
	Options *v1beta1.DevicePluginOptions
	// Devices is the latest ListAndWatch list, ID → Healthy/Unhealthy;
	// Lists how many lists the latest plugin sent (0: none yet).
	Devices map[string]string
	Lists   int
	// StreamErr is why the latest ListAndWatch stream ended.
	StreamErr error
}

// Healthy are the IDs of the healthy devices, sorted.
func (s State) Healthy() []string {
	var out []string
	for id, h := range s.Devices {
		if h == v1beta1.Healthy {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// State returns what the kubelet knows now.
func (k *Kubelet) State() State {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.stateLocked()
}

func (k *Kubelet) stateLocked() State {
	return State{Registrations: slices.Clone(k.regs), Options: k.options, Devices: maps.Clone(k.devices), Lists: k.lists, StreamErr: k.streamErr}
}

// Wait returns the state once ok accepts it, or ctx's error with the
// last state seen.
func (k *Kubelet) Wait(ctx context.Context, ok func(State) bool) (State, error) {
	for {
		k.mu.Lock()
		s, ch := k.stateLocked(), k.changed
		k.mu.Unlock()
		if ok(s) {
			return s, nil
		}
		select {
		case <-ctx.Done():
			//nolint:errorlint // the stream's error is part of a state report (often nil), not the cause
			return s, fmt.Errorf("kubelet: %w; last state: %d registrations, %d lists, devices %v, stream %v",
				ctx.Err(), len(s.Registrations), s.Lists, s.Devices, s.StreamErr)
		case <-ch:
		}
	}
}

// pluginClient is the latest registered plugin.
func (k *Kubelet) pluginClient() (v1beta1.DevicePluginClient, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.plugin == nil {
		return nil, errors.New("kubelet: no device plugin registered")
	}
	return v1beta1.NewDevicePluginClient(k.plugin), nil
}

// Allocate asks the plugin for one container's devices, as the kubelet
// does when it admits a pod.
func (k *Kubelet) Allocate(ctx context.Context, ids ...string) (*v1beta1.ContainerAllocateResponse, error) {
	c, err := k.pluginClient()
	if err != nil {
		return nil, err
	}
	resp, err := c.Allocate(ctx, &v1beta1.AllocateRequest{ContainerRequests: []*v1beta1.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, err
	}
	if len(resp.GetContainerResponses()) != 1 {
		return nil, fmt.Errorf("kubelet: Allocate answered %d containers for 1", len(resp.GetContainerResponses()))
	}
	return resp.GetContainerResponses()[0], nil
}

// GetPreferredAllocation asks the plugin which of available it prefers
// for one container of size devices.
func (k *Kubelet) GetPreferredAllocation(ctx context.Context, available, mustInclude []string, size int) ([]string, error) {
	c, err := k.pluginClient()
	if err != nil {
		return nil, err
	}
	resp, err := c.GetPreferredAllocation(ctx, &v1beta1.PreferredAllocationRequest{ContainerRequests: []*v1beta1.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: available, MustIncludeDeviceIDs: mustInclude, AllocationSize: int32(size),
	}}})
	if err != nil {
		return nil, err
	}
	if len(resp.GetContainerResponses()) != 1 {
		return nil, fmt.Errorf("kubelet: GetPreferredAllocation answered %d containers for 1", len(resp.GetContainerResponses()))
	}
	return resp.GetContainerResponses()[0].GetDeviceIDs(), nil
}

// AddPod makes PodResources list a pod (namespace Namespace, name uid)
// with one container holding deviceIDs of resource bcd.dev/gpu.
func (k *Kubelet) AddPod(uid string, deviceIDs []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods[uid] = slices.Clone(deviceIDs)
}

// RemovePod makes PodResources list it no more.
func (k *Kubelet) RemovePod(uid string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.pods, uid)
}

// registration serves the kubelet's Registration service.
type registration struct {
	v1beta1.UnimplementedRegistrationServer
	k   *Kubelet
	ctx context.Context
}

// Register records the plugin and, as the device manager does, connects
// to it in the background: options first, then the ListAndWatch stream.
func (r *registration) Register(_ context.Context, req *v1beta1.RegisterRequest) (*v1beta1.Empty, error) {
	if !slices.Contains(v1beta1.SupportedVersions[:], req.GetVersion()) {
		return nil, status.Errorf(codes.InvalidArgument, "unsupported device plugin API version %q", req.GetVersion())
	}
	if req.GetResourceName() == "" || req.GetEndpoint() == "" {
		return nil, status.Error(codes.InvalidArgument, "resource name and endpoint are required")
	}
	k := r.k
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.DevicePluginDir(), req.GetEndpoint()), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "endpoint %q: %v", req.GetEndpoint(), err)
	}
	k.mu.Lock()
	old := k.plugin
	k.regs = append(k.regs, Registration{Version: req.GetVersion(), Endpoint: req.GetEndpoint(), ResourceName: req.GetResourceName(), Options: req.GetOptions()})
	k.plugin, k.devices, k.options, k.lists, k.streamErr = conn, nil, nil, 0, nil
	k.notifyLocked()
	k.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	go r.follow(conn)
	return &v1beta1.Empty{}, nil
}

func (r *registration) follow(conn *grpc.ClientConn) {
	k := r.k
	c := v1beta1.NewDevicePluginClient(conn)
	end := func(err error) {
		k.mu.Lock()
		if k.plugin == conn {
			k.streamErr = err
			k.notifyLocked()
		}
		k.mu.Unlock()
	}
	opts, err := c.GetDevicePluginOptions(r.ctx, &v1beta1.Empty{})
	if err != nil {
		end(fmt.Errorf("GetDevicePluginOptions: %w", err))
		return
	}
	k.mu.Lock()
	if k.plugin == conn {
		k.options = opts
		k.notifyLocked()
	}
	k.mu.Unlock()
	stream, err := c.ListAndWatch(r.ctx, &v1beta1.Empty{})
	if err != nil {
		end(fmt.Errorf("ListAndWatch: %w", err))
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			end(fmt.Errorf("ListAndWatch: %w", err))
			return
		}
		devs := map[string]string{}
		for _, d := range resp.GetDevices() {
			devs[d.GetID()] = d.GetHealth()
		}
		k.mu.Lock()
		if k.plugin != conn {
			k.mu.Unlock()
			return
		}
		k.devices = devs
		k.lists++
		k.notifyLocked()
		k.mu.Unlock()
	}
}

// lister serves PodResourcesLister.
type lister struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	k *Kubelet
}

func (l *lister) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	l.k.mu.Lock()
	defer l.k.mu.Unlock()
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for _, uid := range slices.Sorted(maps.Keys(l.k.pods)) {
		resp.PodResources = append(resp.PodResources, &podresourcesv1.PodResources{
			Name: uid, Namespace: Namespace,
			Containers: []*podresourcesv1.ContainerResources{{Name: "main", Devices: []*podresourcesv1.ContainerDevices{{
				ResourceName: "bcd.dev/gpu", DeviceIds: slices.Clone(l.k.pods[uid]),
			}}}},
		})
	}
	return resp, nil
}
