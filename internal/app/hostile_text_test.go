package app_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
)

// htHostile are the strings of an attacker's hour: NUL (a 500 on
// PostgreSQL once), a screen clear, a word painted green, a right-to-left
// override, an isolate, C1's NEL and CSI, DEL, a carriage return that
// overwrites a line, and a line separator.
var htHostile = []string{"\x00", "\x1b[2J", "\x1b[32mSUCCEEDED", "\u202e", "\u2066", "\u0085", "\u009b", "\x7f", "\r", "\u2028"}

// htLineBreaks are refused only in one-line fields.
var htLineBreaks = []string{"\n", "\t"}

// htMarker stands in for a string while a request is encoded; it is
// swapped for bytes no encoder would write.
const htMarker = "ZQZQ"

// htSlot is one place a request carries text: path is the field as a
// violation names it; set writes v there in an empty request.
type htSlot struct {
	path      string
	multiLine bool
	set       func(m protoreflect.Message, v string)
}

// htSlots finds every string a request message can carry, however deep:
// fields, list elements, map keys and values, google.protobuf.Struct. A
// text field added to the API is found here without a line of test code.
func htSlots(md protoreflect.MessageDescriptor, prefix string, seen map[protoreflect.FullName]bool) []htSlot {
	if seen[md.FullName()] {
		return nil // Struct → Value → Struct: once is enough
	}
	seen[md.FullName()] = true
	defer delete(seen, md.FullName())
	structural := md.FullName() == "google.protobuf.Struct" || md.FullName() == "google.protobuf.Value" || md.FullName() == "google.protobuf.ListValue"
	var out []htSlot
	for i := range md.Fields().Len() {
		fd := md.Fields().Get(i)
		path := prefix
		if !structural {
			path = strings.TrimPrefix(prefix+"."+string(fd.Name()), ".")
		}
		multi := envelope.MultiLineFields[fd.FullName()]
		switch {
		case fd.IsMap():
			if fd.MapKey().Kind() == protoreflect.StringKind {
				out = append(out, htSlot{path: path, set: func(m protoreflect.Message, v string) {
					mp := m.Mutable(fd).Map()
					val := mp.NewValue()
					if fd.MapValue().Kind() == protoreflect.MessageKind && fd.MapValue().Message().FullName() == "google.protobuf.Value" {
						// JSON cannot spell a Value of no kind.
						val.Message().Set(fd.MapValue().Message().Fields().ByName("string_value"), protoreflect.ValueOfString("v"))
					}
					mp.Set(protoreflect.ValueOfString(v).MapKey(), val)
				}})
			}
			keyed, key := path+`["k"]`, protoreflect.ValueOfString("k").MapKey()
			if fd.MapKey().Kind() == protoreflect.Int64Kind {
				// An XID-keyed map (policy.health.xid_actions).
				keyed, key = path+"[79]", protoreflect.ValueOfInt64(79).MapKey()
			}
			for _, s := range htValueSlots(fd.MapValue(), keyed, multi, seen) {
				out = append(out, htSlot{path: s.path, multiLine: s.multiLine, set: func(m protoreflect.Message, v string) {
					mp := m.Mutable(fd).Map()
					val := mp.NewValue()
					if fd.MapValue().Kind() == protoreflect.MessageKind {
						s.set(val.Message(), v)
					} else {
						val = protoreflect.ValueOfString(v)
					}
					mp.Set(key, val)
				}})
			}
		case fd.IsList():
			for _, s := range htValueSlots(fd, path+"[0]", multi, seen) {
				out = append(out, htSlot{path: s.path, multiLine: s.multiLine, set: func(m protoreflect.Message, v string) {
					l := m.Mutable(fd).List()
					el := l.NewElement()
					if fd.Kind() == protoreflect.MessageKind {
						s.set(el.Message(), v)
					} else {
						el = protoreflect.ValueOfString(v)
					}
					l.Append(el)
				}})
			}
		default:
			for _, s := range htValueSlots(fd, path, multi, seen) {
				out = append(out, htSlot{path: s.path, multiLine: s.multiLine, set: func(m protoreflect.Message, v string) {
					if fd.Kind() == protoreflect.MessageKind {
						s.set(m.Mutable(fd).Message(), v)
					} else {
						m.Set(fd, protoreflect.ValueOfString(v))
					}
				}})
			}
		}
	}
	return out
}

