package bmc

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"sort"
	"sync"

	"github.com/better-compute/better-compute/pkg/driver"
)

// DriverInfo is a driver a site has: what `drivers list` shows.
type DriverInfo struct {
	// Name is the registry name New takes: a built-in's, or an external
	// driver's file name in the drivers directory.
	Name string
	// Reports is the name the driver gives itself (its errors carry it):
	// an out-of-process IPMI driver reports "ipmi" under its own Name.
	Reports string
	Version string
	// BuiltIn is true for the drivers compiled into the agent; an
	// external driver runs as a child process from Path.
	BuiltIn      bool
	Path         string
	Capabilities []string
}

// builtinVersion is the version of the module the agent was built from:
// the built-in drivers ship with it.
func builtinVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

func builtinInfo(name string) (DriverInfo, bool) {
	caps := map[string][]string{
		"ipmi":    {string(driver.CapSetPassword), string(driver.CapBootOverride)},
		"redfish": {string(driver.CapBootOverride), string(driver.CapVirtualMedia)},
	}
	c, ok := caps[name]
	if !ok {
		return DriverInfo{}, false
	}
	return DriverInfo{Name: name, Reports: name, Version: builtinVersion(), BuiltIn: true, Capabilities: c}, true
}

// driverNameRE is the shape of a driver's registry name: what a machine's
// bmc_driver holds and the agent reports to the control plane, so a file
// name with a path separator, a colon (PluginPrefix), a space or other
// text the API would have to escape cannot become one.
var driverNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,62}$`)

// ValidDriverName refuses a name that cannot be a driver's registry name.
func ValidDriverName(name string) error {
	if !driverNameRE.MatchString(name) {
		return fmt.Errorf("%q is not a usable driver name (1-63 letters, digits and ._+-, starting with a letter or digit)", name)
	}
	return nil
}

// Registry lists a site's BMC drivers, the built-ins and the external
// ones registered from their binaries, and builds a Driver by name. The
// zero value is not usable; use NewRegistry.
type Registry struct {
	log *slog.Logger

	mu       sync.Mutex
	external map[string]DriverInfo // by name
}

// NewRegistry holds the built-in drivers. log receives what external
// drivers print while the registry asks them their Info (default:
// discard).
func NewRegistry(log *slog.Logger) *Registry {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registry{log: log, external: map[string]DriverInfo{}}
}

// Register starts the driver binary at path, asks its Info, ends it and
// registers it under name. The site names its drivers, not the drivers
// themselves, so two builds of one driver can sit side by side; a name a
// built-in or another driver holds is refused.
func (r *Registry) Register(ctx context.Context, name, path string) (DriverInfo, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return DriverInfo{}, fmt.Errorf("driver %s: %w", path, err)
	}
	switch {
	case ValidDriverName(name) != nil:
		return DriverInfo{}, fmt.Errorf("driver %s: %w", abs, ValidDriverName(name))
	case slices.Contains(Drivers(), name):
		return DriverInfo{}, fmt.Errorf("driver %s: %q is a built-in driver's name", abs, name)
	}
	c, err := driver.Launch(ctx, abs, driver.Options{Logger: r.log})
	if err != nil {
		return DriverInfo{}, err
	}
	info := c.Info()
	_ = c.Close()
	di := DriverInfo{Name: name, Reports: info.Name, Version: info.Version, Path: abs}
	for _, c := range info.Capabilities {
		di.Capabilities = append(di.Capabilities, string(c))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.external[name]; ok && prev.Path != abs {
		return DriverInfo{}, fmt.Errorf("driver %s: the name %q is taken by %s", abs, name, prev.Path)
	}
	r.external[di.Name] = di
	return di, nil
}

// RegisterDir registers every executable regular file in dir (or symlink
// to one; not its subdirectories) under its file name, as a site's drivers directory
// holds them. It stops at the first driver that fails: a site's driver
// set is all or nothing.
func (r *Registry) RegisterDir(ctx context.Context, dir string) ([]DriverInfo, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("drivers directory: %w", err)
	}
	var out []DriverInfo
	for _, e := range entries {
		// Stat, not the entry's Lstat: a symlinked driver is a driver,
		// checked by what it points to.
		info, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			return out, fmt.Errorf("drivers directory: %w", err)
		}
		if !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
			continue
		}
		if info.Mode().Perm()&0o022 != 0 {
			// A driver others can rewrite runs their code with the
			// agent's rights and sees BMC passwords.
			return out, fmt.Errorf("driver %s: writable by group or others (%v): refused", filepath.Join(dir, e.Name()),
				info.Mode().Perm()&fs.ModePerm)
		}
		di, err := r.Register(ctx, e.Name(), filepath.Join(dir, e.Name()))
		if err != nil {
			return out, err
		}
		out = append(out, di)
	}
	return out, nil
}

// List is every driver of the site: the built-ins, then the external ones
// by name.
func (r *Registry) List() []DriverInfo {
	var out []DriverInfo
	for _, name := range Drivers() {
		info, _ := builtinInfo(name)
		out = append(out, info)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var ext []DriverInfo
	for _, di := range r.external {
		ext = append(ext, di)
	}
	sort.Slice(ext, func(i, j int) bool { return ext[i].Name < ext[j].Name })
	return append(out, ext...)
}

// Names is the driver names New accepts, built-ins first.
func (r *Registry) Names() []string {
	var names []string
	for _, di := range r.List() {
		names = append(names, di.Name)
	}
	return names
}

// New builds the driver called name: a built-in, a registered external
// driver (a child process that lives until the Driver is closed), or
// "plugin:<path>".
func (r *Registry) New(name, address string, creds Credentials, opts Options) (Driver, error) {
	r.mu.Lock()
	di, ok := r.external[name]
	r.mu.Unlock()
	if !ok {
		return New(name, address, creds, opts)
	}
	return newPlugin(name, di.Path, address, creds, opts.withDefaults())
}
