package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
	"go.yaml.in/yaml/v3"

	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/release"
)

type options struct {
	configFile    string
	server        string
	stateDir      string
	hardware      string
	fakeSeed      string
	sysfsRoot     string
	cgroupRoot    string
	metricsListen string
	mode          string
	logLevel      string
	tokenStdin    bool
	tokenEnvFile  string
	heartbeat     time.Duration
	helloTimeout  time.Duration
	keepalive     time.Duration
	showVersion   bool
	otlpEndpoint  string
	otlpInsecure  bool
	imageKeys     string
	releaseKeys   stringList
	spoolDir      string
	execIDs       string
	attest        agent.AttestConfig
	kubeNode      kubeNodeOptions
	site          siteOptions
	inst          instanceOptions
	kube          kubeOptions
}

// instanceOptions configure a node that runs instances (QEMU guests).
type instanceOptions struct {
	dir, images, bridge, bridgeAddress, netns, accel string
}

// siteOptions configure --mode site's provisioning services.
type siteOptions struct {
	iface, dhcpMode, serverIP, subnet, rangeSpec, router string
	bootDir, filesDir, cacheDir, httpListen              string
	kernel, initrd, cmdline                              string
	controlPlaneURL                                      string
	driversDir                                           string
}

func (o *options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.configFile, "config", "", "config file (TOML or YAML by extension; must be mode 0600); flags override it")
	fs.StringVar(&o.server, "server", "", "gateway HOST:PORT, or several comma-separated (a name may resolve to several); bcd moves to the next when a session fails")
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/bcd", "state directory (key, certificates, command log)")
	fs.StringVar(&o.hardware, "hardware", "nvml", "GPU backend: nvml, none, or fake:dgxh100|dgxa100|dgxb200[:FIXTURE]")
	fs.StringVar(&o.fakeSeed, "fake-seed", "", "seed for the fake backend's identity (default: the state dir)")
	fs.StringVar(&o.sysfsRoot, "sysfs-root", "/", "root under which /sys and /proc are read")
	fs.StringVar(&o.cgroupRoot, "cgroup-root", "/sys/fs/cgroup/bettercompute", "cgroup v2 directory bcd owns for allocations; must be on a cgroup2 filesystem (any directory with --hardware fake:…)")
	fs.StringVar(&o.execIDs, "exec-ids", "1879048192:65536", "FIRST:COUNT: the uids/gids bcd gives allocations' processes, one per reservation; no account of the host may use them")
	fs.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:9101", "address for /metrics; empty disables")
	fs.StringVar(&o.mode, "mode", "node", "agent mode: node, site or ramdisk")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.tokenStdin, "token-stdin", false, "read the join token from stdin instead of BCD_JOIN_TOKEN")
	fs.StringVar(&o.attest.Attestor, "attest", "", "evidence the join brings besides its token: tpm, x509, cloud or kubelet (docs/attestation.md)")
	fs.StringVar(&o.attest.TPM, "attest-tpm", "/dev/tpmrm0", "TPM 2.0 for --attest tpm: a device, or tcp://HOST:PORT (swtpm)")
	fs.StringVar(&o.attest.X509Cert, "attest-x509-cert", "", "machine certificate chain (PEM) for --attest x509")
	fs.StringVar(&o.attest.X509Key, "attest-x509-key", "", "its private key (PEM) for --attest x509")
	fs.StringVar(&o.attest.MetadataURL, "attest-cloud-metadata-url", agent.DefaultMetadataURL, "instance metadata service for --attest cloud")
	fs.StringVar(&o.attest.KubeletCert, "attest-kubelet-cert", agent.DefaultKubeletCert, "the kubelet's client certificate and key (one PEM file) for --attest kubelet")
	o.kubeNode.register(fs)
	fs.StringVar(&o.tokenEnvFile, "token-env-file", "", "file holding BCD_JOIN_TOKEN, removed after a successful join")
	fs.DurationVar(&o.heartbeat, "heartbeat-interval", 0, "override the gateway's heartbeat interval (testing)")
	fs.DurationVar(&o.helloTimeout, "hello-timeout", 30*time.Second, "give up on a session whose HelloAck has not come this long after opening it, and dial again")
	fs.DurationVar(&o.keepalive, "keepalive", 30*time.Second, "ping the gateway after this long without traffic from it; no answer in 10s drops the connection (at least 10s)")
	fs.StringVar(&o.otlpEndpoint, "otlp-endpoint", "", "export OpenTelemetry traces to this OTLP/gRPC collector (host:port or URL); empty: off unless OTEL_EXPORTER_OTLP_ENDPOINT is set")
	fs.BoolVar(&o.otlpInsecure, "otlp-insecure", false, "send traces to a host:port --otlp-endpoint without TLS")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	fs.Var(&o.releaseKeys, "release-pubkey", "release public key (PEM, release keygen's release.pub) daemon.upgrade trusts; repeat for several; none: bcd refuses every upgrade")
	fs.StringVar(&o.imageKeys, "trusted-image-keys", "", "ramdisk mode: PEM file of the public keys image.write accepts signatures of (besides the keys each command names)")
	fs.StringVar(&o.spoolDir, "spool-dir", "", "ramdisk mode: where a downloaded image waits until it verified (default the temp dir)")
	fs.StringVar(&o.site.iface, "site-interface", "", "site mode: the provisioning network's interface DHCP binds to")
	fs.StringVar(&o.site.dhcpMode, "site-dhcp", "proxy", "site mode: proxy (proxyDHCP beside the network's DHCP server) or full (hand out --site-range)")
	fs.StringVar(&o.site.serverIP, "site-server-ip", "", "site mode: this host's address on the provisioning network (TFTP next-server, script URLs); required")
	fs.StringVar(&o.site.subnet, "site-subnet", "", "site mode, full DHCP: the provisioning subnet, e.g. 10.0.0.0/24")
	fs.StringVar(&o.site.rangeSpec, "site-range", "", "site mode, full DHCP: addresses handed out, FIRST-LAST")
	fs.StringVar(&o.site.router, "site-router", "", "site mode, full DHCP: the default gateway handed out (optional)")
	fs.StringVar(&o.site.bootDir, "site-boot-dir", "/usr/lib/ipxe", "site mode: directory of the iPXE chainload binaries TFTP serves")
	fs.StringVar(&o.site.filesDir, "site-files-dir", "", "site mode: directory HTTP serves kernels, initrds and images from by name")
	fs.StringVar(&o.site.cacheDir, "site-cache-dir", "", "site mode: content-addressed image cache (default STATE_DIR/cache)")
	fs.StringVar(&o.site.httpListen, "site-http-listen", ":80", "site mode: address of the HTTP server for iPXE scripts and files")
	fs.StringVar(&o.site.kernel, "site-ramdisk-kernel", "", "site mode: the commissioning ramdisk's kernel (a file in --site-files-dir, sha256:…, or a URL)")
	fs.StringVar(&o.site.initrd, "site-ramdisk-initrd", "", "site mode: the commissioning ramdisk's initrd (as --site-ramdisk-kernel)")
	fs.StringVar(&o.site.cmdline, "site-ramdisk-cmdline", "", "site mode: the ramdisk's kernel command line")
	fs.StringVar(&o.site.driversDir, "site-drivers-dir", "", "site mode: directory of external BMC driver binaries (pkg/driver), each registered under its file name beside the built-in ipmi and redfish; empty: built-ins only")
	fs.StringVar(&o.inst.dir, "instances-dir", "", "run instances (QEMU guests): their disks, seeds, volumes and snapshots live here; empty: this node runs none")
	fs.StringVar(&o.inst.images, "guest-images", "", "with --instances-dir: the guest image directory (DIR/NAME as make guest-image writes it); required")
	fs.StringVar(&o.inst.bridge, "instance-bridge", "bcbr0", "with --instances-dir: the bridge guests' taps join (created when missing)")
	fs.StringVar(&o.inst.bridgeAddress, "instance-bridge-address", "", "with --instances-dir: address/prefix given to a bridge bcd creates (the guests' gateway)")
	fs.StringVar(&o.inst.netns, "instance-netns", "", "with --instances-dir: named network namespace holding the bridge and taps (default the host's)")
	fs.StringVar(&o.inst.accel, "instance-accel", "", "with --instances-dir: kvm or tcg; empty probes KVM by booting and falls back to TCG")
	o.kube.register(fs)
	fs.StringVar(&o.site.controlPlaneURL, "site-control-plane-url", "", "site mode: ignored (deploying machines' images now come over the gateway connection); kept so old configurations still start")
}

