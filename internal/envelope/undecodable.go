package envelope

import (
	"unicode/utf16"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Invalid UTF-8 and lone UTF-16 surrogates never decode: the protobuf and
// JSON decoders refuse the whole body before any handler runs, with an
// error that names no field. The API's codecs retry such a body once with
// every undecodable sequence inside a string replaced by the noncharacter
// U+FFFF (Undecodable); CheckText then refuses the request like any other
// bad text, as a field violation that names the field.

// Undecodable stands in for bytes of a string that were not text.
const Undecodable = '\uFFFF'

// RepairProtoText rewrites a binary protobuf message of type md with
// every invalid UTF-8 byte inside its string fields (however deep)
// replaced by Undecodable. It reports false when nothing was replaced or
// the bytes are not a well-formed message: the caller then keeps the
// decoder's own error.
func RepairProtoText(b []byte, md protoreflect.MessageDescriptor) ([]byte, bool) {
	out, changed, ok := repairProto(b, md, 0)
	return out, ok && changed
}

func repairProto(b []byte, md protoreflect.MessageDescriptor, depth int) ([]byte, bool, bool) {
	if depth > 64 {
		return nil, false, false
	}
	out := make([]byte, 0, len(b)+8)
	changed := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false, false
		}
		out = append(out, b[:n]...)
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if typ == protowire.BytesType && fd != nil && (fd.Kind() == protoreflect.StringKind || fd.Kind() == protoreflect.MessageKind) {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, false, false
			}
			b = b[m:]
			var fixed []byte
			ch, ok := false, true
			if fd.Kind() == protoreflect.StringKind {
				fixed, ch = repairUTF8(v)
			} else {
				// Map entries are messages too: key and value are fields.
				fixed, ch, ok = repairProto(v, fd.Message(), depth+1)
			}
			if !ok {
				return nil, false, false
			}
			out = protowire.AppendBytes(out, fixed)
			changed = changed || ch
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return nil, false, false
		}
		out = append(out, b[:m]...)
		b = b[m:]
	}
	return out, changed, true
}

func repairUTF8(v []byte) ([]byte, bool) {
	if utf8.Valid(v) {
		return v, false
	}
	out := make([]byte, 0, len(v)+8)
	for len(v) > 0 {
		r, size := utf8.DecodeRune(v)
		if r == utf8.RuneError && size == 1 {
			out = utf8.AppendRune(out, Undecodable)
		} else {
			out = append(out, v[:size]...)
		}
		v = v[size:]
	}
	return out, true
}

// RepairJSONText rewrites a JSON document with every invalid UTF-8 byte
// and every unpaired surrogate escape (\ud800) inside a string replaced by
// the escape of Undecodable. It reports false when nothing was replaced.
func RepairJSONText(b []byte) ([]byte, bool) {
	out := make([]byte, 0, len(b)+8)
	changed, inString := false, false
	const mark = `\uffff`
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case !inString:
			inString = c == '"'
			out = append(out, c)
			i++
		case c == '"':
			inString = false
			out = append(out, c)
			i++
		case c == '\\' && i+6 <= len(b) && b[i+1] == 'u':
			r, ok := hex4(b[i+2 : i+6])
			switch {
			case !ok || !utf16.IsSurrogate(r):
				out = append(out, b[i:i+6]...)
				i += 6
			case r < 0xdc00 && i+12 <= len(b) && b[i+6] == '\\' && b[i+7] == 'u' && lowSurrogate(b[i+8:i+12]):
				out = append(out, b[i:i+12]...)
				i += 12
			default:
				out = append(out, mark...)
				changed = true
				i += 6
			}
		case c == '\\':
			end := min(i+2, len(b))
			out = append(out, b[i:end]...)
			i = end
		default:
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				out = append(out, mark...)
				changed = true
			} else {
				out = append(out, b[i:i+size]...)
			}
			i += size
		}
	}
	return out, changed
}

func lowSurrogate(h []byte) bool {
	r, ok := hex4(h)
	return ok && r >= 0xdc00 && r <= 0xdfff
}

func hex4(h []byte) (rune, bool) {
	var r rune
	for _, c := range h {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
