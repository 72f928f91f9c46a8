package release

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"strings"
	"time"
)

// CycloneDX 1.5 (https://cyclonedx.org/docs/1.5/json/), the parts an SBOM
// of a Go binary uses.
type (
	cdxBOM struct {
		BOMFormat    string          `json:"bomFormat"`
		SpecVersion  string          `json:"specVersion"`
		SerialNumber string          `json:"serialNumber"`
		Version      int             `json:"version"`
		Metadata     cdxMetadata     `json:"metadata"`
		Components   []cdxComponent  `json:"components"`
		Dependencies []cdxDependency `json:"dependencies"`
	}
	cdxMetadata struct {
		Timestamp string       `json:"timestamp"`
		Tools     cdxTools     `json:"tools"`
		Component cdxComponent `json:"component"`
	}
	cdxTools struct {
		Components []cdxComponent `json:"components"`
	}
	cdxComponent struct {
		Type       string        `json:"type"`
		BOMRef     string        `json:"bom-ref,omitempty"`
		Name       string        `json:"name"`
		Version    string        `json:"version,omitempty"`
		PURL       string        `json:"purl,omitempty"`
		Hashes     []cdxHash     `json:"hashes,omitempty"`
		Properties []cdxProperty `json:"properties,omitempty"`
	}
	cdxHash struct {
		Alg     string `json:"alg"`
		Content string `json:"content"`
	}
	cdxProperty struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	cdxDependency struct {
		Ref       string   `json:"ref"`
		DependsOn []string `json:"dependsOn"`
	}
)

// SBOMInput is what an SBOM says about a binary besides its build info.
type SBOMInput struct {
	Name    string // the binary's file name
	Version string // the release version
	SHA256  string // of the binary
	Created time.Time
}

// SBOM builds the CycloneDX 1.5 JSON SBOM of the Go binary at path from
// the build information the Go toolchain wrote into it: the toolchain, the
// main module, every module dependency (with its go.sum h1 hash as a
// property) and the build settings. A file without Go build information
// is refused.
func SBOM(path string, in SBOMInput) ([]byte, *debug.BuildInfo, error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("is not a Go binary with build information: %w", err)
	}
	b, err := SBOMFromBuildInfo(info, in)
	return b, info, err
}

// SBOMFromBuildInfo is SBOM for build information already read.
func SBOMFromBuildInfo(info *debug.BuildInfo, in SBOMInput) ([]byte, error) {
	serial, err := uuid4()
	if err != nil {
		return nil, err
	}
	// The main module at the release's version, with the program's package
	// inside it as the purl's subpath.
	module := cmp.Or(info.Main.Path, info.Path)
	mainRef := "pkg:golang/" + purlPath(module) + "@" + purlEscape(in.Version)
	if sub, ok := strings.CutPrefix(info.Path, module+"/"); ok {
		mainRef += "#" + purlPath(sub)
	}
	main := cdxComponent{
		Type:    "application",
		BOMRef:  mainRef,
		Name:    in.Name,
		Version: in.Version,
		PURL:    mainRef,
		Hashes:  []cdxHash{{Alg: "SHA-256", Content: in.SHA256}},
		Properties: []cdxProperty{
			{Name: "go:toolchain", Value: info.GoVersion},
			{Name: "go:package", Value: info.Path},
			{Name: "go:main-module", Value: info.Main.Path},
			{Name: "go:main-module:version", Value: info.Main.Version},
		},
	}
	if info.Main.Sum != "" {
		main.Properties = append(main.Properties, cdxProperty{Name: "go:main-module:h1", Value: info.Main.Sum})
	}
	for _, s := range info.Settings {
		main.Properties = append(main.Properties, cdxProperty{Name: "go:build:" + s.Key, Value: s.Value})
	}
	bom := cdxBOM{
		BOMFormat:    "CycloneDX",
		SpecVersion:  "1.5",
		SerialNumber: "urn:uuid:" + serial,
		Version:      1,
		Metadata: cdxMetadata{
			Timestamp: in.Created.UTC().Format(time.RFC3339),
			Tools: cdxTools{Components: []cdxComponent{{
				Type: "application", Name: "better-compute release sign",
				Properties: []cdxProperty{{Name: "go:toolchain", Value: info.GoVersion}},
			}}},
			Component: main,
		},
		Components:   []cdxComponent{},
		Dependencies: []cdxDependency{{Ref: mainRef, DependsOn: []string{}}},
	}
	for _, d := range info.Deps {
		c := moduleComponent(d)
		bom.Components = append(bom.Components, c)
		bom.Dependencies[0].DependsOn = append(bom.Dependencies[0].DependsOn, c.BOMRef)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(bom); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// moduleComponent is one module dependency. A replaced module is listed as
// the module that was built (the replacement), with what it replaced as a
// property.
func moduleComponent(d *debug.Module) cdxComponent {
	built := d
	if d.Replace != nil {
		built = d.Replace
	}
	ref := "pkg:golang/" + purlPath(built.Path)
	if built.Version != "" {
		ref += "@" + purlEscape(built.Version)
	}
	c := cdxComponent{Type: "library", BOMRef: ref, Name: built.Path, Version: built.Version, PURL: ref}
	if built.Sum != "" {
		// go.sum's h1 is a hash over the module's file list, not over a
		// file, so it is no CycloneDX hash: it goes as a property.
		c.Properties = append(c.Properties, cdxProperty{Name: "go:module:h1", Value: built.Sum})
	}
	if d.Replace != nil {
		c.Properties = append(c.Properties, cdxProperty{Name: "go:module:replaces", Value: d.Path + "@" + d.Version})
	}
	return c
}

// purlPath escapes each segment of a module path for a package URL.
func purlPath(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = purlEscape(s)
	}
	return strings.Join(segs, "/")
}

// purlEscape percent-encodes everything but the unreserved characters, as
// the package URL spec asks ("+incompatible" becomes "%2Bincompatible").
func purlEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

func uuid4() (string, error) {
	var u [16]byte
	if _, err := rand.Read(u[:]); err != nil {
		return "", err
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), nil
}
