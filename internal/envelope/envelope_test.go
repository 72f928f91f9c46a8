package envelope

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

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
	now := time.Now()
	c.put("a", true, now)
	got, ok := c.get("a", now.Add(9*time.Second))
	require.True(t, ok)
	require.True(t, got)
	_, ok = c.get("a", now.Add(10*time.Second))
	require.False(t, ok, "an entry is never used past its TTL")
	c.put("b", false, now)
	c.put("c", false, now) // over the bound: the cache starts over
	_, ok = c.get("a", now)
	require.False(t, ok)
	c.clear()
	_, ok = c.get("c", now)
	require.False(t, ok)
}
