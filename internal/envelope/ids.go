package envelope

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

var (
	entropyMu sync.Mutex
	entropy   = ulid.Monotonic(rand.Reader, 0)
	lastMS    uint64
)

// NewID returns a new id "<prefix>_<ulid>" whose time part comes from now, so
// ids sort by creation and serve as stable pagination keys. Ids made by one
// process strictly increase even if the clock steps back (or, in tests,
// several simulated clocks interleave): the time part never goes below the
// last one used.
func NewID(prefix string, now time.Time) string {
	entropyMu.Lock()
	ms := max(ulid.Timestamp(now), lastMS)
	lastMS = ms
	id := ulid.MustNew(ms, entropy)
	entropyMu.Unlock()
	return prefix + "_" + strings.ToLower(id.String())
}

// MaxPageSize caps list pages; DefaultPageSize is used when a request says 0.
const (
	MaxPageSize     = 500
	DefaultPageSize = 100
)

// PageSize returns the effective page size for a request.
func PageSize(n int32) int {
	if n <= 0 {
		return DefaultPageSize
	}
	return min(int(n), MaxPageSize)
}

// pageToken is the cursor inside an opaque page token: the last key returned
// and a fingerprint of the filters, so a token cannot be replayed against a
// different query.
type pageToken struct {
	After  string `json:"a"`
	Filter string `json:"f,omitempty"`
}

// EncodePageToken returns the opaque token for the page after key.
func EncodePageToken(after, filter string) string {
	b, _ := json.Marshal(pageToken{After: after, Filter: filter})
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodePageToken returns the key a page token continues after, or an
// INVALID_ARGUMENT error naming the field.
func DecodePageToken(field, token, filter string) (string, error) {
	if token == "" {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) > 1024 {
		return "", Invalid(Violation{Field: field, Reason: "is not a token this server issued"})
	}
	var pt pageToken
	if err := json.Unmarshal(raw, &pt); err != nil || pt.After == "" {
		return "", Invalid(Violation{Field: field, Reason: "is not a token this server issued"})
	}
	if pt.Filter != filter {
		return "", Invalid(Violation{Field: field, Reason: "was issued for different filters"})
	}
	return pt.After, nil
}