// fileConfig is the config file; keys are the flag names with underscores.
type fileConfig struct {
	Server        string `toml:"server" yaml:"server"`
	StateDir      string `toml:"state_dir" yaml:"state_dir"`
	Hardware      string `toml:"hardware" yaml:"hardware"`
	FakeSeed      string `toml:"fake_seed" yaml:"fake_seed"`
	SysfsRoot     string `toml:"sysfs_root" yaml:"sysfs_root"`
	CgroupRoot    string `toml:"cgroup_root" yaml:"cgroup_root"`
	ExecIDs       string `toml:"exec_ids" yaml:"exec_ids"`
	MetricsListen string `toml:"metrics_listen" yaml:"metrics_listen"`
	Mode          string `toml:"mode" yaml:"mode"`
	LogLevel      string `toml:"log_level" yaml:"log_level"`
	TokenEnvFile  string `toml:"token_env_file" yaml:"token_env_file"`
	// Attestation (docs/attestation.md).
	Attest                 string `toml:"attest" yaml:"attest"`
	AttestTPM              string `toml:"attest_tpm" yaml:"attest_tpm"`
	AttestX509Cert         string `toml:"attest_x509_cert" yaml:"attest_x509_cert"`
	AttestX509Key          string `toml:"attest_x509_key" yaml:"attest_x509_key"`
	AttestCloudMetadataURL string `toml:"attest_cloud_metadata_url" yaml:"attest_cloud_metadata_url"`
	OTLPEndpoint           string `toml:"otlp_endpoint" yaml:"otlp_endpoint"`
	// ReleasePubkeys are --release-pubkey's files.
	ReleasePubkeys []string `toml:"release_pubkeys" yaml:"release_pubkeys"`

	SiteInterface     string `toml:"site_interface" yaml:"site_interface"`
	SiteDHCP          string `toml:"site_dhcp" yaml:"site_dhcp"`
	SiteServerIP      string `toml:"site_server_ip" yaml:"site_server_ip"`
	SiteSubnet        string `toml:"site_subnet" yaml:"site_subnet"`
	SiteRange         string `toml:"site_range" yaml:"site_range"`
	SiteRouter        string `toml:"site_router" yaml:"site_router"`
	SiteBootDir       string `toml:"site_boot_dir" yaml:"site_boot_dir"`
	SiteFilesDir      string `toml:"site_files_dir" yaml:"site_files_dir"`
	SiteCacheDir      string `toml:"site_cache_dir" yaml:"site_cache_dir"`
	SiteHTTPListen    string `toml:"site_http_listen" yaml:"site_http_listen"`
	SiteRamdiskKernel string `toml:"site_ramdisk_kernel" yaml:"site_ramdisk_kernel"`
	SiteRamdiskInitrd string `toml:"site_ramdisk_initrd" yaml:"site_ramdisk_initrd"`
	SiteControlPlane  string `toml:"site_control_plane_url" yaml:"site_control_plane_url"`
	SiteRamdiskCmd    string `toml:"site_ramdisk_cmdline" yaml:"site_ramdisk_cmdline"`
	SiteDriversDir    string `toml:"site_drivers_dir" yaml:"site_drivers_dir"`

	InstancesDir          string `toml:"instances_dir" yaml:"instances_dir"`
	GuestImages           string `toml:"guest_images" yaml:"guest_images"`
	InstanceBridge        string `toml:"instance_bridge" yaml:"instance_bridge"`
	InstanceBridgeAddress string `toml:"instance_bridge_address" yaml:"instance_bridge_address"`
	InstanceNetNS         string `toml:"instance_netns" yaml:"instance_netns"`
	InstanceAccel         string `toml:"instance_accel" yaml:"instance_accel"`

	kubeFileConfig `yaml:",inline"`
}

