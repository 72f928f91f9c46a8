// Package doctest reads the tables of the Markdown docs so tests can hold
// them to the code: a service, an action, a flag or an error code the code
// has and a doc lacks fails a test instead of drifting.
//
// It is for tests only and must never be imported by a program.
package doctest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Read returns docs/<name>, found by walking up from the test's directory
// to the module root.
func Read(t testing.TB, name string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("doctest: no go.mod above the test directory")
		}
		dir = parent
	}
}

// Table returns the body rows of the Markdown table whose header line is
// header (compared without surrounding spaces), each row split into trimmed
// cells. It fails the test when the table is missing.
func Table(t testing.TB, doc, header string) [][]string {
	t.Helper()
	lines := strings.Split(doc, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != header {
			continue
		}
		var rows [][]string
		for _, l := range lines[i+1:] {
			l = strings.TrimSpace(l)
			if !strings.HasPrefix(l, "|") {
				break
			}
			if strings.HasPrefix(l, "|---") || strings.HasPrefix(l, "| ---") {
				continue
			}
			cells := strings.Split(strings.Trim(l, "|"), "|")
			for j := range cells {
				cells[j] = strings.TrimSpace(cells[j])
			}
			rows = append(rows, cells)
		}
		return rows
	}
	t.Fatalf("doctest: no table with header %q", header)
	return nil
}

var backticked = regexp.MustCompile("`([^`]+)`")

// Code returns the `code spans` of a cell, in order.
func Code(cell string) []string {
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// Flags returns every `--flag` named in the doc's code spans and code blocks.
func Flags(doc string) map[string]bool {
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`--([a-z][a-z0-9-]*)`).FindAllStringSubmatch(doc, -1) {
		out[m[1]] = true
	}
	return out
}

// Section returns the part of doc from the heading line that starts with
// heading up to the next heading of the same or a higher level.
func Section(t testing.TB, doc, heading string) string {
	t.Helper()
	level := len(heading) - len(strings.TrimLeft(heading, "#"))
	lines := strings.Split(doc, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, heading) {
			continue
		}
		end := len(lines)
		fenced := false // a "# comment" in a code block is no heading
		for j := i + 1; j < len(lines); j++ {
			if strings.HasPrefix(lines[j], "```") {
				fenced = !fenced
			}
			if n := len(lines[j]) - len(strings.TrimLeft(lines[j], "#")); !fenced && n > 0 && n <= level && strings.HasPrefix(lines[j][n:], " ") {
				end = j
				break
			}
		}
		return strings.Join(lines[i:end], "\n")
	}
	t.Fatalf("doctest: no heading %q", heading)
	return ""
}
