package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"

	"github.com/better-compute/better-compute/internal/kube/deviceplugin"
	"github.com/better-compute/better-compute/internal/kube/dra"
	"github.com/better-compute/better-compute/internal/kube/podresources"
	"github.com/better-compute/better-compute/internal/kubebind"
)

// kubeOptions: --kubernetes offers binding: kubernetes reservations' GPUs
// to the node's kubelet (docs/kubernetes.md).
type kubeOptions struct {
	enabled    bool
	kubeletDir string
	// dra serves the gpu.bcd.dev DRA driver beside the device plugin
	// (it needs the adopted Node: --kube-node-name).
	dra    bool
	cdiDir string
}

// kubeFileConfig are the config file's keys for kubeOptions.
type kubeFileConfig struct {
	Kubernetes bool   `toml:"kubernetes" yaml:"kubernetes"`
	KubeletDir string `toml:"kubelet_dir" yaml:"kubelet_dir"`
}

func (o *kubeOptions) register(fs *flag.FlagSet) {
	fs.BoolVar(&o.enabled, "kubernetes", false, "offer binding: kubernetes reservations' GPUs to this node's kubelet: serve the bcd.dev/gpu device plugin and follow the pods holding them (docs/kubernetes.md)")
	fs.StringVar(&o.kubeletDir, "kubelet-dir", "/var/lib/kubelet", "with --kubernetes: the kubelet's root directory, holding device-plugins/kubelet.sock and pod-resources/kubelet.sock")
	fs.BoolVar(&o.dra, "kube-dra", true, "with --kubernetes and --kube-node-name: also serve the gpu.bcd.dev DRA driver (ResourceSlices for the Node, CDI specs for prepared claims)")
	fs.StringVar(&o.cdiDir, "kube-cdi-dir", "/var/run/cdi", "with --kube-dra: where the container runtime reads CDI specs")
}

func (o *kubeOptions) merge(fc kubeFileConfig, set map[string]bool) {
	if fc.Kubernetes && !set["kubernetes"] {
		o.enabled = true
	}
	if fc.KubeletDir != "" && !set["kubelet-dir"] {
		o.kubeletDir = fc.KubeletDir
	}
}

func (o *kubeOptions) validate(mode string) error {
	if !o.enabled {
		return nil
	}
	if mode != "node" {
		return fmt.Errorf("--kubernetes: only --mode node offers GPUs to a kubelet, not %s", mode)
	}
	if !filepath.IsAbs(o.kubeletDir) {
		return fmt.Errorf("--kubelet-dir %q: must be an absolute path", o.kubeletDir)
	}
	if o.dra && !filepath.IsAbs(o.cdiDir) {
		return fmt.Errorf("--kube-cdi-dir %q: must be an absolute path", o.cdiDir)
	}
	return nil
}

// kubeRun is what --kubernetes runs beside the agent: the device plugin
// and the pod-resources poller, over one offer.
type kubeRun struct {
	// Set and Holders go to agent.Config (Kube, KubeHolders); nil
	// without --kubernetes.
	Set     *kubebind.Set
	Holders <-chan struct{}
	stop    func() error
}

// Stop ends the plugin and the poller and waits for them.
func (k *kubeRun) Stop() error {
	if k.stop == nil {
		return nil
	}
	return k.stop()
}

// startKube starts the device plugin and the poller under ctx. The
// kubelet need not be up: the plugin registers when its socket appears,
// and releases wait until the poller has asked it once.
func (o *kubeOptions) start(ctx context.Context, n *kubeNode, log *slog.Logger) (*kubeRun, error) {
	if !o.enabled {
		return &kubeRun{}, nil
	}
	set := kubebind.New()
	plugin, err := deviceplugin.New(deviceplugin.Config{Set: set, Dir: filepath.Join(o.kubeletDir, "device-plugins"),
		Logger: log.With("component", "deviceplugin")})
	if err != nil {
		return nil, err
	}
	poller, err := podresources.New(podresources.Config{Set: set, Socket: filepath.Join(o.kubeletDir, "pod-resources", "kubelet.sock"),
		Logger: log.With("component", "podresources")})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	// The DRA driver publishes the Node's slices: it needs the adopted
	// Node's name and client.
	var driver *dra.Driver
	if o.dra && n != nil {
		driver, err = dra.Start(ctx, dra.Config{Set: set, NodeName: n.name, Client: n.client,
			PluginDir:    filepath.Join(o.kubeletDir, "plugins", dra.DriverName),
			RegistrarDir: filepath.Join(o.kubeletDir, "plugins_registry"), CDIDir: o.cdiDir,
			Logger: log.With("component", "dra")})
		if err != nil {
			cancel()
			return nil, fmt.Errorf("DRA driver: %w", err)
		}
	} else if o.dra {
		log.Info("no DRA driver: it needs --kube-node-name (the device plugin serves alone)")
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Go(func() { errs <- plugin.Run(ctx) })
	wg.Go(func() { errs <- poller.Run(ctx) })
	log.Info("offering binding: kubernetes GPUs to the kubelet", "resource", deviceplugin.ResourceName, "kubelet_dir", o.kubeletDir, "dra", driver != nil)
	return &kubeRun{Set: set, Holders: poller.Synced(), stop: func() error {
		if driver != nil {
			driver.Stop()
		}
		cancel()
		wg.Wait()
		close(errs)
		var err error
		for e := range errs {
			err = errors.Join(err, e)
		}
		return errors.Join(err, poller.Close())
	}}, nil
}
