package envelope

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// MultiLineFields are the request fields, by full proto name, whose text may
// span lines: they may hold tab and line feed. Every other string field is
// one line. Carriage return is refused everywhere, because in a terminal it
// moves the cursor back over what was printed.
var MultiLineFields = map[protoreflect.FullName]bool{
	"bettercompute.api.v1.PutPolicyRequest.text": true,
	// A PEM block is lines of base64.
	"bettercompute.api.v1.AddSignerKeyRequest.public_key": true,
	// A trust anchor's certificates are PEM too.
	"bettercompute.api.v1.CreateTrustAnchorRequest.certificates_pem": true,
	// cloud-init user data is a YAML document or a script.
	"bettercompute.api.v1.CreateInstanceRequest.user_data": true,
	// A profile is a YAML or JSON document.
	"bettercompute.api.v1.CreateProfileRequest.document":   true,
	"bettercompute.api.v1.UpdateProfileRequest.document":   true,
	"bettercompute.api.v1.ValidateProfileRequest.document": true,
	// A release manifest is the signed JSON envelope, indented.
	"bettercompute.api.v1.CreateReleaseHeader.manifest": true,
}

// UnsafeRune reports why r must not appear in text that reaches an
// operator's terminal or the database, or "" when it may: C0 controls
// (NUL, ESC…), DEL, C1 controls (U+0080–U+009F, some terminals act on
// them), the line and paragraph separators, and the bidirectional
// embeddings, overrides and isolates that reorder what is displayed
// ("Trojan Source", CVE-2021-42574). Tab and line feed are allowed only
// when multiLine. The marks LRM, RLM and ALM stay allowed: they are strong
// characters that right-to-left names legitimately use and cannot reorder
// a run of text the way an override can. The noncharacters U+FFFE and
// U+FFFF are no text either (U+FFFF marks bytes that did not decode).
func UnsafeRune(r rune, multiLine bool) string {
	switch {
	case (r == '\t' || r == '\n') && multiLine:
		return ""
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return "a control character"
	case r == 0x2028, r == 0x2029:
		return "a line or paragraph separator"
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return "a bidirectional formatting character"
	case r == 0xfffe, r == Undecodable:
		return "a noncharacter"
	}
	return ""
}

// TextProblem returns why s is refused as free text, or "" when it is
// fine: invalid UTF-8 or an UnsafeRune, with the byte offset of the first
// offender. The reason never quotes the offending bytes.
func TextProblem(s string, multiLine bool) string {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size <= 1) || r == Undecodable {
			// Undecodable is where a codec found invalid UTF-8 or a lone
			// surrogate; a client sending U+FFFF itself reads the same.
			return fmt.Sprintf("is not valid UTF-8 at byte %d (invalid bytes, a lone surrogate or U+FFFF)", i)
		}
		if what := UnsafeRune(r, multiLine); what != "" {
			return fmt.Sprintf("contains %s (U+%04X) at byte %d", what, r, i)
		}
		i += size
	}
	return ""
}

// CheckText walks every string field of a request, however deep (nested
// messages, lists, map keys and values, google.protobuf.Struct), and
// refuses the request with a violation per offending field. The interceptor
// runs it on every request and every streamed message, so a new text field
// is covered without a line of handler code. Fields are named as the
// request spells them: display_name, selector[0].values[1],
// labels["zone"], params["reason"].
func CheckText(m proto.Message) error {
	if textClean(m.ProtoReflect()) {
		// The common case walks once and builds no field paths.
		return nil
	}
	var vs Violations
	checkTextMessage(&vs, "", m.ProtoReflect())
	// Map order is random; the same request gets the same answer.
	slices.SortStableFunc(vs, func(a, b Violation) int { return strings.Compare(a.Field, b.Field) })
	return vs.Err()
}

func checkTextMessage(vs *Violations, prefix string, m protoreflect.Message) {
	structural := isStructWKT(m.Descriptor().FullName())
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		path := prefix
		if !structural {
			path = joinField(prefix, string(fd.Name()))
		}
		multi := MultiLineFields[fd.FullName()]
		switch {
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				key := k.Interface()
				if ks, ok := key.(string); ok {
					if p := TextProblem(ks, false); p != "" {
						vs.Add(path, "has a key that %s", p)
						return true
					}
					key = strconv.Quote(ks)
				}
				checkTextValue(vs, fmt.Sprintf("%s[%v]", path, key), fd.MapValue(), mv, multi)
				return true
			})
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				checkTextValue(vs, fmt.Sprintf("%s[%d]", path, i), fd, l.Get(i), multi)
			}
		default:
			checkTextValue(vs, path, fd, v, multi)
		}
		return true
	})
}

func checkTextValue(vs *Violations, path string, fd protoreflect.FieldDescriptor, v protoreflect.Value, multi bool) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if p := TextProblem(v.String(), multi); p != "" {
			vs.Add(path, "%s", p)
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		checkTextMessage(vs, path, v.Message())
	}
}

// isStructWKT reports the google.protobuf.Struct family, whose own field
// names (fields, string_value, values) would only clutter a path:
// params["reason"] reads better than params.fields["reason"].string_value.
func isStructWKT(n protoreflect.FullName) bool {
	return n == "google.protobuf.Struct" || n == "google.protobuf.Value" || n == "google.protobuf.ListValue"
}

func joinField(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// textClean reports whether every string in m passes TextProblem.
func textClean(m protoreflect.Message) bool {
	clean := true
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		multi := MultiLineFields[fd.FullName()]
		switch {
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if ks, ok := k.Interface().(string); ok && TextProblem(ks, false) != "" {
					clean = false
				} else {
					clean = valueClean(fd.MapValue(), mv, multi)
				}
				return clean
			})
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len() && clean; i++ {
				clean = valueClean(fd, l.Get(i), multi)
			}
		default:
			clean = valueClean(fd, v, multi)
		}
		return clean
	})
	return clean
}

func valueClean(fd protoreflect.FieldDescriptor, v protoreflect.Value, multi bool) bool {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return TextProblem(v.String(), multi) == ""
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return textClean(v.Message())
	}
	return true
}
