package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
)

// hostileOutput is text a terminal would act on: clear the screen, paint a
// word green, reverse a line, and the C1, DEL and line-separator cousins.
var hostileOutput = []string{"\x00", "\x1b[2J", "\x1b[32mSUCCEEDED", "\u202e", "\u2067", "\u0085", "\x7f", "\r", "\u2028", "\u009b31m"}

// requireInert fails when out still holds a character a terminal acts on.
func requireInert(t *testing.T, out []byte, keep string) {
	t.Helper()
	require.True(t, utf8.Valid(out), "output %q is not valid UTF-8", out)
	for i, r := range string(out) {
		if strings.ContainsRune(keep, r) {
			continue
		}
		require.Empty(t, envelope.UnsafeRune(r, false), "output %q has U+%04X at byte %d", out, r, i)
	}
}

func TestPrinterEscapesTerminalControls(t *testing.T) {
	t.Parallel()
	for _, h := range hostileOutput {
		value := "web" + h + "tail"
		msg := &apiv1.Project{Id: "prj_1", Name: "web", DisplayName: value}
		table := func(w io.Writer) {
			row(w, "ID", "NAME", "DISPLAY NAME")
			row(w, msg.GetId(), msg.GetName(), msg.GetDisplayName())
			// A command that writes a line by hand is covered too.
			fmt.Fprintf(w, "display: %s\n", msg.GetDisplayName())
		}
		t.Run(fmt.Sprintf("%q", h), func(t *testing.T) {
			t.Parallel()
			for _, format := range []string{"table", "json", "yaml"} {
				for _, line := range []bool{false, true} {
					var buf bytes.Buffer
					p := printer{format: format, w: &buf}
					if line {
						require.NoError(t, p.line(msg, table))
					} else {
						require.NoError(t, p.print(msg, table))
					}
					out := buf.Bytes()
					requireInert(t, out, "\t\n")
					switch format {
					case "json":
						// Escaped, yet the same value when read back.
						var got map[string]any
						require.NoError(t, json.Unmarshal(out, &got), "%s", out)
						require.Equal(t, value, got["displayName"])
					case "yaml":
						var got map[string]any
						require.NoError(t, yaml.Unmarshal(bytes.TrimPrefix(out, []byte("---\n")), &got), "%s", out)
						require.Equal(t, value, got["displayName"], "%s", out)
					case "table":
						require.Contains(t, string(out), "tail", "the value is shown, escaped")
					}
				}
			}
		})
	}
}

func TestEscapeUnsafeSpelling(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, table, data string }{
		{"a\x1b[2Jb", `a\x1b[2Jb`, `a\u001b[2Jb`},
		{"x\u202ey", `x\u202ey`, `x\u202ey`},
		{"x\u0085y", `x\u0085y`, `x\u0085y`},
		{"x\x7fy", `x\x7fy`, `x\u007fy`},
		{"bad\xffbyte", `bad\xffbyte`, `bad\xffbyte`},
		{"keeps\ttabs\nand lines, ünïcode and RTL \u05e9\u05dc\u05d5\u05dd \u200f", "keeps\ttabs\nand lines, ünïcode and RTL \u05e9\u05dc\u05d5\u05dd \u200f", "keeps\ttabs\nand lines, ünïcode and RTL \u05e9\u05dc\u05d5\u05dd \u200f"},
	}
	for _, tc := range tests {
		require.Equal(t, tc.table, string(escapeUnsafe([]byte(tc.in), true)), "%q", tc.in)
		require.Equal(t, tc.data, string(escapeUnsafe([]byte(tc.in), false)), "%q", tc.in)
	}
}

func TestRowEscapesCellLayout(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	row(&buf, "a\tb", "c\nFORGED\trow")
	require.Equal(t, "a\\tb\tc\\nFORGED\\trow\n", buf.String())
}
