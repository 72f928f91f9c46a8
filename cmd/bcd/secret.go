package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/better-compute/better-compute/internal/agent"
)

// runSecret is `bcd secret get [flags] secret://NAME`: it fetches a secret
// of the node's tenant through the gateway (internal/agent's
// FetchSecretWithState, beside the running bcd, as its identity) and writes
// the value to stdout exactly as stored, with no newline added.
func runSecret(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "get" {
		return errors.New("usage: bcd secret get [--config FILE] [--server HOST:PORT] [--state-dir DIR] secret://NAME")
	}
	var o options
	fs := flag.NewFlagSet("bcd secret get", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.configFile, "config", "", "bcd's config file, for its server and state_dir")
	fs.StringVar(&o.server, "server", "", "gateway HOST:PORT, or several comma-separated (default: the config file's)")
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/bcd", "bcd's state directory (the node's key and certificate)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("bcd secret get takes one secret://NAME")
	}
	if o.configFile != "" {
		fc, err := loadConfigFile(o.configFile)
		if err != nil {
			return err
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		o.merge(fc, set)
	}
	v, err := agent.FetchSecretWithState(ctx, agent.StateFetchConfig{Server: o.server, StateDir: cmp.Or(o.stateDir, "/var/lib/bcd")}, fs.Arg(0))
	if err != nil {
		return err
	}
	defer clear(v)
	if _, err := stdout.Write(v); err != nil {
		return fmt.Errorf("write the value: %w", err)
	}
	return nil
}
