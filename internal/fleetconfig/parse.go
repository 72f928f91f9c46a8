package fleetconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/better-compute/better-compute/internal/capacity/pool"
)

// DocError is a document refused before any call: where, which field, why.
type DocError struct {
	File  string
	Index int
	Field string
	// Reason says why, in a few words.
	Reason string
}

func (e DocError) Error() string {
	where := e.File
	if e.Index > 0 {
		where += ":" + itoa(e.Index)
	}
	if e.Field == "" {
		return where + ": " + e.Reason
	}
	return where + ": " + e.Field + ": " + e.Reason
}

// DocErrors are every refusal of a document set.
type DocErrors []DocError

func (es DocErrors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

func itoa(i int) string { return strconv.Itoa(i) }

// Load reads the documents of each path: a file, or every .yaml and .yml
// file of a directory (not its subdirectories), in name order. Every
// document is parsed strictly and validated, and no object may be
// declared twice across them; nothing is returned unless all are valid.
func Load(paths ...string) ([]Document, error) {
	var files []string
	for _, path := range paths {
		st, err := os.Stat(path)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, path)
			continue
		}
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		n := len(files)
		for _, e := range ents {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		if len(files) == n {
			return nil, fmt.Errorf("%s: no .yaml or .yml files", path)
		}
	}
	var docs []Document
	var errs DocErrors
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		d, es := Parse(f, b)
		docs = append(docs, d...)
		errs = append(errs, es...)
	}
	errs = append(errs, checkUnique(docs)...)
	if len(errs) > 0 {
		return nil, errs
	}
	return docs, nil
}

// Parse reads the documents of one file's content.
func Parse(file string, b []byte) ([]Document, DocErrors) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var docs []Document
	var errs DocErrors
	for i := 1; ; i++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			errs = append(errs, DocError{File: file, Index: i, Reason: err.Error()})
			break
		}
		if len(n.Content) == 0 || (n.Content[0].Kind == yaml.ScalarNode && n.Content[0].Tag == "!!null") {
			continue // an empty document, e.g. after a trailing ---
		}
		d, es := parseDoc(file, i, n.Content[0])
		if len(es) > 0 {
			errs = append(errs, es...)
			continue
		}
		docs = append(docs, d)
	}
	return docs, errs
}

func parseDoc(file string, index int, n *yaml.Node) (Document, DocErrors) {
	d := Document{File: file, Index: index}
	bad := func(field, format string, args ...any) DocErrors {
		return DocErrors{{File: file, Index: index, Field: field, Reason: fmt.Sprintf(format, args...)}}
	}
	if n.Kind != yaml.MappingNode {
		return d, bad("", "a document must be a mapping with apiVersion, kind, metadata and spec")
	}
	fields := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i].Value
		switch k {
		case "apiVersion", "kind", "metadata", "spec":
			fields[k] = n.Content[i+1]
		default:
			return d, bad(k, "unknown field (line %d)", n.Content[i].Line)
		}
	}
	for _, k := range []string{"apiVersion", "kind", "metadata", "spec"} {
		if fields[k] == nil {
			return d, bad(k, "is required")
		}
	}
	if v := fields["apiVersion"].Value; v != APIVersion {
		return d, bad("apiVersion", "must be %s, got %q", APIVersion, v)
	}
	d.Kind = fields["kind"].Value
	spec := newSpec(d.Kind)
	if spec == nil {
		return d, bad("kind", "unknown kind %q: one of %s", d.Kind, strings.Join(Kinds, ", "))
	}
	if err := strictDecode(fields["metadata"], "metadata", &d.Metadata); err != nil {
		return d, DocErrors{{File: file, Index: index, Field: err.field, Reason: err.reason}}
	}
	if err := strictDecode(fields["spec"], "spec", spec); err != nil {
		return d, DocErrors{{File: file, Index: index, Field: err.field, Reason: err.reason}}
	}
	d.Spec = spec
	var errs DocErrors
	for _, v := range validate(d) {
		v.File, v.Index = file, index
		errs = append(errs, v)
	}
	return d, errs
}

type fieldErr struct{ field, reason string }

// strictDecode decodes n into out, refusing any key out's type does not
// name, with the field's path.
func strictDecode(n *yaml.Node, path string, out any) *fieldErr {
	if e := checkKnown(n, path, reflect.TypeOf(out)); e != nil {
		return e
	}
	if err := n.Decode(out); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) && len(te.Errors) > 0 {
			return &fieldErr{path, te.Errors[0]}
		}
		return &fieldErr{path, err.Error()}
	}
	return nil
}

