package gateway

import (
	"context"
	"log/slog"
)

// sessionLog logs a session's lines with its rpc, peer and node attributes
// added at each call. A logger made with With would keep a clone of the
// handler and its preformatted attributes for every open session, about a
// KiB each, for lines that come only at a session's start and end.
type sessionLog struct {
	l    *slog.Logger
	peer string
	node string
}

func (l sessionLog) log(level slog.Level, msg string, args []any) {
	ctx := context.Background()
	if !l.l.Enabled(ctx, level) {
		return
	}
	attrs := make([]any, 0, 6+len(args))
	attrs = append(attrs, "rpc", "Session", "peer", l.peer)
	if l.node != "" {
		attrs = append(attrs, "node", l.node)
	}
	l.l.Log(ctx, level, msg, append(attrs, args...)...)
}

func (l sessionLog) Debug(msg string, args ...any) { l.log(slog.LevelDebug, msg, args) }
func (l sessionLog) Info(msg string, args ...any)  { l.log(slog.LevelInfo, msg, args) }
func (l sessionLog) Warn(msg string, args ...any)  { l.log(slog.LevelWarn, msg, args) }
func (l sessionLog) Error(msg string, args ...any) { l.log(slog.LevelError, msg, args) }