var errConfigMode = errors.New("config file must not be readable or writable by group or others (chmod 600)")

func loadConfigFile(path string) (*fileConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s has mode %#o: %w", path, st.Mode().Perm(), errConfigMode)
	}
	var fc fileConfig
	switch strings.ToLower(filepath.Ext(path)) {
	case ".toml":
		dec := toml.NewDecoder(f)
		dec.DisallowUnknownFields()
		err = dec.Decode(&fc)
	case ".yaml", ".yml":
		dec := yaml.NewDecoder(f)
		dec.KnownFields(true)
		err = dec.Decode(&fc)
	default:
		return nil, fmt.Errorf("config file %s: want .toml, .yaml or .yml", path)
	}
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return &fc, nil
}

// merge takes values from the file for every flag not set on the command line.
func (o *options) merge(fc *fileConfig, set map[string]bool) {
	pick := func(flagName string, dst *string, v string) {
		if v != "" && !set[flagName] {
			*dst = v
		}
	}
	pick("server", &o.server, fc.Server)
	pick("state-dir", &o.stateDir, fc.StateDir)
	pick("hardware", &o.hardware, fc.Hardware)
	pick("fake-seed", &o.fakeSeed, fc.FakeSeed)
	pick("sysfs-root", &o.sysfsRoot, fc.SysfsRoot)
	pick("cgroup-root", &o.cgroupRoot, fc.CgroupRoot)
	pick("exec-ids", &o.execIDs, fc.ExecIDs)
	pick("metrics-listen", &o.metricsListen, fc.MetricsListen)
	pick("mode", &o.mode, fc.Mode)
	pick("log-level", &o.logLevel, fc.LogLevel)
	pick("token-env-file", &o.tokenEnvFile, fc.TokenEnvFile)
	pick("attest", &o.attest.Attestor, fc.Attest)
	pick("attest-tpm", &o.attest.TPM, fc.AttestTPM)
	pick("attest-x509-cert", &o.attest.X509Cert, fc.AttestX509Cert)
	pick("attest-x509-key", &o.attest.X509Key, fc.AttestX509Key)
	pick("attest-cloud-metadata-url", &o.attest.MetadataURL, fc.AttestCloudMetadataURL)
	pick("otlp-endpoint", &o.otlpEndpoint, fc.OTLPEndpoint)
	if len(fc.ReleasePubkeys) > 0 && !set["release-pubkey"] {
		o.releaseKeys = append(stringList(nil), fc.ReleasePubkeys...)
	}
	pick("site-interface", &o.site.iface, fc.SiteInterface)
	pick("site-dhcp", &o.site.dhcpMode, fc.SiteDHCP)
	pick("site-server-ip", &o.site.serverIP, fc.SiteServerIP)
	pick("site-subnet", &o.site.subnet, fc.SiteSubnet)
	pick("site-range", &o.site.rangeSpec, fc.SiteRange)
	pick("site-router", &o.site.router, fc.SiteRouter)
	pick("site-boot-dir", &o.site.bootDir, fc.SiteBootDir)
	pick("site-files-dir", &o.site.filesDir, fc.SiteFilesDir)
	pick("site-cache-dir", &o.site.cacheDir, fc.SiteCacheDir)
	pick("site-http-listen", &o.site.httpListen, fc.SiteHTTPListen)
	pick("site-ramdisk-kernel", &o.site.kernel, fc.SiteRamdiskKernel)
	pick("site-ramdisk-initrd", &o.site.initrd, fc.SiteRamdiskInitrd)
	pick("site-ramdisk-cmdline", &o.site.cmdline, fc.SiteRamdiskCmd)
	pick("site-drivers-dir", &o.site.driversDir, fc.SiteDriversDir)
	pick("instances-dir", &o.inst.dir, fc.InstancesDir)
	pick("guest-images", &o.inst.images, fc.GuestImages)
	pick("instance-bridge", &o.inst.bridge, fc.InstanceBridge)
	pick("instance-bridge-address", &o.inst.bridgeAddress, fc.InstanceBridgeAddress)
	pick("instance-netns", &o.inst.netns, fc.InstanceNetNS)
	pick("instance-accel", &o.inst.accel, fc.InstanceAccel)
	pick("site-control-plane-url", &o.site.controlPlaneURL, fc.SiteControlPlane)
	o.kube.merge(fc.kubeFileConfig, set)
}

