package provision

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// Cond is a parsed condition: a step's when (does it run?) or one of its
// acceptance checks (is its output good?). The language is deliberately
// small, so a profile can never run code: dotted paths into the values the
// engine hands it (input, machine, output), literals (strings, numbers,
// true, false, null), len(path), comparisons (== != < <= > >=), ! && ||
// and parentheses. A path that names nothing is null.
type Cond struct {
	src  string
	root *node
}

// Condition roots.
const (
	RootInput   = "input"   // the workflow's input
	RootMachine = "machine" // the target's facts (Config.Facts)
	RootOutput  = "output"  // the step's output; acceptance checks only
)

// maxCondLen bounds a condition's source.
const maxCondLen = 512

type nodeKind int

const (
	nLit nodeKind = iota
	nPath
	nLen
	nNot
	nAnd
	nOr
	nCmp
)

type node struct {
	kind  nodeKind
	lit   any
	path  []string
	op    string
	left  *node
	right *node
}

// String is the condition's source.
func (c Cond) String() string { return c.src }

// ParseCond parses a condition whose paths may start at roots.
func ParseCond(src string, roots ...string) (Cond, error) {
	if len(src) > maxCondLen {
		return Cond{}, fmt.Errorf("must be at most %d bytes, got %d", maxCondLen, len(src))
	}
	toks, err := lex(src)
	if err != nil {
		return Cond{}, err
	}
	p := &parser{toks: toks, roots: roots}
	if len(toks) == 0 {
		return Cond{}, fmt.Errorf("is empty")
	}
	n, err := p.or()
	if err != nil {
		return Cond{}, err
	}
	if p.i < len(p.toks) {
		return Cond{}, fmt.Errorf("unexpected %q at offset %d", p.toks[p.i].text, p.toks[p.i].pos)
	}
	return Cond{src: src, root: n}, nil
}

// Eval evaluates the condition against env (root name to value); the
// result must be a boolean, anything else is false.
func (c Cond) Eval(env map[string]any) bool {
	if c.root == nil {
		return true
	}
	b, _ := eval(c.root, env).(bool)
	return b
}

type token struct {
	text string
	kind byte // 'i' ident, 's' string, 'n' number, 'o' operator/punct
	pos  int
}

func lex(src string) ([]token, error) {
	var out []token
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '"':
			j := i + 1
			for j < len(src) && src[j] != '"' {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(src) {
				return nil, fmt.Errorf("unterminated string at offset %d", i)
			}
			s, err := strconv.Unquote(src[i : j+1])
			if err != nil {
				return nil, fmt.Errorf("bad string at offset %d: %w", i, err)
			}
			out = append(out, token{s, 's', i})
			i = j + 1
		case c >= '0' && c <= '9' || c == '-' && i+1 < len(src) && src[i+1] >= '0' && src[i+1] <= '9':
			j := i + 1
			for j < len(src) && (src[j] >= '0' && src[j] <= '9' || src[j] == '.') {
				j++
			}
			out = append(out, token{src[i:j], 'n', i})
			i = j
		case c == '_' || unicode.IsLetter(rune(c)):
			j := i
			for j < len(src) && (src[j] == '_' || src[j] == '.' || src[j] >= '0' && src[j] <= '9' || unicode.IsLetter(rune(src[j]))) {
				j++
			}
			out = append(out, token{src[i:j], 'i', i})
			i = j
		default:
			two := ""
			if i+1 < len(src) {
				two = src[i : i+2]
			}
			switch two {
			case "==", "!=", "<=", ">=", "&&", "||":
				out = append(out, token{two, 'o', i})
				i += 2
				continue
			}
			switch c {
			case '<', '>', '!', '(', ')':
				out = append(out, token{string(c), 'o', i})
				i++
				continue
			}
			return nil, fmt.Errorf("unexpected %q at offset %d", string(c), i)
		}
	}
	return out, nil
}

type parser struct {
	toks  []token
	i     int
	roots []string
}

func (p *parser) peek(text string) bool {
	return p.i < len(p.toks) && p.toks[p.i].kind == 'o' && p.toks[p.i].text == text
}

func (p *parser) or() (*node, error) {
	l, err := p.and()
	for err == nil && p.peek("||") {
		p.i++
		var r *node
		if r, err = p.and(); err == nil {
			l = &node{kind: nOr, left: l, right: r}
		}
	}
	return l, err
}

func (p *parser) and() (*node, error) {
	l, err := p.not()
	for err == nil && p.peek("&&") {
		p.i++
		var r *node
		if r, err = p.not(); err == nil {
			l = &node{kind: nAnd, left: l, right: r}
		}
	}
	return l, err
}

func (p *parser) not() (*node, error) {
	if p.peek("!") {
		p.i++
		n, err := p.not()
		return &node{kind: nNot, left: n}, err
	}
	return p.cmp()
}

func (p *parser) cmp() (*node, error) {
	l, err := p.operand()
	if err != nil {
		return nil, err
	}
	for _, op := range []string{"==", "!=", "<=", ">=", "<", ">"} {
		if p.peek(op) {
			p.i++
			r, err := p.operand()
			if err != nil {
				return nil, err
			}
			return &node{kind: nCmp, op: op, left: l, right: r}, nil
		}
	}
	return l, nil
}

