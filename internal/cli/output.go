package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// printer writes every command's answer in the chosen format, so that json
// and yaml are always the API's own message (protojson, the Connect wire
// form) and scripts can rely on them, while table is for people.
type printer struct {
	format string
	w      io.Writer
}

func (a *app) printer(w io.Writer) printer {
	return printer{format: a.flagOutput, w: w}
}

// print writes m as JSON or YAML, or calls table with a tabwriter for the
// table format.
func (p printer) print(m proto.Message, table func(w io.Writer)) error {
	switch p.format {
	case "json":
		b, err := protojson.Marshal(m)
		if err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		// protojson deliberately varies its whitespace; re-indenting makes
		// the output stable for people and for diffs.
		var buf bytes.Buffer
		if err := json.Indent(&buf, b, "", "  "); err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		buf.WriteByte('\n')
		_, err = p.w.Write(buf.Bytes())
		return err
	case "yaml":
		b, err := toYAML(m)
		if err != nil {
			return err
		}
		_, err = p.w.Write(b)
		return err
	default:
		tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
		table(tw)
		return tw.Flush()
	}
}

// line writes m on one line: compact JSON for json, a YAML document for
// yaml, or table's line. Streams use it so each event is printed as it
// arrives instead of after the stream ends.
func (p printer) line(m proto.Message, table func(w io.Writer)) error {
	switch p.format {
	case "json":
		b, err := protojson.Marshal(m)
		if err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, b); err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		buf.WriteByte('\n')
		_, err = p.w.Write(buf.Bytes())
		return err
	case "yaml":
		b, err := toYAML(m)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.w, "---\n%s", b)
		return err
	default:
		table(p.w)
		return nil
	}
}

// toYAML converts through protojson so field names and value encodings
// (timestamps, enums, int64 as strings) match the JSON output exactly.
func toYAML(m proto.Message) ([]byte, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode yaml: %w", err)
	}
	// Decoding into a yaml.Node keeps the key order protojson chose.
	var n yaml.Node
	if err := yaml.Unmarshal(b, &n); err != nil {
		return nil, fmt.Errorf("encode yaml: %w", err)
	}
	blockStyle(&n)
	return marshalYAML(&n)
}

// blockStyle drops the flow style ({...}, "...") that the JSON input gave
// every node, so the YAML reads as YAML; the encoder still quotes strings
// that would otherwise change type.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// row writes one tab-separated table row.
func row(w io.Writer, cols ...string) {
	fmt.Fprintln(w, strings.Join(cols, "\t"))
}

// ts formats a timestamp for tables; "-" when unset.
func ts(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

// dash shows an empty column as "-" so columns stay aligned and readable.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// marshalYAML encodes with a two-space indent, the common YAML house style
// (the library's default is four).
func marshalYAML(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode yaml: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode yaml: %w", err)
	}
	return buf.Bytes(), nil
}