// htValueSlots are the slots of one value of fd: itself when it is a
// string, its own slots when it is a message (set then writes inside it).
func htValueSlots(fd protoreflect.FieldDescriptor, path string, multi bool, seen map[protoreflect.FullName]bool) []htSlot {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return []htSlot{{path: path, multiLine: multi}}
	case protoreflect.MessageKind:
		return htSlots(fd.Message(), path, seen)
	}
	return nil
}

// htMethod is one procedure of the API.
type htMethod struct {
	procedure string
	streaming bool
	input     protoreflect.MessageDescriptor
}

func htMethods(t *testing.T) []htMethod {
	t.Helper()
	_ = apiv1.File_bettercompute_api_v1_tenancy_proto // the descriptors are registered
	var out []htMethod
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if fd.Package() != "bettercompute.api.v1" {
			return true
		}
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				m := svc.Methods().Get(j)
				out = append(out, htMethod{
					procedure: fmt.Sprintf("/%s/%s", svc.FullName(), m.Name()),
					streaming: m.IsStreamingServer() || m.IsStreamingClient(),
					input:     m.Input(),
				})
			}
		}
		return true
	})
	require.NotEmpty(t, out)
	return out
}

// htError is a refusal as the Connect protocol carries it.
type htError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Details []struct {
		Type  string `json:"type"`
		Value string `json:"value"`
	} `json:"details"`
}

// fields returns the fields the refusal's ErrorDetail names.
func (e htError) fields(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, d := range e.Details {
		if d.Type != "bettercompute.api.v1.ErrorDetail" {
			continue
		}
		raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(d.Value, "="))
		require.NoError(t, err)
		var ed apiv1.ErrorDetail
		require.NoError(t, proto.Unmarshal(raw, &ed))
		for _, v := range ed.GetViolations() {
			out = append(out, v.GetField())
		}
	}
	return out
}

