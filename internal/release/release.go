// Package release is the offline half of signed bcd releases: the release
// manifest (which binaries, per platform, with their digests and their
// SBOMs' digests), its canonical bytes, the release key that signs it, the
// signed envelope, and the checks a verifier runs on the envelope and on a
// binary it was handed.
//
// The release key is a key of its own, never the command-signing root: its
// PEM blocks carry their own labels, its key id says what it is for, and
// the bytes it signs start with a context no other signature in the system
// uses. This package reads files it is pointed at and nothing else: it must
// never reach a database, the network, or decide where a release goes.
package release

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/semver"
)

// Schema names the manifest format; a new format gets a new schema, so a
// manifest is never read under rules it was not signed under.
const Schema = "better-compute.release-manifest/v1"

// Platforms are the platforms a release may carry a binary for.
var Platforms = []string{"linux-amd64", "linux-arm64"}

// Kinds of refusal. Every error of this package is an *Error that wraps one
// of these and names the field it is about.
var (
	ErrMalformed      = errors.New("malformed")
	ErrInvalid        = errors.New("invalid")
	ErrWrongPurpose   = errors.New("not a release key")
	ErrUnknownKey     = errors.New("signed by a key that is not trusted")
	ErrBadSignature   = errors.New("signature does not verify")
	ErrDigestMismatch = errors.New("digest mismatch")
)

// Error is a refusal that names its field, as a JSON path into the manifest
// or the envelope ("binaries[linux-amd64].sha256", "key_id").
type Error struct {
	Field  string
	Kind   error
	Reason string
}

func (e *Error) Error() string { return e.Field + ": " + e.Kind.Error() + ": " + e.Reason }

func (e *Error) Unwrap() error { return e.Kind }

func refuse(field string, kind error, format string, args ...any) *Error {
	return &Error{Field: field, Kind: kind, Reason: fmt.Sprintf(format, args...)}
}

// Manifest is what a release says about itself.
type Manifest struct {
	Schema string `json:"schema"`
	// Version is the release's semantic version, "v1.4.0" or "v1.4.0-rc.1".
	Version string `json:"version"`
	// MinControlPlaneVersion is the oldest control plane these binaries
	// work with.
	MinControlPlaneVersion string    `json:"min_control_plane_version"`
	CreatedAt              time.Time `json:"created_at"`
	// Binaries are sorted by platform, one per platform.
	Binaries []Binary `json:"binaries"`
}

// Binary is one platform's bcd.
type Binary struct {
	Platform string `json:"platform"`
	// Name is the binary's file name; its SBOM is Name + ".sbom.json".
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	SBOM   File   `json:"sbom"`
}

// File is a file the manifest pins by digest.
type File struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// SBOMName is the file name of a binary's SBOM.
func SBOMName(binary string) string { return binary + ".sbom.json" }

