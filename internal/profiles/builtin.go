package profiles

import (
	"embed"
	"fmt"
	"path"
	"slices"
	"sync"

	"github.com/better-compute/better-compute/internal/provision"
)

// builtinFS holds the built-in profiles, shipped in the binary: the
// workflows of the machine lifecycle, leases and health remediations.
//
//go:embed builtin/*.yaml
var builtinFS embed.FS

// builtins parses the embedded documents once; a bad one is a build
// defect, which TestBuiltinsParse catches before a release.
var builtins = sync.OnceValues(func() ([]Document, error) {
	ents, err := builtinFS.ReadDir("builtin")
	if err != nil {
		return nil, err
	}
	var out []Document
	for _, e := range ents {
		b, err := builtinFS.ReadFile(path.Join("builtin", e.Name()))
		if err != nil {
			return nil, err
		}
		// The kinds are checked by the engine that runs them
		// (provision.New): each module registers its own runners.
		d, err := Parse(b, FormatYAML, Catalog{})
		if err != nil {
			return nil, fmt.Errorf("built-in profile %s: %w", e.Name(), err)
		}
		if d.Name+".yaml" != e.Name() {
			return nil, fmt.Errorf("built-in profile %s is named %q", e.Name(), d.Name)
		}
		out = append(out, d)
	}
	return out, nil
})

// Builtins returns the built-in profile documents, by name.
func Builtins() ([]Document, error) { return builtins() }

// Builtin returns a built-in document by name.
func Builtin(name string) (Document, bool) {
	ds, err := builtins()
	if err != nil {
		return Document{}, false
	}
	i := slices.IndexFunc(ds, func(d Document) bool { return d.Name == name })
	if i < 0 {
		return Document{}, false
	}
	return ds[i], true
}

// MustProfiles returns the expansions of the named built-in profiles, in
// that order; it panics on a name that is not built in or a document that
// does not parse, both caught by the tests of the module that asks.
func MustProfiles(names ...string) []provision.Profile {
	ds, err := builtins()
	if err != nil {
		panic(err)
	}
	out := make([]provision.Profile, 0, len(names))
	for _, n := range names {
		i := slices.IndexFunc(ds, func(d Document) bool { return d.Name == n })
		if i < 0 {
			panic(fmt.Sprintf("profiles: no built-in profile %q", n))
		}
		out = append(out, ds[i].Profile)
	}
	return out
}
