package driver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// NewLogger is a driver's logger: JSON lines on the process's stderr in
// hclog's shape (@level, @message, @timestamp), which the host parses
// into its own logger at the same level, with the same attributes. Build
// it before ServeBMC, which redirects os.Stderr.
func NewLogger(level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.LevelKey:
				return slog.String("@level", hclogLevelName(a.Value.Any().(slog.Level)))
			case slog.MessageKey:
				return slog.String("@message", a.Value.String())
			case slog.TimeKey:
				return slog.String("@timestamp", a.Value.Time().Format(pluginTimeFormat))
			}
			return a
		},
	}))
}

// pluginTimeFormat is the one @timestamp layout go-plugin's host parses;
// a line with any other is logged as unparsed text at debug.
const pluginTimeFormat = "2006-01-02T15:04:05.000000Z07:00"

func hclogLevelName(l slog.Level) string {
	switch {
	case l < slog.LevelDebug:
		return "trace"
	case l < slog.LevelInfo:
		return "debug"
	case l < slog.LevelWarn:
		return "info"
	case l < slog.LevelError:
		return "warn"
	}
	return "error"
}

// levelTrace is hclog's trace in slog terms.
const levelTrace = slog.LevelDebug - 4

// hostLogger is the hclog.Logger go-plugin writes to on the host: its own
// lines and every line of the driver's stderr. It forwards them to the
// host's slog logger with every known secret scrubbed out, values
// included, so a driver that logs a password does not put it in the
// host's logs.
type hostLogger struct {
	l       *slog.Logger
	sc      *scrubber
	name    string
	implied []any
}

func newHostLogger(l *slog.Logger, sc *scrubber) *hostLogger { return &hostLogger{l: l, sc: sc} }

func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return levelTrace
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (h *hostLogger) Log(level hclog.Level, msg string, args ...any) {
	lvl := slogLevel(level)
	if !h.l.Enabled(context.Background(), lvl) {
		return
	}
	all := append(append([]any{}, h.implied...), args...)
	attrs := make([]any, 0, len(all)+2)
	if h.name != "" {
		attrs = append(attrs, slog.String("logger", h.name))
	}
	for i := 0; i < len(all); i += 2 {
		key := fmt.Sprint(all[i])
		if i+1 == len(all) {
			attrs = append(attrs, slog.String("extra", h.sc.scrub(key)))
			break
		}
		attrs = append(attrs, slog.Any(h.sc.scrub(key), h.value(all[i+1])))
	}
	h.l.Log(context.Background(), lvl, h.sc.scrub(msg), attrs...)
}

// value keeps numbers and booleans as they are and scrubs the text of
// anything else.
func (h *hostLogger) value(v any) any {
	switch v := v.(type) {
	case bool, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64:
		return v
	case error:
		return h.sc.scrub(v.Error())
	}
	return h.sc.scrub(fmt.Sprint(v))
}

func (h *hostLogger) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hostLogger) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hostLogger) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hostLogger) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hostLogger) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hostLogger) enabled(l hclog.Level) bool {
	return h.l.Enabled(context.Background(), slogLevel(l))
}

func (h *hostLogger) IsTrace() bool { return h.enabled(hclog.Trace) }
func (h *hostLogger) IsDebug() bool { return h.enabled(hclog.Debug) }
func (h *hostLogger) IsInfo() bool  { return h.enabled(hclog.Info) }
func (h *hostLogger) IsWarn() bool  { return h.enabled(hclog.Warn) }
func (h *hostLogger) IsError() bool { return h.enabled(hclog.Error) }

func (h *hostLogger) ImpliedArgs() []any { return h.implied }

func (h *hostLogger) With(args ...any) hclog.Logger {
	c := *h
	c.implied = append(append([]any{}, h.implied...), args...)
	return &c
}

func (h *hostLogger) Name() string { return h.name }

func (h *hostLogger) Named(name string) hclog.Logger {
	c := *h
	if c.name != "" {
		name = c.name + "." + name
	}
	c.name = name
	return &c
}

func (h *hostLogger) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	return &c
}

// SetLevel is ignored: the host's slog handler decides what it keeps.
func (h *hostLogger) SetLevel(hclog.Level) {}

// GetLevel is the lowest level the host's handler keeps; go-plugin skips
// parsing lines below it.
func (h *hostLogger) GetLevel() hclog.Level {
	for _, l := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if h.enabled(l) {
			return l
		}
	}
	return hclog.Off
}

func (h *hostLogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *hostLogger) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return &lineLogger{log: h.l, sc: h.sc, stream: "log"}
}

// lineLogger logs each line written to it: what a driver writes to its
// os.Stdout and os.Stderr after ServeBMC, which go-plugin streams to the
// host.
type lineLogger struct {
	log    *slog.Logger
	sc     *scrubber
	stream string

	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *lineLogger) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		i := bytes.IndexByte(w.buf.Bytes(), '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(string(w.buf.Next(i+1)), "\r\n")
		if line != "" {
			w.log.Info(w.sc.scrub(line), "stream", w.stream)
		}
	}
	return len(p), nil
}
