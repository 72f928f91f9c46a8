package jobs

import (
	"context"
	"log/slog"
)

// quietHandler passes River's logs on with INFO demoted to DEBUG: River
// reports routine life (producer job counts every few seconds, maintenance
// runs, client start and stop) at INFO, which would drown an operator's log.
// Its warnings and errors keep their level.
type quietHandler struct{ next slog.Handler }

// quiet wraps l so River's INFO lines become DEBUG.
func quiet(l *slog.Logger) *slog.Logger { return slog.New(quietHandler{next: l.Handler()}) }

func demote(l slog.Level) slog.Level {
	if l == slog.LevelInfo {
		return slog.LevelDebug
	}
	return l
}

func (h quietHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, demote(l))
}

func (h quietHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Level = demote(r.Level)
	return h.next.Handle(ctx, r)
}

func (h quietHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return quietHandler{next: h.next.WithAttrs(attrs)}
}

func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{next: h.next.WithGroup(name)}
}