func (o *options) validate() error {
	if o.server == "" {
		return errors.New("--server HOST:PORT is required")
	}
	if _, err := agent.ParseServers(o.server); err != nil {
		return fmt.Errorf("--server: %w", err)
	}
	if o.stateDir == "" {
		return errors.New("--state-dir is required")
	}
	if err := o.attest.Validate(); err != nil {
		return fmt.Errorf("--attest: %w", err)
	}
	if err := o.kubeNode.validate(); err != nil {
		return err
	}
	if o.helloTimeout <= 0 {
		return fmt.Errorf("--hello-timeout %v: must be positive", o.helloTimeout)
	}
	if err := o.kube.validate(o.mode); err != nil {
		return err
	}
	if o.inst.dir != "" {
		if !filepath.IsAbs(o.inst.dir) {
			return fmt.Errorf("--instances-dir %q: must be an absolute path", o.inst.dir)
		}
		if o.inst.images == "" || !filepath.IsAbs(o.inst.images) {
			return fmt.Errorf("--guest-images %q: an absolute path is required with --instances-dir", o.inst.images)
		}
		if o.mode != "node" {
			return fmt.Errorf("--instances-dir: only --mode node runs instances, not %s", o.mode)
		}
		if o.inst.accel != "" && o.inst.accel != "kvm" && o.inst.accel != "tcg" {
			return fmt.Errorf("--instance-accel %q: must be kvm, tcg or empty (probe)", o.inst.accel)
		}
	}
	if o.keepalive < agent.MinKeepaliveTime {
		return fmt.Errorf("--keepalive %v: must be at least %v (the gateway closes connections that ping more often)", o.keepalive, agent.MinKeepaliveTime)
	}
	return nil
}

