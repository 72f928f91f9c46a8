// Package deviceplugin is bcd's kubelet device plugin: it serves the
// kubelet's device plugin API (v1beta1) on a unix socket in the kubelet's
// device-plugins directory and registers resource bcd.dev/gpu with the
// kubelet. The devices it lists are the node's offer (kubebind.Set): the
// GPUs booked by binding: kubernetes reservations, healthy until health
// quarantines them. The kubelet gets a GPU only through Allocate, and only
// one that is offered and healthy.
package deviceplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/better-compute/better-compute/internal/kubebind"
)

const (
	// ResourceName is the extended resource pods ask for.
	ResourceName = "bcd.dev/gpu"
	// AnnotationReservation names, on the container, the reservation
	// whose GPUs it got.
	AnnotationReservation = "bcd.dev/reservation"
	// PluginName is the name it registers under in the Set.
	PluginName = "deviceplugin"
	// HolderPrefix names the holds Allocate makes for a container the
	// kubelet is about to start: "allocating/<n>". They keep a release
	// from completing in the moment between Allocate and the pod showing
	// in the kubelet's pod resources (package podresources lets go of
	// them once it does, or the grace runs out).
	HolderPrefix = "allocating/"
	// ClaimHolderPrefix names the DRA driver's holders (claim/<uid>).
	ClaimHolderPrefix = "claim/"
	// DefaultSocket is the plugin's socket in the device-plugins
	// directory.
	DefaultSocket = "bcd-gpu.sock"
)