func checkKnown(n *yaml.Node, path string, t reflect.Type) *fieldErr {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			if n.Tag == "!!null" {
				return nil
			}
			return &fieldErr{path, fmt.Sprintf("must be a mapping (line %d)", n.Line)}
		}
		known := YAMLFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			ft, ok := known[k]
			if !ok {
				return &fieldErr{path + "." + k, fmt.Sprintf("unknown field (line %d)", n.Content[i].Line)}
			}
			if e := checkKnown(n.Content[i+1], path+"."+k, ft); e != nil {
				return e
			}
		}
	case reflect.Slice:
		if n.Kind == yaml.SequenceNode {
			for i, c := range n.Content {
				if e := checkKnown(c, fmt.Sprintf("%s[%d]", path, i), t.Elem()); e != nil {
					return e
				}
			}
		}
	case reflect.Map:
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				if e := checkKnown(n.Content[i+1], path+"."+n.Content[i].Value, t.Elem()); e != nil {
					return e
				}
			}
		}
	}
	return nil
}

// YAMLFields lists the keys a struct type accepts and their types: the
// parser's vocabulary, which the schema test holds docs/schema to.
func YAMLFields(t reflect.Type) map[string]reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		out[name] = f.Type
	}
	return out
}

// SpecType is the Go type of a kind's spec (nil for an unknown kind).
func SpecType(kind string) reflect.Type {
	s := newSpec(kind)
	if s == nil {
		return nil
	}
	return reflect.TypeOf(s)
}

// validate checks what can be checked without the API: required fields
// and their shape. The API validates the rest when the plan is applied.
func validate(d Document) DocErrors {
	var errs DocErrors
	add := func(field, format string, args ...any) {
		errs = append(errs, DocError{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	if d.Metadata.Name == "" {
		add("metadata.name", "is required")
	}
	switch s := d.Spec.(type) {
	case *FlavorSpec:
		if s.VCPUs <= 0 {
			add("spec.vcpus", "is required and must be positive")
		}
		if s.MemoryMiB <= 0 {
			add("spec.memoryMiB", "is required and must be positive")
		}
	case *IPPoolSpec:
		if s.CIDR == "" {
			add("spec.cidr", "is required")
		} else if _, err := netip.ParsePrefix(s.CIDR); err != nil {
			add("spec.cidr", "is not a CIDR: %v", err)
		}
	case *PoolSpec:
		if _, err := pool.ParseSelector(s.Selector); err != nil {
			add("spec.selector", "%v", err)
		}
		if slicesContains(s.OfferTo, pool.OfferAll) && len(s.OfferTo) > 1 {
			add("spec.offerTo", `"all" stands alone`)
		}
	case *QuotaSpec:
		if s.GPUs != nil && *s.GPUs < 0 {
			add("spec.gpus", "must not be negative (leave it out for unlimited)")
		}
		if s.GPUHours != nil && *s.GPUHours < 0 {
			add("spec.gpuHours", "must not be negative (leave it out for unlimited)")
		}
	}
	validateMore(d, add)
	return errs
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// checkUnique refuses two documents for one object.
func checkUnique(docs []Document) DocErrors {
	seen := map[string]Document{}
	var errs DocErrors
	for _, d := range docs {
		for _, k := range []string{d.Kind + "/" + d.Metadata.Tenant + "/name=" + d.Metadata.Name, scopeKey(d)} {
			if k == "" {
				continue
			}
			if prev, ok := seen[k]; ok {
				errs = append(errs, DocError{File: d.File, Index: d.Index, Field: "metadata.name",
					Reason: fmt.Sprintf("the same %s as %s", d.Kind, prev.Where())})
				break
			}
			seen[k] = d
		}
	}
	return errs
}

// scopeKey is a quota's identity, its scope, and a webhook's, its url.
// Other kinds are named.
func scopeKey(d Document) string {
	switch s := d.Spec.(type) {
	case *QuotaSpec:
		return "Quota/" + d.Metadata.Tenant + "/scope=" + s.Project + "/" + strings.ToUpper(s.Model) + "/" + s.Pool
	case *WebhookSpec:
		return "Webhook/" + d.Metadata.Tenant + "/url=" + s.URL
	}
	return ""
}
