// Package dra is bcd's Dynamic Resource Allocation driver, gpu.bcd.dev:
// it publishes the GPUs the node offers its kubelet (kubebind.Set) as a
// ResourceSlice, and prepares the ResourceClaims the scheduler allocated
// from them by writing a CDI spec per claim and recording the claim as a
// holder, so a release waits until the claim's pod is gone.
//
// It is built on k8s.io/dynamic-resource-allocation/kubeletplugin: the
// helper serves the kubelet's plugin registration and DRA gRPC services
// and publishes the slices. The driver never hands out a device the Set
// does not offer, nor one that is quarantined, nor one another claim has
// prepared.
package dra

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/better-compute/better-compute/internal/kubebind"
)

const (
	// DriverName is the DRA driver name, the ResourceSlices' spec.driver
	// and the DeviceClass's selector.
	DriverName = "gpu.bcd.dev"
	// registeredAs is the plugin name recorded in kubebind.Set.
	registeredAs = "dra"
	// holderPrefix names a claim as a holder in kubebind.Set.
	holderPrefix = "claim/"
)

// Config configures the driver.
type Config struct {
	// Set is the node's offer (required).
	Set *kubebind.Set
	// NodeName is the Kubernetes node this bcd runs on, the pool name and
	// owner of the ResourceSlice (required).
	NodeName string
	// Client reads ResourceClaims and writes ResourceSlices (required).
	Client kubernetes.Interface
	// PluginDir holds the DRA socket the kubelet dials
	// (default /var/lib/kubelet/plugins/gpu.bcd.dev).
	PluginDir string
	// RegistrarDir is the kubelet's plugin registration directory
	// (default /var/lib/kubelet/plugins_registry).
	RegistrarDir string
	// CDIDir is where the container runtime reads CDI specs
	// (default /var/run/cdi).
	CDIDir string
	// HealthResend is how often device health is re-sent to the kubelet,
	// which forgets a report after HealthResend*3 (default 10s).
	HealthResend time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

func (c *Config) validate() error {
	switch {
	case c.Set == nil:
		return errors.New("dra: config Set is required")
	case c.NodeName == "":
		return errors.New("dra: config NodeName is required")
	case c.Client == nil:
		return errors.New("dra: config Client is required")
	}
	c.PluginDir = cmp.Or(c.PluginDir, filepath.Join(kubeletplugin.KubeletPluginsDir, DriverName))
	c.RegistrarDir = cmp.Or(c.RegistrarDir, kubeletplugin.KubeletRegistryDir)
	c.CDIDir = cmp.Or(c.CDIDir, kubeletplugin.DefaultCDIDir)
	c.HealthResend = cmp.Or(c.HealthResend, 10*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Driver is a running gpu.bcd.dev driver.
type Driver struct {
	cfg    Config
	log    *slog.Logger
	helper *kubeletplugin.Helper
	cancel context.CancelFunc
	done   chan struct{}
	stop   sync.Once

	// op serializes preparing, unpreparing and adopting claims: each
	// reads the holders and then changes them.
	op sync.Mutex
	// prepared remembers what each claim was given, so a repeated
	// prepare (the kubelet retries) answers the same even after the
	// device was quarantined or its reservation released meanwhile.
	mu       sync.Mutex
	prepared map[types.UID]kubeletplugin.PrepareResult
}

// Start registers the driver with the kubelet and publishes the node's
// offer until Stop or ctx ends.
func Start(ctx context.Context, cfg Config) (*Driver, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	for _, dir := range []string{cfg.PluginDir, cfg.RegistrarDir, cfg.CDIDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("dra: create %s: %w", dir, err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &Driver{
		cfg: cfg, log: cfg.Logger.With("component", "dra"), cancel: cancel, done: make(chan struct{}),
		prepared: map[types.UID]kubeletplugin.PrepareResult{},
	}
	// The helper and the slice controller log through klog's logr; its
	// gRPC call logs (V(6)) fall below slog's Info, so they show only at
	// debug levels.
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(d.log.Handler()))
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(cfg.Client),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDir),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir),
		kubeletplugin.GRPCInterceptor(d.watchRegistration),
	)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("dra: start kubelet plugin: %w", err)
	}
	d.helper = helper
	go d.publish(ctx)
	return d, nil
}

// Stop unregisters the driver (its sockets go, so the kubelet drops it)
// and stops publishing. The ResourceSlice stays: it is owned by the Node
// and a restarted bcd takes it over. Safe to call twice.
func (d *Driver) Stop() {
	d.stop.Do(func() {
		d.cancel()
		<-d.done
		d.helper.Stop()
		d.cfg.Set.SetRegistered(registeredAs, false)
	})
}

// watchRegistration records the kubelet's verdict on the registration:
// the helper keeps it to itself.
func (d *Driver) watchRegistration(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if st, ok := req.(*registerapi.RegistrationStatus); ok {
		d.cfg.Set.SetRegistered(registeredAs, st.PluginRegistered && err == nil)
		if st.PluginRegistered {
			d.log.Info("registered with the kubelet")
		} else {
			d.log.Warn("the kubelet refused the registration", "error", st.Error)
		}
	}
	return resp, err
}

// publish republishes the ResourceSlice at every change of the offer,
// and adopts the claims prepared before a restart once their GPUs are
// offered again.
func (d *Driver) publish(ctx context.Context) {
	defer close(d.done)
	// However the driver ends, the kubelet cannot reach it any more.
	defer d.cfg.Set.SetRegistered(registeredAs, false)
	for {
		// Taken before reading the offer, so no change is missed.
		changed := d.cfg.Set.Changed()
		d.adopt()
		if err := d.helper.PublishResources(ctx, d.resources()); err != nil && ctx.Err() == nil {
			d.log.Error("publish ResourceSlice", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// HandleError implements kubeletplugin.DRAPlugin: background errors of
// the helper (slice publishing, gRPC servers). A gRPC server that failed
// leaves the kubelet unable to reach the driver, so bcd stops claiming
// the binding.kubernetes capability through it.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.log.Warn(msg, "error", err)
		return
	}
	d.log.Error(msg, "error", err)
	d.cfg.Set.SetRegistered(registeredAs, false)
}
