package console

import (
	"bytes"
	"net/http"
	"net/url"
	"strings"

	"github.com/better-compute/better-compute/internal/events"
)

// PathLive streams the viewer's events to the console's script
// (assets/console.js), which refreshes the parts of the page that declare
// they depend on them (data-live).
const PathLive = "/console/live"

// live forwards the browser's EventSource to the API's own event stream
// (GET /v1/events/stream) with the viewer's key, so the API decides and
// tenant-scopes it as for the CLI. The response streams straight through:
// the unary handlerTransport would buffer it whole.
func (c *Console) live(w http.ResponseWriter, r *http.Request, s *session) {
	key, err := c.cfg.Sealer.Open(sealRef(s.row.IDHash), s.row.APIKey)
	if err != nil {
		c.fail(w, r, s, http.StatusUnauthorized, apiError{Code: "UNAUTHENTICATED", Message: "the session's key does not open: sign in again"})
		return
	}
	q := url.Values{}
	if t := r.URL.Query().Get("types"); t != "" {
		q.Set("types", t)
	}
	if t := tenantOf(r, s); t != "" {
		q.Set("tenant", t)
	}
	in := r.Clone(r.Context())
	in.URL = &url.URL{Path: events.SSEPath, RawQuery: q.Encode()}
	in.RequestURI = in.URL.RequestURI()
	// Only what the stream reads: never the console's cookies.
	in.Header = http.Header{}
	in.Header.Set("Authorization", "Bearer "+string(key))
	in.Header.Set("Accept", "text/event-stream")
	in.Header.Set("User-Agent", "better-compute-console")
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		in.Header.Set("Last-Event-ID", id)
	}
	for _, v := range r.Header.Values("X-Forwarded-For") {
		in.Header.Add("X-Forwarded-For", v)
	}
	in.Body = http.NoBody
	c.cfg.API.ServeHTTP(&unnamedEvents{w: w}, in)
}

// unnamedEvents passes an event stream through with each frame's
// "event: TYPE" line dropped, so EventSource delivers every event as a
// message (its JSON carries the type) and the script need not know every
// type in advance. An error frame keeps its name.
type unnamedEvents struct {
	w    http.ResponseWriter
	line []byte
}

func (u *unnamedEvents) Header() http.Header    { return u.w.Header() }
func (u *unnamedEvents) WriteHeader(status int) { u.w.WriteHeader(status) }

func (u *unnamedEvents) Write(p []byte) (int, error) {
	n := len(p)
	var out bytes.Buffer
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			u.line = append(u.line, p...)
			break
		}
		u.line = append(u.line, p[:i+1]...)
		p = p[i+1:]
		if l := string(u.line); !strings.HasPrefix(l, "event: ") || l == "event: error\n" {
			out.Write(u.line)
		}
		u.line = u.line[:0]
	}
	if out.Len() > 0 {
		if _, err := u.w.Write(out.Bytes()); err != nil {
			return 0, err
		}
	}
	return n, nil
}

func (u *unnamedEvents) Flush() {
	if f, ok := u.w.(http.Flusher); ok {
		f.Flush()
	}
}
