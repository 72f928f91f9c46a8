package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/internal/envelope"
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
		_, err = p.w.Write(escapeUnsafe(buf.Bytes(), false))
		return err
	case "yaml":
		b, err := toYAML(m)
		if err != nil {
			return err
		}
		_, err = p.w.Write(b)
		return err
	default:
		var buf bytes.Buffer
		tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
		table(tw)
		if err := tw.Flush(); err != nil {
			return err
		}
		_, err := p.w.Write(escapeUnsafe(buf.Bytes(), true))
		return err
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
		_, err = p.w.Write(escapeUnsafe(buf.Bytes(), false))
		return err
	case "yaml":
		b, err := toYAML(m)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.w, "---\n%s", b)
		return err
	default:
		var buf bytes.Buffer
		table(&buf)
		_, err := p.w.Write(escapeUnsafe(buf.Bytes(), true))
		return err
	}
}

// toYAML converts through protojson so field names and value encodings
// (timestamps, enums, int64 as strings) match the JSON output exactly.
func toYAML(m proto.Message) ([]byte, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode yaml: %w", err)
	}
	// Decoding into a yaml.Node keeps the key order protojson chose. The
	// JSON is escaped first: YAML refuses raw DEL and folds a raw U+0085
	// into a space, while its double-quoted strings read \uXXXX exactly.
	var n yaml.Node
	if err := yaml.Unmarshal(escapeUnsafe(b, false), &n); err != nil {
		return nil, fmt.Errorf("encode yaml: %w", err)
	}
	blockStyle(&n)
	b, err = marshalYAML(&n)
	if err != nil {
		return nil, err
	}
	return escapeUnsafe(b, false), nil
}

// blockStyle drops the flow style ({...}, "...") that the JSON input gave
// every node, so the YAML reads as YAML; the encoder still quotes strings
// that would otherwise change type. A string holding a character a terminal
// would act on is double-quoted instead: there the encoder escapes control
// characters, and escapeUnsafe's \uXXXX for the bidi characters the
// encoder leaves alone is a valid escape, so the value reads back exactly.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	if n.Kind == yaml.ScalarNode && hasUnsafe(n.Value) {
		n.Style = yaml.DoubleQuotedStyle
	}
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// hasUnsafe reports whether s holds a character escapeUnsafe would escape.
// Tab and newline alone leave a multi-line value (a policy) a literal block.
func hasUnsafe(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || envelope.UnsafeRune(r, true) != "" {
			return true
		}
	}
	return false
}

// escapeUnsafe is the CLI's second layer against text that would drive an
// operator's terminal: the API refuses such text and sanitizes what nodes
// report, but a row written before those rules, or a server of another
// version, must still not clear the screen, recolour a word or reverse a
// line. Every character envelope.UnsafeRune names (C0/C1 controls, DEL,
// bidi overrides and isolates, line separators) and every invalid UTF-8
// byte is written as an escape: in a table \x1b below U+0080 and for
// invalid bytes, \u202e above; in JSON and YAML always \uXXXX, which
// JSON and double-quoted YAML read back as the character. Tab and newline
// stay: tables and the JSON and YAML structure use them themselves, and
// strings inside JSON are already escaped.
func escapeUnsafe(b []byte, table bool) []byte {
	clean := true
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if (r == utf8.RuneError && size == 1) || envelope.UnsafeRune(r, true) != "" {
			clean = false
			break
		}
		i += size
	}
	if clean {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			out = fmt.Appendf(out, `\x%02x`, b[i])
		case envelope.UnsafeRune(r, true) == "":
			out = append(out, b[i:i+size]...)
		case r < 0x80 && table:
			out = fmt.Appendf(out, `\x%02x`, r)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += size
	}
	return out
}

var cellEscaper = strings.NewReplacer("\t", `\t`, "\n", `\n`)

// row writes one tab-separated table row. A tab or line break inside a
// cell is escaped too, so one value cannot shift the columns or forge a
// row.
func row(w io.Writer, cols ...string) {
	cells := make([]string, len(cols))
	for i, c := range cols {
		cells[i] = cellEscaper.Replace(c)
	}
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// timeFormat is the one way the CLI writes a point in time, in tables and
// messages alike: RFC 3339 in UTC, to the second, so columns line up and
// what one command prints another (--from, --start) accepts.
const timeFormat = time.RFC3339

// stamp formats t in timeFormat.
func stamp(t time.Time) string { return t.UTC().Format(timeFormat) }

// ts formats a timestamp for tables; "-" when unset.
func ts(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return stamp(t.AsTime())
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
