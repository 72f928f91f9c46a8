package envelope

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

func TestViolations(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		check func(*Violations)
		field string
	}{
		{"empty name", func(vs *Violations) { vs.Name("name", "") }, "name"},
		{"upper case", func(vs *Violations) { vs.Name("name", "Acme") }, "name"},
		{"too long", func(vs *Violations) { vs.Name("name", strings.Repeat("a", 64)) }, "name"},
		{"space", func(vs *Violations) { vs.Name("name", "a b") }, "name"},
		{"bad id", func(vs *Violations) { vs.ID("id", "key_nope", "key") }, "id"},
		{"wrong prefix", func(vs *Violations) { vs.ID("id", NewID("tnt", time.Now()), "key") }, "id"},
		{"bad ref", func(vs *Violations) { vs.Ref("tenant", "tnt_XYZ", "tnt") }, "tenant"},
		{"page size", func(vs *Violations) { vs.PageSize("page_size", MaxPageSize+1) }, "page_size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var vs Violations
			tt.check(&vs)
			err := vs.Err()
			require.Error(t, err)
			apiErr := AsError(err)
			require.Equal(t, CodeInvalidArgument, apiErr.Code)
			require.Equal(t, tt.field, apiErr.Violations[0].Field)
		})
	}
	var ok Violations
	ok.Name("name", strings.Repeat("a", 63))
	ok.Ref("tenant", "acme", "tnt")
	ok.Ref("tenant", NewID("tnt", time.Now()), "tnt")
	require.NoError(t, ok.Err())
}

func TestNewIDIsOrderedAndValid(t *testing.T) {
	t.Parallel()
	now := time.Now()
	prev := NewID("aud", now)
	for i := range 1000 {
		// Time jumping back must not reorder ids.
		id := NewID("aud", now.Add(-time.Duration(i)*time.Millisecond))
		require.True(t, IsID(id, "aud"), id)
		require.Greater(t, id, prev)
		prev = id
	}
}

func TestPageTokenRoundTrip(t *testing.T) {
	t.Parallel()
	tok := EncodePageToken("prj_x", "acme/")
	after, err := DecodePageToken("page_token", tok, "acme/")
	require.NoError(t, err)
	require.Equal(t, "prj_x", after)
	_, err = DecodePageToken("page_token", tok, "other/")
	require.Equal(t, CodeInvalidArgument, AsError(err).Code)
	_, err = DecodePageToken("page_token", "!!!", "")
	require.Equal(t, "page_token", AsError(err).Violations[0].Field)
}

func FuzzDecodePageToken(f *testing.F) {
	f.Add(EncodePageToken("prj_01", "acme/"), "acme/")
	f.Add("", "")
	f.Add("e30", "")
	f.Add("not base64!", "x")
	f.Fuzz(func(t *testing.T, token, filter string) {
		after, err := DecodePageToken("page_token", token, filter)
		if err != nil {
			require.Equal(t, CodeInvalidArgument, AsError(err).Code)
			return
		}
		if token != "" {
			require.NotEmpty(t, after)
		}
	})
}

func TestErrorMapping(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		code Code
		want connect.Code
	}{
		{&store.Error{Kind: store.ErrNotFound}, CodeNotFound, connect.CodeNotFound},
		{&store.Error{Kind: store.ErrUnique}, CodeAlreadyExists, connect.CodeAlreadyExists},
		{&store.Error{Kind: store.ErrConstraint}, CodeFailedPrecondition, connect.CodeFailedPrecondition},
		{&store.Error{Kind: store.ErrSerialization}, CodeConflict, connect.CodeAborted},
		{&store.Error{Kind: store.ErrLockTimeout}, CodeUnavailable, connect.CodeUnavailable},
		{fmt.Errorf("write: %w", &store.Error{Kind: store.ErrStatementTimeout}), CodeUnavailable, connect.CodeUnavailable},
		{errors.New("boom"), CodeInternal, connect.CodeInternal},
		{&Error{Code: CodeConfirmationRequired, Message: "m", ConfirmationID: "cfm_x"}, CodeConfirmationRequired, connect.CodeFailedPrecondition},
	}
	for _, tt := range tests {
		ce := ToConnect(tt.err)
		require.Equal(t, tt.want, ce.Code())
		d := DetailOf(ce)
		require.NotNil(t, d)
		require.Equal(t, string(tt.code), d.GetCode())
		// Internal detail never reaches the caller.
		require.NotContains(t, ce.Message(), "boom")
		if tt.code == CodeUnavailable {
			// A store timeout is retryable and says when to retry.
			require.Positive(t, RetryDelayOf(ce), "%v", tt.err)
		}
	}
}

func TestDecisionCache(t *testing.T) {
	t.Parallel()
	c := newDecisionCache(10*time.Second, 2)
	key := func(id string) readKey { return readKey{resID: id} }
	now := time.Now()
	c.put(key("a"), true, now)
	got, ok := c.get(key("a"), now.Add(9*time.Second))
	require.True(t, ok)
	require.True(t, got)
	_, ok = c.get(key("a"), now.Add(10*time.Second))
	require.False(t, ok, "an entry is never used past its TTL")
	c.put(key("b"), false, now)
	c.put(key("c"), false, now) // over the bound: the cache starts over
	_, ok = c.get(key("a"), now)
	require.False(t, ok)
	c.clear()
	_, ok = c.get(key("c"), now)
	require.False(t, ok)
}