// parseExecIDs reads --exec-ids, FIRST:COUNT.
func parseExecIDs(v string) (first, count uint32, err error) {
	a, b, ok := strings.Cut(v, ":")
	if !ok {
		return 0, 0, fmt.Errorf("%q is not FIRST:COUNT", v)
	}
	f, err := strconv.ParseUint(a, 10, 32)
	if err != nil || f == 0 {
		return 0, 0, fmt.Errorf("FIRST %q is not a uid above 0", a)
	}
	c, err := strconv.ParseUint(b, 10, 32)
	if err != nil || c == 0 {
		return 0, 0, fmt.Errorf("COUNT %q is not a positive number", b)
	}
	if f+c > 1<<32-1 {
		return 0, 0, fmt.Errorf("%d ids from %d run past the largest uid", c, f)
	}
	return uint32(f), uint32(c), nil
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	if v == "" {
		return errors.New("empty")
	}
	*l = append(*l, v)
	return nil
}

// loadReleaseKeys reads --release-pubkey's files, one release public key
// each.
func loadReleaseKeys(files []string) ([]release.PublicKey, error) {
	var keys []release.PublicKey
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("--release-pubkey: %w", err)
		}
		k, err := release.ParsePublicKeyPEM(text)
		if err != nil {
			return nil, fmt.Errorf("--release-pubkey %s: %w", f, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}
