package hcloud

import (
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	hc "github.com/hetznercloud/hcloud-go/v2/hcloud"

	"github.com/better-compute/better-compute/internal/providers"
)

// labelValueRE is Hetzner's rule for a label value: empty, or up to 63
// letters, digits, "-", "_" and "." that start and end alphanumeric.
var labelValueRE = regexp.MustCompile(`^([a-zA-Z0-9]([a-zA-Z0-9._-]{0,61}[a-zA-Z0-9])?)?$`)

func validLabelValue(v string) bool { return labelValueRE.MatchString(v) }

// minRetryAfter is the least a rate-limited caller waits: Hetzner refills
// its budget by one request a second.
const minRetryAfter = time.Second

// wrap turns a client error into a providers.Error whose message is free
// of the token and of secrets (a create's user data, line by line too, in
// case the API quotes a line of it back).
func (p *Provider) wrap(op string, err error, secrets ...string) error {
	redact := []string{p.token}
	for _, s := range secrets {
		redact = append(redact, s)
		for _, line := range strings.Split(s, "\n") {
			if line = strings.TrimSpace(line); len(line) >= 16 {
				redact = append(redact, line)
			}
		}
	}
	e := &providers.Error{
		Provider: Type,
		Kind:     providers.KindInternal,
		Message:  providers.Redact(op+": "+err.Error(), redact...),
	}
	var apiErr hc.Error
	var actionErr hc.ActionError
	switch {
	case errors.As(err, &apiErr):
		e.Code = string(apiErr.Code)
		status := 0
		if resp := apiErr.Response(); resp != nil && resp.Response != nil {
			status = resp.StatusCode
		}
		e.Kind = kindOfCode(apiErr.Code)
		if e.Kind == "" {
			e.Kind = kindOfStatus(status)
		}
		if e.Kind == providers.KindRateLimited {
			e.RetryAfter = retryAfter(apiErr.Response())
		}
	case errors.Is(err, hc.ErrStatusCode):
		// An error without Hetzner's body (a proxy's page): the status is
		// all there is, and the client puts it last in the message.
		fields := strings.Fields(err.Error())
		status, _ := strconv.Atoi(fields[len(fields)-1])
		e.Kind = kindOfStatus(status)
		if e.Kind == providers.KindRateLimited {
			e.RetryAfter = minRetryAfter
		}
	case errors.As(err, &actionErr):
		// The service ran the action and it failed: no retry mends that.
		e.Code = actionErr.Code
	default:
		// The request or its answer was lost on the way (or the context
		// ended): the service may or may not have acted, and a retry
		// (idempotent) finds out.
		e.Kind = providers.KindUnavailable
	}
	return e
}

func kindOfCode(code hc.ErrorCode) providers.ErrorKind {
	switch code {
	case hc.ErrorCodeNotFound:
		return providers.KindNotFound
	case hc.ErrorCodeUnauthorized:
		return providers.KindAuth
	case hc.ErrorCodeForbidden, hc.ErrorCodeTokenReadonly, hc.ErrorCodeProtected:
		return providers.KindForbidden
	case hc.ErrorCodeInvalidInput, hc.ErrorCodeJSONError, hc.ErrorCodeInvalidServerType,
		hc.ErrorUnsupportedError, hc.ErrorDeprecatedAPIEndpoint:
		return providers.KindInvalid
	case hc.ErrorCodeRateLimitExceeded:
		return providers.KindRateLimited
	case hc.ErrorCodeUniquenessError, hc.ErrorCodeConflict, hc.ErrorCodeLocked,
		hc.ErrorCodeResourceLocked, hc.ErrorCodeServerNotStopped:
		return providers.KindConflict
	case hc.ErrorCodeResourceLimitExceeded:
		return providers.KindQuota
	case hc.ErrorCodeResourceUnavailable, hc.ErrorCodePlacementError, hc.ErrorCodeMaintenance,
		hc.ErrorCodeServerError, hc.ErrorCodeServiceError, hc.ErrorCodeTimeout, "unavailable":
		return providers.KindUnavailable
	}
	return ""
}

func kindOfStatus(status int) providers.ErrorKind {
	switch {
	case status == http.StatusBadRequest, status == http.StatusUnprocessableEntity:
		return providers.KindInvalid
	case status == http.StatusUnauthorized:
		return providers.KindAuth
	case status == http.StatusForbidden:
		return providers.KindForbidden
	case status == http.StatusNotFound:
		return providers.KindNotFound
	case status == http.StatusConflict, status == http.StatusLocked:
		return providers.KindConflict
	case status == http.StatusTooManyRequests:
		return providers.KindRateLimited
	case status == http.StatusPreconditionFailed, status >= 500:
		return providers.KindUnavailable
	}
	return providers.KindInternal
}

// retryAfter reads a 429's RateLimit headers. RateLimit-Reset is when the
// whole budget is back; one request's share of that (the budget refills
// evenly) is when the next request may pass, and never less than a second.
func retryAfter(resp *hc.Response) time.Duration {
	if resp == nil || resp.Response == nil {
		return minRetryAfter
	}
	reset, err := strconv.ParseInt(resp.Header.Get("RateLimit-Reset"), 10, 64)
	if err != nil {
		return minRetryAfter
	}
	wait := time.Until(time.Unix(reset, 0))
	limit, _ := strconv.Atoi(resp.Header.Get("RateLimit-Limit"))
	remaining, _ := strconv.Atoi(resp.Header.Get("RateLimit-Remaining"))
	if limit > remaining {
		wait /= time.Duration(limit - remaining)
	}
	return max(wait, minRetryAfter)
}
