package envelope

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"connectrpc.com/connect"
)

// httpStatus is the HTTP status of each Connect code, as the Connect
// protocol maps them, for plain HTTP endpoints outside Connect.
var httpStatus = map[connect.Code]int{
	connect.CodeCanceled:           499,
	connect.CodeUnknown:            http.StatusInternalServerError,
	connect.CodeInvalidArgument:    http.StatusBadRequest,
	connect.CodeDeadlineExceeded:   http.StatusGatewayTimeout,
	connect.CodeNotFound:           http.StatusNotFound,
	connect.CodeAlreadyExists:      http.StatusConflict,
	connect.CodePermissionDenied:   http.StatusForbidden,
	connect.CodeResourceExhausted:  http.StatusTooManyRequests,
	connect.CodeFailedPrecondition: http.StatusBadRequest,
	connect.CodeAborted:            http.StatusConflict,
	connect.CodeOutOfRange:         http.StatusBadRequest,
	connect.CodeUnimplemented:      http.StatusNotImplemented,
	connect.CodeInternal:           http.StatusInternalServerError,
	connect.CodeUnavailable:        http.StatusServiceUnavailable,
	connect.CodeDataLoss:           http.StatusInternalServerError,
	connect.CodeUnauthenticated:    http.StatusUnauthorized,
}

// HTTPError is the JSON body of a refused plain HTTP request.
type HTTPError struct {
	// Code is the machine code (TOO_MANY_STREAMS, PERMISSION_DENIED, …).
	Code       string      `json:"code"`
	Message    string      `json:"message"`
	Violations []Violation `json:"violations,omitempty"`
}

// writeTracker remembers whether the handler has started its response.
type writeTracker struct {
	http.ResponseWriter
	wrote bool
}

func (w *writeTracker) WriteHeader(code int) { w.wrote = true; w.ResponseWriter.WriteHeader(code) }
func (w *writeTracker) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}
func (w *writeTracker) Flush() {
	w.wrote = true
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// HTTPStream serves a plain HTTP stream (Server-Sent Events) through the
// same first stage as a Connect watch of procedure: request id, catalog
// row, authentication from the Authorization header, the principal's
// request rate and open-stream count. fn decides and streams; an error it
// returns before it has written anything is answered with the code's HTTP
// status and an HTTPError body, one after that by onLate (the stream's own
// error frame).
func (i *Interceptor) HTTPStream(procedure string, fn func(ctx context.Context, w http.ResponseWriter, r *http.Request) error,
	onLate func(w http.ResponseWriter, e HTTPError)) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w := &writeTracker{ResponseWriter: rw}
		ctx := r.Context()
		start := i.env.cfg.Clock.Now()
		ctx, err := i.begin(ctx, procedure, r.RemoteAddr, r.Header, false)
		var done func()
		if err == nil {
			caller, _ := CallerFrom(ctx)
			done, err = i.env.limiter.openStream(caller.Principal.ID)
		}
		if err == nil {
			w.Header().Set(HeaderRequestID, InfoFrom(ctx).RequestID)
			err = fn(ctx, w, r.WithContext(ctx))
			done()
		}
		if errors.Is(err, context.Canceled) || (err != nil && ctx.Err() != nil) {
			err = nil
		}
		i.finish(ctx, procedure, start, err)
		if err == nil {
			return
		}
		apiErr := AsError(err)
		body := HTTPError{Code: string(apiErr.Code), Message: apiErr.Message, Violations: apiErr.Violations}
		if d := DetailOf(err); d != nil {
			body.Code, body.Message = d.GetCode(), d.GetMessage()
			body.Violations = nil
			for _, v := range d.GetViolations() {
				body.Violations = append(body.Violations, Violation{Field: v.GetField(), Reason: v.GetReason()})
			}
		}
		if w.wrote {
			onLate(w, body)
			return
		}
		cerr := ToConnect(err)
		for k, vs := range cerr.Meta() {
			for _, v := range vs {
				w.Header().Add(k, v)
			}
		}
		w.Header().Set(HeaderRequestID, InfoFrom(ctx).RequestID)
		w.Header().Set("Content-Type", "application/json")
		status, ok := httpStatus[cerr.Code()]
		if !ok {
			status = http.StatusInternalServerError
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(body)
	})
}
