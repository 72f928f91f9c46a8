package fleetconfig

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
)

// SchemaFile is the name of a kind's JSON Schema under docs/schema.
func SchemaFile(kind string) string { return strings.ToLower(kind) + ".schema.json" }

// JSONSchema is the JSON Schema (draft 2020-12) of a kind's documents,
// built from the types the parser decodes into, so the two cannot differ:
// docs/schema holds its output, and a test keeps them equal.
func JSONSchema(kind string) ([]byte, error) {
	meta := schemaOf(reflect.TypeOf(Metadata{}))
	spec := schemaOf(SpecType(kind))
	s := map[string]any{
		"$schema":              "https://json-schema.org/draft/2020-12/schema",
		"$id":                  "https://bettercompute.io/schema/v1/" + SchemaFile(kind),
		"title":                kind,
		"description":          "A Better Compute " + kind + " document for better-compute fleet plan|apply (docs/fleet-as-code.md).",
		"type":                 "object",
		"additionalProperties": false,
		"required":             []string{"apiVersion", "kind", "metadata", "spec"},
		"properties": map[string]any{
			"apiVersion": map[string]any{"const": APIVersion},
			"kind":       map[string]any{"const": kind},
			"metadata":   meta,
			"spec":       spec,
		},
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func schemaOf(t reflect.Type) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		props := map[string]any{}
		var required []string
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			p := schemaOf(f.Type)
			if d := f.Tag.Get("desc"); d != "" {
				p["description"] = d
			}
			if e := f.Tag.Get("enum"); e != "" {
				p["enum"] = strings.Split(e, ",")
			}
			if m := f.Tag.Get("min"); m != "" {
				n, _ := strconv.Atoi(m)
				p["minimum"] = n
			}
			if f.Tag.Get("required") == "true" {
				required = append(required, name)
			}
			props[name] = p
		}
		s := map[string]any{"type": "object", "additionalProperties": false, "properties": props}
		if len(required) > 0 {
			s["required"] = required
		}
		return s
	case reflect.Slice:
		return map[string]any{"type": "array", "items": schemaOf(t.Elem())}
	case reflect.Map:
		s := map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem())}
		if t.Key().Kind() != reflect.String {
			s["propertyNames"] = map[string]any{"pattern": "^[0-9]+$"}
		}
		return s
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	default:
		return map[string]any{"type": "integer"}
	}
}
