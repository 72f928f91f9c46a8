package fleetconfig

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite docs/schema from the parser's types")

const schemaDir = "../../docs/schema"

// TestSchemasMatchTheParser keeps docs/schema equal to what JSONSchema
// builds from the parser's types (go test -run TestSchemas -update
// rewrites them), and checks each schema's properties against the keys the
// parser accepts, level by level.
func TestSchemasMatchTheParser(t *testing.T) {
	t.Parallel()
	for _, kind := range Kinds {
		want, err := JSONSchema(kind)
		require.NoError(t, err)
		path := filepath.Join(schemaDir, SchemaFile(kind))
		if *update {
			require.NoError(t, os.WriteFile(path, want, 0o644)) //nolint:gosec // documentation, world-readable
		}
		got, err := os.ReadFile(path)
		require.NoError(t, err, "run go test ./internal/fleetconfig -run TestSchemas -update")
		require.Equal(t, string(want), string(got), "%s is stale: run go test ./internal/fleetconfig -run TestSchemas -update", path)

		var s map[string]any
		require.NoError(t, json.Unmarshal(got, &s))
		props := s["properties"].(map[string]any)
		require.ElementsMatch(t, []string{"apiVersion", "kind", "metadata", "spec"}, keys(props))
		sameFields(t, kind+".metadata", props["metadata"].(map[string]any), reflect.TypeOf(Metadata{}))
		sameFields(t, kind+".spec", props["spec"].(map[string]any), SpecType(kind))
	}
}

// sameFields requires schema's properties to be exactly the keys t
// accepts, with additionalProperties false, recursing into objects.
func sameFields(t *testing.T, path string, schema map[string]any, typ reflect.Type) {
	t.Helper()
	for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
		typ = typ.Elem()
	}
	switch typ.Kind() {
	case reflect.Struct:
		require.Equal(t, false, schema["additionalProperties"], path)
		props, _ := schema["properties"].(map[string]any)
		fields := YAMLFields(typ)
		require.ElementsMatch(t, keys(props), mapKeys(fields), path)
		for name, ft := range fields {
			sameFields(t, path+"."+name, props[name].(map[string]any), ft)
		}
	case reflect.Map:
		sameFields(t, path+".*", schema["additionalProperties"].(map[string]any), typ.Elem())
	}
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func mapKeys(m map[string]reflect.Type) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestExamplesValidate: every document of examples/fleet validates
// against its kind's schema and parses; a document with a field the
// parser refuses fails the schema too.
func TestExamplesValidate(t *testing.T) {
	t.Parallel()
	schemas := map[string]*jsonschema.Resolved{}
	for _, kind := range Kinds {
		b, err := os.ReadFile(filepath.Join(schemaDir, SchemaFile(kind)))
		require.NoError(t, err)
		var s jsonschema.Schema
		require.NoError(t, json.Unmarshal(b, &s))
		rs, err := s.Resolve(nil)
		require.NoError(t, err)
		schemas[kind] = rs
	}
	validate := func(doc map[string]any) error {
		b, err := json.Marshal(doc)
		require.NoError(t, err)
		var inst any
		require.NoError(t, json.Unmarshal(b, &inst))
		return schemas[doc["kind"].(string)].Validate(inst)
	}

	files, err := filepath.Glob("../../examples/fleet*/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	seen := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		_, errs := Parse(f, b)
		require.Empty(t, errs)
		for _, raw := range yamlDocs(t, b) {
			require.NoError(t, validate(raw), "%s: %v", f, raw["metadata"])
			seen[raw["kind"].(string)] = true
		}
	}
	for _, kind := range Kinds {
		require.True(t, seen[kind], "the examples show a %s document", kind)
	}

	bad := yamlDocs(t, []byte(`apiVersion: bettercompute.io/v1
kind: Pool
metadata: {name: p, tenant: sim}
spec: {policy: {gpuSharingg: mig}}
`))[0]
	require.Error(t, validate(bad))
	_, errs := Parse("bad.yaml", []byte(`apiVersion: bettercompute.io/v1
kind: Pool
metadata: {name: p, tenant: sim}
spec: {policy: {gpuSharingg: mig}}
`))
	require.Len(t, errs, 1)
	require.Equal(t, "spec.policy.gpuSharingg", errs[0].Field)
}

// yamlDocs decodes every document of b as JSON-shaped values (string map
// keys, as JSON Schema sees them).
func yamlDocs(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	var out []map[string]any
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			break
		}
		var v any
		require.NoError(t, n.Decode(&v))
		out = append(out, jsonShape(v).(map[string]any))
	}
	return out
}

func jsonShape(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = jsonShape(e)
		}
		return x
	case map[any]any:
		m := map[string]any{}
		for k, e := range x {
			b, _ := json.Marshal(k)
			m[strings.Trim(string(b), `"`)] = jsonShape(e)
		}
		return m
	case []any:
		for i, e := range x {
			x[i] = jsonShape(e)
		}
		return x
	}
	return v
}

// TestDocsNameEveryKind keeps docs/fleet-as-code.md with the code: its
// kinds table has a row per kind, and its never-pruned table a row per
// kind prune leaves alone, and no other.
func TestDocsNameEveryKind(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/fleet-as-code.md")
	require.NoError(t, err)
	doc := string(b)
	for _, kind := range Kinds {
		require.Contains(t, doc, "\n| `"+kind+"` | ", "the kinds table has a row for %s", kind)
	}
	_, pruneTable, ok := strings.Cut(doc, "| kind | why |")
	require.True(t, ok, "the never-pruned table")
	pruneTable, _, _ = strings.Cut(pruneTable, "\n\n")
	var listed []string
	for _, line := range strings.Split(pruneTable, "\n") {
		if k, ok := strings.CutPrefix(line, "| `"); ok {
			k, _, _ = strings.Cut(k, "`")
			listed = append(listed, k)
		}
	}
	var never []string
	for k := range neverPruned {
		never = append(never, k)
	}
	require.ElementsMatch(t, never, listed)
}