// Config configures a Plugin. Zero values take the defaults noted.
type Config struct {
	// Set is the node's offer; required.
	Set *kubebind.Set
	// Dir is the kubelet's device-plugins directory, holding its
	// kubelet.sock (default /var/lib/kubelet/device-plugins/).
	Dir string
	// Socket is the plugin's socket file name in Dir (default
	// bcd-gpu.sock).
	Socket string
	// WatchInterval is how often kubelet.sock and the plugin's socket
	// are looked at: a kubelet that restarts removes every socket in Dir
	// and makes a new kubelet.sock, and the plugin must serve and
	// register again (default 1 s).
	WatchInterval time.Duration
	// AllocateGrace is how long a container's Allocate holds its GPUs
	// before the kubelet's pod resources must list its pod (default
	// 2 minutes, room for a slow container runtime; package
	// podresources lets go sooner, once the pod is listed).
	AllocateGrace time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Plugin serves the device plugin API for the Set.
type Plugin struct {
	v1beta1.UnimplementedDevicePluginServer
	cfg  Config
	log  *slog.Logger
	seq  atomic.Uint64
	runs atomic.Bool

	mu         sync.Mutex
	registered bool
	regChanged chan struct{}
}

// New checks cfg and fills its defaults.
func New(cfg Config) (*Plugin, error) {
	if cfg.Set == nil {
		return nil, errors.New("deviceplugin: Set is required")
	}
	cfg.Dir = cmp.Or(cfg.Dir, v1beta1.DevicePluginPath)
	cfg.Socket = cmp.Or(cfg.Socket, DefaultSocket)
	if strings.Contains(cfg.Socket, "/") {
		return nil, fmt.Errorf("deviceplugin: Socket %q must be a file name in Dir", cfg.Socket)
	}
	cfg.WatchInterval = cmp.Or(cfg.WatchInterval, time.Second)
	cfg.AllocateGrace = cmp.Or(cfg.AllocateGrace, 2*time.Minute)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Plugin{cfg: cfg, log: cfg.Logger, regChanged: make(chan struct{})}, nil
}

// Registered reports whether a registration with the kubelet holds now,
// and a channel closed at its next change.
func (p *Plugin) Registered() (bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registered, p.regChanged
}

func (p *Plugin) setRegistered(ok bool) {
	p.cfg.Set.SetRegistered(PluginName, ok)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.registered != ok {
		p.registered = ok
		close(p.regChanged)
		p.regChanged = make(chan struct{})
	}
}

// SocketPath is where the plugin serves.
func (p *Plugin) SocketPath() string { return filepath.Join(p.cfg.Dir, p.cfg.Socket) }

// KubeletSocket is the kubelet's registration socket.
func (p *Plugin) KubeletSocket() string { return filepath.Join(p.cfg.Dir, "kubelet.sock") }

// Run serves and registers until ctx ends, serving and registering again
// whenever the kubelet restarts. The Set says "registered" while a
// registration holds.
func (p *Plugin) Run(ctx context.Context) error {
	if !p.runs.CompareAndSwap(false, true) {
		return errors.New("deviceplugin: already running")
	}
	defer p.runs.Store(false)
	defer p.setRegistered(false)
	t := time.NewTicker(p.cfg.WatchInterval)
	defer t.Stop()
	for {
		err := p.serveOnce(ctx, t.C)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			p.log.Warn("kubelet device plugin", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}
}

// serveOnce serves on a fresh socket, registers with the kubelet and
// returns when the kubelet restarted (or ctx ended).
func (p *Plugin) serveOnce(ctx context.Context, tick <-chan time.Time) error {
	sock := p.SocketPath()
	if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", sock, err)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	srv := grpc.NewServer()
	v1beta1.RegisterDevicePluginServer(srv, p)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	defer func() {
		srv.Stop()
		<-served
	}()
	// The kubelet may not be up yet: wait for its socket.
	var kubelet os.FileInfo
	for {
		kubelet, err = os.Stat(p.KubeletSocket())
		if err == nil {
			if err = p.register(ctx); err == nil {
				break
			}
			p.log.Warn("register with the kubelet", "socket", p.KubeletSocket(), "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
		}
	}
	p.setRegistered(true)
	defer p.setRegistered(false)
	p.log.Info("registered with the kubelet", "resource", ResourceName, "socket", sock)
	mine, err := os.Stat(sock)
	if err != nil {
		return fmt.Errorf("stat %s: %w", sock, err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
		}
		// A restarted kubelet made a new kubelet.sock (and removed ours):
		// it knows no plugin until we register again.
		k, kerr := os.Stat(p.KubeletSocket())
		m, merr := os.Stat(sock)
		if kerr != nil || merr != nil || !os.SameFile(k, kubelet) || !k.ModTime().Equal(kubelet.ModTime()) || !os.SameFile(m, mine) {
			p.log.Info("the kubelet restarted: registering again")
			return nil
		}
	}
}

func (p *Plugin) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+p.KubeletSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = v1beta1.NewRegistrationClient(conn).Register(rctx, &v1beta1.RegisterRequest{
		Version: v1beta1.Version, Endpoint: p.cfg.Socket, ResourceName: ResourceName, Options: options(),
	})
	return err
}

func options() *v1beta1.DevicePluginOptions {
	return &v1beta1.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions: bcd prefers allocations (one reservation, one
// NVLink island) and needs no PreStartContainer.
func (p *Plugin) GetDevicePluginOptions(context.Context, *v1beta1.Empty) (*v1beta1.DevicePluginOptions, error) {
	return options(), nil
}

// ListAndWatch sends the offered devices at once and again at every
// change of the offer (a bind, a release, a quarantine).
func (p *Plugin) ListAndWatch(_ *v1beta1.Empty, s grpc.ServerStreamingServer[v1beta1.ListAndWatchResponse]) error {
	for {
		// Taken before the list is read: a change in between is not lost.
		changed := p.cfg.Set.Changed()
		if err := s.Send(p.list()); err != nil {
			return err
		}
		select {
		case <-s.Context().Done():
			return nil
		case <-changed:
		}
	}
}

func (p *Plugin) list() *v1beta1.ListAndWatchResponse {
	devs := p.cfg.Set.Devices()
	r := &v1beta1.ListAndWatchResponse{Devices: make([]*v1beta1.Device, 0, len(devs))}
	for _, d := range devs {
		h := v1beta1.Healthy
		if !d.Healthy {
			h = v1beta1.Unhealthy
		}
		r.Devices = append(r.Devices, &v1beta1.Device{ID: d.UUID, Health: h})
	}
	return r
}

// GetPreferredAllocation picks, for each container, devices of one
// reservation, and within it of one NVLink island where it can: a
// container's GPUs must come from one reservation (Allocate refuses a
// mix), and GPUs on one island talk fastest.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *v1beta1.PreferredAllocationRequest) (*v1beta1.PreferredAllocationResponse, error) {
	resp := &v1beta1.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		resp.ContainerResponses = append(resp.ContainerResponses, &v1beta1.ContainerPreferredAllocationResponse{
			DeviceIDs: p.prefer(cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize())),
		})
	}
	return resp, nil
}

func (p *Plugin) prefer(available, must []string, size int) []string {
	type cand struct {
		uuid, alloc, island string
	}
	var cands []cand
	for _, u := range available {
		d, ok := p.cfg.Set.Device(u)
		if !ok || !d.Healthy || slices.Contains(must, u) {
			continue
		}
		cands = append(cands, cand{u, d.AllocationID, d.NVLinkIsland})
	}
	out := slices.Clone(must)
	if len(out) >= size {
		return out
	}
	// The reservation: the one the devices the kubelet must include
	// belong to, else the smallest one that has enough (best fit, so a
	// larger one stays whole for a larger pod), else the largest.
	alloc := ""
	for _, u := range must {
		if d, ok := p.cfg.Set.Device(u); ok {
			alloc = d.AllocationID
			break
		}
	}
	if alloc == "" {
		count := map[string]int{}
		for _, c := range cands {
			count[c.alloc]++
		}
		need := size - len(out)
		best := ""
		for _, a := range slices.Sorted(maps.Keys(count)) {
			switch {
			case best == "":
				best = a
			case count[a] >= need && (count[best] < need || count[a] < count[best]):
				best = a
			case count[best] < need && count[a] > count[best]:
				best = a
			}
		}
		alloc = best
	}
	// Within it, islands the chosen devices are on first, then larger
	// islands; devices of other reservations last.
	islands := map[string]int{}
	chosen := map[string]bool{}
	for _, u := range must {
		if d, ok := p.cfg.Set.Device(u); ok && d.NVLinkIsland != "" {
			chosen[d.NVLinkIsland] = true
		}
	}
	for _, c := range cands {
		if c.alloc == alloc {
			islands[c.island]++
		}
	}
	rank := func(c cand) (int, int) {
		switch {
		case c.alloc != alloc:
			return 2, 0
		case chosen[c.island]:
			return 0, 0
		}
		return 1, -islands[c.island]
	}
	slices.SortStableFunc(cands, func(a, b cand) int {
		ra, sa := rank(a)
		rb, sb := rank(b)
		return cmp.Or(cmp.Compare(ra, rb), cmp.Compare(sa, sb), strings.Compare(a.island, b.island), strings.Compare(a.uuid, b.uuid))
	})
	for _, c := range cands {
		if len(out) == size {
			break
		}
		out = append(out, c.uuid)
	}
	return out
}

// Allocate hands a container the device nodes of its GPUs, the CUDA
// environment naming them and the reservation they belong to. Every GPU
// must be offered now and healthy, and all of one container's must come
// from one reservation: a pod cannot stitch two reservations together.
func (p *Plugin) Allocate(_ context.Context, req *v1beta1.AllocateRequest) (*v1beta1.AllocateResponse, error) {
	resp := &v1beta1.AllocateResponse{}
	var held []string
	fail := func(err error) (*v1beta1.AllocateResponse, error) {
		for _, h := range held {
			p.cfg.Set.Let(h)
		}
		return nil, err
	}
	// A GPU a DRA claim prepared is that claim's pod's: the kubelet
	// counts device-plugin and DRA devices apart, so bcd refuses here as
	// its DRA driver refuses a GPU a pod holds.
	claimed := map[string]string{}
	for h, us := range p.cfg.Set.Holders() {
		if strings.HasPrefix(h, ClaimHolderPrefix) {
			for _, u := range us {
				claimed[u] = h
			}
		}
	}
	for i, cr := range req.GetContainerRequests() {
		ids := cr.GetDevicesIds()
		if len(ids) == 0 {
			return fail(status.Errorf(codes.InvalidArgument, "container request %d: no devices", i))
		}
		alloc, first := "", ""
		var paths []string
		for _, id := range ids {
			d, ok := p.cfg.Set.Device(id)
			if !ok {
				return fail(status.Errorf(codes.FailedPrecondition, "container request %d: device %s is not offered by bcd: no binding: kubernetes reservation holds it on this node now", i, id))
			}
			if !d.Healthy {
				return fail(status.Errorf(codes.FailedPrecondition, "container request %d: device %s is unhealthy (quarantined by bcd's health monitoring)", i, id))
			}
			if h, ok := claimed[id]; ok {
				return fail(status.Errorf(codes.FailedPrecondition, "container request %d: device %s is held by DRA %s", i, id, h))
			}
			if alloc != "" && d.AllocationID != alloc {
				return fail(status.Errorf(codes.InvalidArgument, "container request %d: devices %s and %s belong to reservations %s and %s: one container takes the GPUs of one reservation",
					i, first, id, alloc, d.AllocationID))
			}
			alloc, first = d.AllocationID, cmp.Or(first, id)
			for _, path := range d.Paths {
				if !slices.Contains(paths, path) {
					paths = append(paths, path)
				}
			}
		}
		holder := fmt.Sprintf("%s%d", HolderPrefix, p.seq.Add(1))
		if err := p.cfg.Set.Hold(holder, ids); err != nil {
			// Withdrawn or quarantined since the checks above.
			return fail(status.Errorf(codes.FailedPrecondition, "container request %d: %v", i, err))
		}
		held = append(held, holder)
		cresp := &v1beta1.ContainerAllocateResponse{
			Envs: map[string]string{
				"NVIDIA_VISIBLE_DEVICES": strings.Join(ids, ","),
				"CUDA_VISIBLE_DEVICES":   strings.Join(ids, ","),
			},
			Annotations: map[string]string{AnnotationReservation: alloc},
		}
		for _, path := range paths {
			cresp.Devices = append(cresp.Devices, &v1beta1.DeviceSpec{ContainerPath: path, HostPath: path, Permissions: "rw"})
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	for _, h := range held {
		time.AfterFunc(p.cfg.AllocateGrace, func() { p.cfg.Set.Let(h) })
	}
	return resp, nil
}

// PreStartContainer is not asked for (PreStartRequired is false).
func (p *Plugin) PreStartContainer(context.Context, *v1beta1.PreStartContainerRequest) (*v1beta1.PreStartContainerResponse, error) {
	return &v1beta1.PreStartContainerResponse{}, nil
}