// htCall sends body to a procedure over the Connect protocol, unary or
// server-streaming, binary or JSON, and returns how it was refused (a zero
// htError when it was not).
func htCall(t *testing.T, cp *bctest.ControlPlane, m htMethod, body []byte, jsonCodec bool) htError {
	t.Helper()
	codec := "proto"
	if jsonCodec {
		codec = "json"
	}
	ctype := "application/" + codec
	if m.streaming {
		ctype = "application/connect+" + codec
		frame := make([]byte, 5, 5+len(body))
		binary.BigEndian.PutUint32(frame[1:], uint32(len(body)))
		body = append(frame, body...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cp.URL+m.procedure, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Authorization", "Bearer "+cp.AdminKey)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	var out htError
	if !m.streaming {
		raw, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		if res.StatusCode == http.StatusOK {
			return out
		}
		require.NoError(t, json.Unmarshal(raw, &out), "%s: body %q", m.procedure, raw)
		return out
	}
	// A stream answers frames; a refusal is the end-of-stream frame, and
	// a data frame means the stream was let in.
	head := make([]byte, 5)
	_, err = io.ReadFull(res.Body, head)
	require.NoError(t, err, "%s: status %d", m.procedure, res.StatusCode)
	if head[0]&2 == 0 {
		return out
	}
	raw := make([]byte, binary.BigEndian.Uint32(head[1:]))
	_, err = io.ReadFull(res.Body, raw)
	require.NoError(t, err)
	var end struct {
		Error *htError `json:"error"`
	}
	require.NoError(t, json.Unmarshal(raw, &end), "%s: end frame %q", m.procedure, raw)
	if end.Error != nil {
		out = *end.Error
	}
	return out
}

// TestHostileTextEveryField feeds every hostile string to every text field
// of every procedure, through the real API: each is refused
// INVALID_ARGUMENT naming the field, and nothing is written (no row, no
// audit row). Invalid UTF-8 (binary) and a lone surrogate (JSON), which
// the decoders alone would refuse without naming a field, are named too.
func TestHostileTextEveryField(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	sfProject(t, admin, "acme", "web")
	before := sfCounts(t, cp)

	fields := 0
	for _, m := range htMethods(t) {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(m.input.FullName())
		require.NoError(t, err)
		for _, s := range htSlots(m.input, "", map[protoreflect.FullName]bool{}) {
			fields++
			values := htHostile
			if !s.multiLine {
				values = append(append([]string{}, htHostile...), htLineBreaks...)
			}
			for _, h := range values {
				msg := mt.New()
				s.set(msg, "web"+h+"x")
				body, err := proto.Marshal(msg.Interface())
				require.NoError(t, err)
				got := htCall(t, cp, m, body, false)
				require.Equal(t, "invalid_argument", got.Code, "%s %s = %q: %+v", m.procedure, s.path, h, got)
				require.Contains(t, got.fields(t), s.path, "%s %s = %q: %+v", m.procedure, s.path, h, got)
				require.NotContains(t, got.Message, h, "the refusal must not echo the bytes")
			}

			// Invalid UTF-8: no encoder writes it, so the marker's four
			// bytes are swapped for four invalid ones on the wire.
			msg := mt.New()
			s.set(msg, htMarker)
			body, err := proto.Marshal(msg.Interface())
			require.NoError(t, err)
			body = bytes.Replace(body, []byte(htMarker), []byte("a\xffb\xfe"), 1)
			got := htCall(t, cp, m, body, false)
			require.Equal(t, "invalid_argument", got.Code, "%s %s invalid UTF-8: %+v", m.procedure, s.path, got)
			require.Contains(t, got.fields(t), s.path, "%s %s invalid UTF-8: %+v", m.procedure, s.path, got)

			// A lone surrogate, which only JSON can spell.
			js, err := protojson.Marshal(msg.Interface())
			require.NoError(t, err)
			js = bytes.Replace(js, []byte(htMarker), []byte(`\ud800`), 1)
			got = htCall(t, cp, m, js, true)
			require.Equal(t, "invalid_argument", got.Code, "%s %s lone surrogate: %+v", m.procedure, s.path, got)
			require.Contains(t, got.fields(t), s.path, "%s %s lone surrogate: %+v", m.procedure, s.path, got)
		}
	}
	// The API has far more text fields than this; a walk that found few
	// would be a broken test, not a safe API.
	require.Greater(t, fields, 100)
	sfRequireDelta(t, before, sfCounts(t, cp), nil, "a refused request writes nothing, not even an audit row")
}

// TestHostileTextMultiLineAllowed: a field documented as multi-line takes
// tab and newline, so the rule refuses what is dangerous, not what is
// merely unusual; right-to-left marks and non-Latin text pass everywhere.
func TestHostileTextMultiLineAllowed(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	for _, m := range htMethods(t) {
		if m.procedure != "/bettercompute.api.v1.PolicyService/Put" {
			continue
		}
		body, err := proto.Marshal(&apiv1.PutPolicyRequest{Tenant: "acme", Id: "never", Text: "@id(\"never\")\n\tforbid (principal, action, resource)\n\twhen { false };"})
		require.NoError(t, err)
		got := htCall(t, cp, m, body, false)
		require.Empty(t, got.Code, "%+v", got)
	}
	for _, name := range []string{"Ünïcode Lab", "מעבדה\u200f 1", "研究室", "emoji 🚀"} {
		body, err := proto.Marshal(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "p" + strconv.Itoa(len(name)), DisplayName: name})
		require.NoError(t, err)
		got := htCall(t, cp, htMethod{procedure: "/bettercompute.api.v1.ProjectService/Create", input: (&apiv1.CreateProjectRequest{}).ProtoReflect().Descriptor()}, body, false)
		require.Empty(t, got.Code, "%q: %+v", name, got)
	}
}
