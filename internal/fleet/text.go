package fleet

import (
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/better-compute/better-compute/internal/envelope"
)

// SanitizeText returns s with every character the API would refuse in a
// one-line field (envelope.UnsafeRune: C0/C1 controls, DEL, bidirectional
// overrides and isolates, line separators) and every invalid UTF-8 byte
// replaced by U+FFFD. Text a node reports is not refused, because a node's
// report is evidence worth keeping; it is defused before it is stored, so
// a message like "\x1b[32mSUCCEEDED" cannot repaint an operator's terminal.
func SanitizeText(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || envelope.UnsafeRune(r, false) != "" {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		// Ranging over a string yields RuneError for each invalid byte.
		if envelope.UnsafeRune(r, false) != "" {
			r = utf8.RuneError
		}
		b.WriteRune(r)
	}
	return b.String()
}

// SanitizeNodeText replaces, in place, unsafe characters in every string
// field of a message a node sent (map keys included, however deep), with
// SanitizeText. Fields a gateway validates against a strict pattern come
// out unchanged.
func SanitizeNodeText(m proto.Message) {
	if m != nil {
		sanitizeMessage(m.ProtoReflect())
	}
}

func sanitizeMessage(m protoreflect.Message) {
	// Changes are applied after each walk: a message or map must not change
	// while it is ranged over.
	type fieldSet struct {
		fd protoreflect.FieldDescriptor
		v  protoreflect.Value
	}
	var sets []fieldSet
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			sanitizeMap(fd, v.Map())
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				l.Set(i, sanitizeValue(fd, l.Get(i)))
			}
		case fd.Kind() == protoreflect.StringKind:
			sets = append(sets, fieldSet{fd, sanitizeValue(fd, v)})
		default:
			sanitizeValue(fd, v)
		}
		return true
	})
	for _, s := range sets {
		m.Set(s.fd, s.v)
	}
}

func sanitizeMap(fd protoreflect.FieldDescriptor, mp protoreflect.Map) {
	type entry struct {
		old, key protoreflect.MapKey
		val      protoreflect.Value
	}
	var changes []entry
	mp.Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
		e := entry{old: k, key: k, val: sanitizeValue(fd.MapValue(), mv)}
		if ks, ok := k.Interface().(string); ok {
			e.key = protoreflect.ValueOfString(SanitizeText(ks)).MapKey()
		}
		changes = append(changes, e)
		return true
	})
	for _, e := range changes {
		mp.Clear(e.old)
	}
	for _, e := range changes {
		mp.Set(e.key, e.val)
	}
}

func sanitizeValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(SanitizeText(v.String()))
	case protoreflect.MessageKind, protoreflect.GroupKind:
		sanitizeMessage(v.Message())
	}
	return v
}
