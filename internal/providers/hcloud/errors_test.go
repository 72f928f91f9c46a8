package hcloud

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	hc "github.com/hetznercloud/hcloud-go/v2/hcloud"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/providers"
)

func TestKindOfCode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code hc.ErrorCode
		want providers.ErrorKind
	}{
		{hc.ErrorCodeNotFound, providers.KindNotFound},
		{hc.ErrorCodeUnauthorized, providers.KindAuth},
		{hc.ErrorCodeForbidden, providers.KindForbidden},
		{hc.ErrorCodeInvalidInput, providers.KindInvalid},
		{hc.ErrorCodeRateLimitExceeded, providers.KindRateLimited},
		{hc.ErrorCodeUniquenessError, providers.KindConflict},
		{hc.ErrorCodeResourceLimitExceeded, providers.KindQuota},
		{hc.ErrorCodeServerError, providers.KindUnavailable},
		{hc.ErrorCodeResourceUnavailable, providers.KindUnavailable},
		{"something_new", ""},
	} {
		require.Equal(t, c.want, kindOfCode(c.code), string(c.code))
	}
}

func TestWrapWithoutAnAPIBody(t *testing.T) {
	t.Parallel()
	p := &Provider{token: "0123456789abcdef"}
	for _, c := range []struct {
		err  error
		want providers.ErrorKind
	}{
		{fmt.Errorf("hcloud: %w %d", hc.ErrStatusCode, http.StatusBadGateway), providers.KindUnavailable},
		{fmt.Errorf("hcloud: %w %d", hc.ErrStatusCode, http.StatusNotFound), providers.KindNotFound},
		{fmt.Errorf("hcloud: %w %d", hc.ErrStatusCode, http.StatusTooManyRequests), providers.KindRateLimited},
		{fmt.Errorf("post: %w", io.ErrUnexpectedEOF), providers.KindUnavailable},
		{context.DeadlineExceeded, providers.KindUnavailable},
		{hc.ActionError{Code: "action_failed", Message: "rebuild failed"}, providers.KindInternal},
	} {
		err := p.wrap("op", c.err)
		require.Equal(t, c.want, providers.KindOf(err), c.err.Error())
		if c.want == providers.KindRateLimited {
			_, after := providers.Retryable(err)
			require.GreaterOrEqual(t, after, time.Second)
		}
	}
}

func TestWrapRedactsTheTokenAndUserData(t *testing.T) {
	t.Parallel()
	p := &Provider{token: "0123456789abcdef0123456789abcdef"}
	userData := "#cloud-config\nruncmd:\n- bcd join --token bcjoin_wrap_secret_token\n"
	err := p.wrap("create", errors.New("bad token 0123456789abcdef0123456789abcdef; line 3: - bcd join --token bcjoin_wrap_secret_token"), userData)
	require.NotContains(t, err.Error(), p.token)
	require.NotContains(t, err.Error(), "bcjoin_wrap_secret_token")
}

func TestRetryAfterReadsTheBudget(t *testing.T) {
	t.Parallel()
	resp := func(limit, remaining int, reset time.Duration) *hc.Response {
		h := http.Header{}
		h.Set("RateLimit-Limit", strconv.Itoa(limit))
		h.Set("RateLimit-Remaining", strconv.Itoa(remaining))
		h.Set("RateLimit-Reset", strconv.FormatInt(time.Now().Add(reset).Unix(), 10))
		return &hc.Response{Response: &http.Response{Header: h}}
	}
	// An empty budget of 3600 an hour refills one request a second.
	require.InDelta(t, time.Second, retryAfter(resp(3600, 0, time.Hour)), float64(100*time.Millisecond))
	// A budget of 60 an hour refills one a minute.
	require.InDelta(t, time.Minute, retryAfter(resp(60, 0, time.Hour)), float64(2*time.Second))
	// Never under a second, with or without headers.
	require.Equal(t, time.Second, retryAfter(resp(3600, 0, 0)))
	require.Equal(t, time.Second, retryAfter(nil))
}