func (p *parser) operand() (*node, error) {
	if p.i >= len(p.toks) {
		return nil, fmt.Errorf("ends early: a value is missing")
	}
	t := p.toks[p.i]
	p.i++
	switch t.kind {
	case 's':
		return &node{kind: nLit, lit: t.text}, nil
	case 'n':
		f, err := strconv.ParseFloat(t.text, 64)
		if err != nil || math.IsInf(f, 0) {
			return nil, fmt.Errorf("bad number %q at offset %d", t.text, t.pos)
		}
		return &node{kind: nLit, lit: f}, nil
	case 'i':
		switch t.text {
		case "true":
			return &node{kind: nLit, lit: true}, nil
		case "false":
			return &node{kind: nLit, lit: false}, nil
		case "null":
			return &node{kind: nLit, lit: nil}, nil
		case "len":
			if !p.peek("(") {
				return nil, fmt.Errorf("len at offset %d must be called: len(path)", t.pos)
			}
			p.i++
			if p.i >= len(p.toks) || p.toks[p.i].kind != 'i' {
				return nil, fmt.Errorf("len at offset %d takes a path", t.pos)
			}
			path, err := p.path(p.toks[p.i])
			if err != nil {
				return nil, err
			}
			p.i++
			if !p.peek(")") {
				return nil, fmt.Errorf("len at offset %d: missing )", t.pos)
			}
			p.i++
			return &node{kind: nLen, path: path}, nil
		}
		path, err := p.path(t)
		if err != nil {
			return nil, err
		}
		return &node{kind: nPath, path: path}, nil
	case 'o':
		if t.text == "(" {
			n, err := p.or()
			if err != nil {
				return nil, err
			}
			if !p.peek(")") {
				return nil, fmt.Errorf("missing ) for ( at offset %d", t.pos)
			}
			p.i++
			return n, nil
		}
	}
	return nil, fmt.Errorf("unexpected %q at offset %d", t.text, t.pos)
}

func (p *parser) path(t token) ([]string, error) {
	parts := strings.Split(t.text, ".")
	for _, s := range parts {
		if s == "" {
			return nil, fmt.Errorf("bad path %q at offset %d", t.text, t.pos)
		}
	}
	for _, r := range p.roots {
		if parts[0] == r {
			return parts, nil
		}
	}
	return nil, fmt.Errorf("path %q at offset %d must start with one of %s", t.text, t.pos, strings.Join(p.roots, ", "))
}

func eval(n *node, env map[string]any) any {
	switch n.kind {
	case nLit:
		return n.lit
	case nPath:
		return lookupPath(env, n.path)
	case nLen:
		switch v := lookupPath(env, n.path).(type) {
		case []any:
			return float64(len(v))
		case map[string]any:
			return float64(len(v))
		case string:
			return float64(len(v))
		}
		return float64(0)
	case nNot:
		b, ok := eval(n.left, env).(bool)
		return ok && !b
	case nAnd:
		l, _ := eval(n.left, env).(bool)
		if !l {
			return false
		}
		r, _ := eval(n.right, env).(bool)
		return r
	case nOr:
		if l, _ := eval(n.left, env).(bool); l {
			return true
		}
		r, _ := eval(n.right, env).(bool)
		return r
	case nCmp:
		return compare(n.op, eval(n.left, env), eval(n.right, env))
	}
	return nil
}

func lookupPath(env map[string]any, path []string) any {
	var cur any = env
	for _, k := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return normalize(cur)
}

// normalize makes Go values look as they do after a JSON round trip (a
// workflow's input is decoded from JSON once persisted).
func normalize(v any) any {
	switch x := v.(type) {
	case int:
		return float64(x)
	case int32:
		return float64(x)
	case int64:
		return float64(x)
	case uint:
		return float64(x)
	case uint64:
		return float64(x)
	case float32:
		return float64(x)
	case json.Number:
		f, _ := x.Float64()
		return f
	case []string:
		out := make([]any, len(x))
		for i, s := range x {
			out[i] = s
		}
		return out
	}
	return v
}

// compare compares two values: equality on any, order on two numbers or
// two strings; anything else is false (a missing value is never greater
// than a number).
func compare(op string, l, r any) bool {
	switch op {
	case "==":
		return equal(l, r)
	case "!=":
		return !equal(l, r)
	}
	if lf, ok := l.(float64); ok {
		if rf, ok := r.(float64); ok {
			return order(op, cmpFloat(lf, rf))
		}
		return false
	}
	if ls, ok := l.(string); ok {
		if rs, ok := r.(string); ok {
			return order(op, strings.Compare(ls, rs))
		}
	}
	return false
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func order(op string, c int) bool {
	switch op {
	case "<":
		return c < 0
	case "<=":
		return c <= 0
	case ">":
		return c > 0
	case ">=":
		return c >= 0
	}
	return false
}

func equal(l, r any) bool {
	switch l.(type) {
	case nil:
		return r == nil
	case float64, string, bool:
		return l == r
	}
	a, err1 := json.Marshal(l)
	b, err2 := json.Marshal(r)
	return err1 == nil && err2 == nil && string(a) == string(b)
}
