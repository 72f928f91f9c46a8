package console

import (
	"bytes"
	"fmt"
	"io"
	"net/http"

	"github.com/better-compute/better-compute/client"
)

// apiBase is the base URL of in-process API calls; the transport never
// dials it.
const apiBase = "http://console.invalid"

// apiClient returns the public API client that acts as key for the browser
// request r: every call passes the API's own handler (interceptors, one
// authorization decision per mutation, audit rows) in process, with the
// browser's address as the caller's, as a CLI call from there would.
func (c *Console) apiClient(r *http.Request, key string) *client.Client {
	t := handlerTransport{h: c.cfg.API, remoteAddr: r.RemoteAddr, forwardedFor: r.Header.Values("X-Forwarded-For")}
	return client.New(apiBase, key, client.WithHTTPClient(&http.Client{Transport: t}),
		client.WithHeader("User-Agent", "better-compute-console"))
}

// handlerTransport sends a request to an http.Handler in process. The
// console's calls are unary, so a buffered response is enough.
type handlerTransport struct {
	h            http.Handler
	remoteAddr   string
	forwardedFor []string
}

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	rw := &bufferedResponse{header: http.Header{}}
	// The handler reads the body as a server would: never nil.
	if req.Body == nil {
		req.Body = http.NoBody
	}
	in := req.Clone(req.Context())
	in.RequestURI = req.URL.RequestURI()
	in.RemoteAddr = t.remoteAddr
	// The API trusts X-Forwarded-For only from its configured proxies, as
	// for any request: pass on what the browser's request carried.
	in.Header.Del("X-Forwarded-For")
	for _, v := range t.forwardedFor {
		in.Header.Add("X-Forwarded-For", v)
	}
	t.h.ServeHTTP(rw, in)
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	return &http.Response{
		Status: fmt.Sprintf("%d %s", rw.status, http.StatusText(rw.status)), StatusCode: rw.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rw.header, Body: io.NopCloser(&rw.body), ContentLength: int64(rw.body.Len()), Request: req,
	}, nil
}

type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}