// Binary returns the manifest's binary for platform.
func (m Manifest) Binary(platform string) (Binary, bool) {
	for _, b := range m.Binaries {
		if b.Platform == platform {
			return b, true
		}
	}
	return Binary{}, false
}

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$`)
	digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ValidVersion reports whether v is a full semantic version with its "v":
// v1.4.0 or v1.4.0-rc.1, not v1.4 nor 1.4.0 nor v1.4.0+build.
func ValidVersion(v string) bool { return semver.IsValid(v) && semver.Canonical(v) == v }

// Validate checks every field of m; the first refusal names its field.
func (m Manifest) Validate() error {
	if m.Schema != Schema {
		return refuse("schema", ErrInvalid, "is %q: this verifier reads %q", m.Schema, Schema)
	}
	if !ValidVersion(m.Version) {
		return refuse("version", ErrInvalid, "%q is not a semantic version such as v1.4.0", m.Version)
	}
	if !ValidVersion(m.MinControlPlaneVersion) {
		return refuse("min_control_plane_version", ErrInvalid, "%q is not a semantic version such as v1.4.0", m.MinControlPlaneVersion)
	}
	if m.CreatedAt.IsZero() {
		return refuse("created_at", ErrInvalid, "is missing")
	}
	if len(m.Binaries) == 0 {
		return refuse("binaries", ErrInvalid, "a release carries at least one binary")
	}
	seen := map[string]bool{}
	names := map[string]string{}
	for i, b := range m.Binaries {
		if !slices.Contains(Platforms, b.Platform) {
			return refuse(fmt.Sprintf("binaries[%d].platform", i), ErrInvalid, "%q is not one of %s", b.Platform, strings.Join(Platforms, ", "))
		}
		if seen[b.Platform] {
			return refuse(fmt.Sprintf("binaries[%s].platform", b.Platform), ErrInvalid, "appears twice: one binary per platform")
		}
		seen[b.Platform] = true
		at := "binaries[" + b.Platform + "]"
		if !nameRE.MatchString(b.Name) {
			return refuse(at+".name", ErrInvalid, "%q is not a file name (letters, digits, '.', '_', '+', '-'; no '/')", b.Name)
		}
		if other, ok := names[b.Name]; ok {
			return refuse(at+".name", ErrInvalid, "%q is also %s's: name each platform's binary apart (bcd-%s)", b.Name, other, b.Platform)
		}
		names[b.Name] = b.Platform
		if err := validFile(at, b.SHA256, b.Size); err != nil {
			return err
		}
		if b.SBOM.Name != SBOMName(b.Name) {
			return refuse(at+".sbom.name", ErrInvalid, "is %q: want %q", b.SBOM.Name, SBOMName(b.Name))
		}
		if err := validFile(at+".sbom", b.SBOM.SHA256, b.SBOM.Size); err != nil {
			return err
		}
	}
	return nil
}

func validFile(at, sum string, size int64) error {
	if !digestRE.MatchString(sum) {
		return refuse(at+".sha256", ErrInvalid, "%q is not a lower-case hex sha256", sum)
	}
	if size <= 0 {
		return refuse(at+".size", ErrInvalid, "is %d: want the file's size in bytes", size)
	}
	return nil
}

// Canonical is the one encoding of m that is signed: compact JSON, fields
// in the order of the struct, binaries sorted by platform, created_at in
// UTC to the second. Two manifests that mean the same have the same bytes.
func Canonical(m Manifest) ([]byte, error) {
	m.CreatedAt = m.CreatedAt.UTC().Truncate(time.Second)
	m.Binaries = slices.Clone(m.Binaries)
	slices.SortFunc(m.Binaries, func(a, b Binary) int { return strings.Compare(a.Platform, b.Platform) })
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// decodeStrict decodes one JSON value into v, refusing unknown fields and
// anything after the value. whole names the value in a refusal about all
// of it; prefix goes before the name of a field inside it.
func decodeStrict(data []byte, v any, whole, prefix string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			path := strings.Trim(name, `"`)
			if p := unknownField(data, reflect.TypeOf(v).Elem(), ""); p != "" {
				path = p // with the array indexes the decoder's error leaves out
			}
			if path == "" || strings.HasSuffix(path, ".") {
				return refuse(cmp.Or(strings.TrimSuffix(prefix+path, "."), whole), ErrMalformed, "has a field with an empty name")
			}
			return refuse(prefix+path, ErrMalformed, "is not a field of this format")
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return refuse(prefix+te.Field, ErrMalformed, "is a JSON %s: want %s", te.Value, te.Type)
		}
		var be base64.CorruptInputError
		if errors.As(err, &be) {
			// The envelope's one []byte field.
			return refuse(prefix+"signature", ErrMalformed, "is not base64: %v", err)
		}
		var pe *time.ParseError
		if errors.As(err, &pe) {
			return refuse(prefix+"created_at", ErrMalformed, "is not an RFC 3339 time: %v", err)
		}
		return refuse(whole, ErrMalformed, "is not JSON of this format: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return refuse(whole, ErrMalformed, "has data after its JSON value")
	}
	return nil
}

// unknownField returns the path of the first field of data that t (a
// struct, or a slice of structs) does not have, or "".
func unknownField(data []byte, t reflect.Type, at string) string {
	switch t.Kind() {
	case reflect.Slice:
		var items []json.RawMessage
		if json.Unmarshal(data, &items) != nil {
			return ""
		}
		for i, item := range items {
			if p := unknownField(item, t.Elem(), fmt.Sprintf("%s[%d]", at, i)); p != "" {
				return p
			}
		}
	case reflect.Struct:
		var obj map[string]json.RawMessage
		if json.Unmarshal(data, &obj) != nil {
			return ""
		}
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			fields[name] = t.Field(i).Type
		}
		keys := slices.Sorted(maps.Keys(obj))
		for _, k := range keys {
			ft, ok := fields[k]
			path := strings.TrimPrefix(at+"."+k, ".")
			if !ok {
				return path
			}
			if p := unknownField(obj[k], ft, path); p != "" {
				return p
			}
		}
	}
	return ""
}