// TestDecisionCacheKey: the key tells apart every fact a decision depends
// on, including resource attributes and context, and is the same for the
// same facts whatever the map order.
func TestDecisionCacheKey(t *testing.T) {
	t.Parallel()
	c := newDecisionCache(10*time.Second, 100)
	p := iam.Principal{ID: "key_1", Role: "member"}
	res := func(attrs map[string]any) iam.Resource {
		return iam.Resource{Type: "Reservation", ID: iam.DraftID, TenantID: "tnt_1", ProjectID: "prj_1", Attrs: attrs}
	}
	confirmed := map[string]any{iam.ContextConfirmed: false}
	base, ok := c.key(p, "reservations.preview", res(map[string]any{"gpus": 1, "pool": "pol_1"}), confirmed)
	require.True(t, ok)

	// The same facts, built in another order, give the same key.
	attrs := map[string]any{}
	for i := range 64 {
		attrs[fmt.Sprintf("k%02d", i)] = i
	}
	attrs2 := map[string]any{}
	for i := 63; i >= 0; i-- {
		attrs2[fmt.Sprintf("k%02d", i)] = int64(i)
	}
	k1, _ := c.key(p, "reservations.preview", res(attrs), confirmed)
	k2, _ := c.key(p, "reservations.preview", res(attrs2), confirmed)
	require.Equal(t, k1, k2)
	same, _ := c.key(p, "reservations.preview", res(map[string]any{"pool": "pol_1", "gpus": int64(1)}), map[string]any{iam.ContextConfirmed: false})
	require.Equal(t, base, same)

	differ := map[string]func() (readKey, bool){
		"gpus": func() (readKey, bool) {
			return c.key(p, "reservations.preview", res(map[string]any{"gpus": 1024, "pool": "pol_1"}), confirmed)
		},
		"attr absent": func() (readKey, bool) {
			return c.key(p, "reservations.preview", res(map[string]any{"pool": "pol_1"}), confirmed)
		},
		"attr type": func() (readKey, bool) {
			return c.key(p, "reservations.preview", res(map[string]any{"gpus": "1", "pool": "pol_1"}), confirmed)
		},
		"string split": func() (readKey, bool) {
			return c.key(p, "reservations.preview", res(map[string]any{"gpus": 1, "pool": "pol_1", "a": []string{"x", "y"}}), confirmed)
		},
		"string joined": func() (readKey, bool) {
			return c.key(p, "reservations.preview", res(map[string]any{"gpus": 1, "pool": "pol_1", "a": []string{"xy"}}), confirmed)
		},
		"context": func() (readKey, bool) {
			return c.key(p, "reservations.preview", res(map[string]any{"gpus": 1, "pool": "pol_1"}), map[string]any{iam.ContextConfirmed: false, "lifetimeSeconds": int64(60)})
		},
		"nested": func() (readKey, bool) {
			return c.key(p, "reservations.preview", res(map[string]any{"gpus": 1, "pool": "pol_1", "labels": map[string]any{"a": "b"}}), confirmed)
		},
		"action": func() (readKey, bool) {
			return c.key(p, "reservations.get", res(map[string]any{"gpus": 1, "pool": "pol_1"}), confirmed)
		},
		"principal": func() (readKey, bool) {
			return c.key(iam.Principal{ID: "key_2", Role: "member"}, "reservations.preview", res(map[string]any{"gpus": 1, "pool": "pol_1"}), confirmed)
		},
	}
	seen := map[readKey]string{base: "base"}
	for name, f := range differ {
		k, ok := f()
		require.True(t, ok, name)
		prev, dup := seen[k]
		require.False(t, dup, "%s has the key of %s", name, prev)
		seen[k] = name
	}

	// A value with no canonical encoding is never cached.
	_, ok = c.key(p, "reservations.preview", res(map[string]any{"when": time.Now()}), confirmed)
	require.False(t, ok)
}

// BenchmarkDecisionCacheKey measures the key of a typical reservation read.
func BenchmarkDecisionCacheKey(b *testing.B) {
	c := newDecisionCache(10*time.Second, 100)
	p := iam.Principal{ID: "key_01m8r1dbek6qdgqn5d6nh2yee5", Role: "member"}
	res := iam.Resource{Type: "Reservation", ID: "rsv_01m8r1dbek6qdgqn5d6nh2yee5", TenantID: "tnt_01m8r1dbek6qdgqn5d6nh2yee5",
		ProjectID: "prj_01m8r1dbek6qdgqn5d6nh2yee5", Attrs: map[string]any{"pool": "pol_01m8r1dbek6qdgqn5d6nh2yee5",
			"state": "active", "gpus": 8, "binding": "none", "lifetimeSeconds": int64(3600)}}
	decisionCtx := map[string]any{iam.ContextConfirmed: false}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := c.key(p, "reservations.get", res, decisionCtx); !ok {
			b.Fatal("not cacheable")
		}
	}
}
