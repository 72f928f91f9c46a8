package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"go.yaml.in/yaml/v3"
)

// Config is the CLI's config file: named contexts, each a server and the
// credentials to use with it, and the one in use.
type Config struct {
	CurrentContext string    `yaml:"current-context"`
	Contexts       []Context `yaml:"contexts"`
}

// Context is one named server and credential, with optional defaults for
// --tenant and --project.
type Context struct {
	Name    string `yaml:"name"`
	Server  string `yaml:"server"`
	Token   string `yaml:"token"`
	Tenant  string `yaml:"tenant,omitempty"`
	Project string `yaml:"project,omitempty"`
}

// ConfigPath returns the config file path: $BETTER_COMPUTE_CONFIG, else
// ~/.config/better-compute/config.yaml (the user config dir on this OS).
func ConfigPath() string {
	return configPath(os.LookupEnv)
}

func configPath(lookup func(string) (string, bool)) string {
	if p, ok := lookup(envConfig); ok && p != "" {
		return p
	}
	if home, ok := lookup("HOME"); ok && home != "" {
		return filepath.Join(home, ".config", "better-compute", "config.yaml")
	}
	if dir, err := os.UserConfigDir(); err == nil {
		return filepath.Join(dir, "better-compute", "config.yaml")
	}
	return filepath.Join(".better-compute", "config.yaml")
}

// LoadConfig reads the config at path. A missing file is an empty config, so
// a first run needs no setup.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Config{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var c Config
	if err := yaml.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("parse config %s: %w", path, err)
	}
	return &c, nil
}

// Save writes the config to path atomically with mode 0600 (it holds
// tokens), creating its directory with mode 0700. A crash mid-write leaves
// the old file intact rather than a truncated one.
func (c *Config) Save(path string) error {
	b, err := marshalYAML(c)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create config dir: %w", err)
	}
	// CreateTemp opens with 0600, so the tokens are never world-readable,
	// not even for the moment before the rename.
	f, err := os.CreateTemp(dir, ".config-*.yaml")
	if err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write config: %w", err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("write config: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write config: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	return nil
}

// Upsert replaces the context with ctx's name, or appends it, and makes it
// current when makeCurrent is set.
func (c *Config) Upsert(ctx Context, makeCurrent bool) {
	replaced := false
	for i := range c.Contexts {
		if c.Contexts[i].Name == ctx.Name {
			c.Contexts[i] = ctx
			replaced = true
			break
		}
	}
	if !replaced {
		c.Contexts = append(c.Contexts, ctx)
	}
	if makeCurrent {
		c.CurrentContext = ctx.Name
	}
}

// Lookup returns the context named name.
func (c *Config) Lookup(name string) (Context, bool) {
	for _, ctx := range c.Contexts {
		if ctx.Name == name {
			return ctx, true
		}
	}
	return Context{}, false
}
