package release

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Input is one platform's binary to put in a release.
type Input struct {
	Platform string
	Path     string
}

// Artifact is a file a release writes beside its manifest.
type Artifact struct {
	Name string
	Data []byte
}

// Assemble reads each input binary, checks that it was built for its
// platform, makes its SBOM, and returns the manifest (unsigned) with the
// SBOMs to write beside it. Nothing is written.
func Assemble(version, minControlPlane string, created time.Time, inputs []Input) (Manifest, []Artifact, error) {
	m := Manifest{Schema: Schema, Version: version, MinControlPlaneVersion: minControlPlane, CreatedAt: created.UTC().Truncate(time.Second)}
	if len(inputs) == 0 {
		return Manifest{}, nil, refuse("binary", ErrInvalid, "required: pass --binary PLATFORM=PATH for each platform (%s)", strings.Join(Platforms, ", "))
	}
	var sboms []Artifact
	for _, in := range inputs {
		at := "binary[" + in.Platform + "]"
		if !slices.Contains(Platforms, in.Platform) {
			return Manifest{}, nil, refuse(at, ErrInvalid, "%q is not one of %s", in.Platform, strings.Join(Platforms, ", "))
		}
		f, err := os.Open(in.Path)
		if err != nil {
			return Manifest{}, nil, refuse(at, ErrInvalid, "%v", err)
		}
		sum, size, err := Digest(f)
		_ = f.Close()
		if err != nil {
			return Manifest{}, nil, refuse(at, ErrInvalid, "%v", err)
		}
		name := filepath.Base(in.Path)
		bom, info, err := SBOM(in.Path, SBOMInput{Name: name, Version: version, SHA256: sum, Created: m.CreatedAt})
		if err != nil {
			return Manifest{}, nil, refuse(at, ErrInvalid, "%s %v", in.Path, err)
		}
		var goos, goarch string
		for _, s := range info.Settings {
			switch s.Key {
			case "GOOS":
				goos = s.Value
			case "GOARCH":
				goarch = s.Value
			}
		}
		if built := goos + "-" + goarch; built != in.Platform {
			return Manifest{}, nil, refuse(at, ErrInvalid, "%s was built for %s (GOOS=%s GOARCH=%s)", in.Path, built, goos, goarch)
		}
		bomSum, bomSize, err := Digest(bytes.NewReader(bom))
		if err != nil {
			return Manifest{}, nil, err
		}
		m.Binaries = append(m.Binaries, Binary{Platform: in.Platform, Name: name, SHA256: sum, Size: size,
			SBOM: File{Name: SBOMName(name), SHA256: bomSum, Size: bomSize}})
		sboms = append(sboms, Artifact{Name: SBOMName(name), Data: bom})
	}
	if err := m.Validate(); err != nil {
		return Manifest{}, nil, err
	}
	return m, sboms, nil
}
