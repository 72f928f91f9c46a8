package app

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/tracing"
)

// buildTracing opens the tracer provider: OTLP when an endpoint is
// configured, the no-op provider when not. It does not dial: a collector
// that is down delays no start and fails no request.
func (a *App) buildTracing(ctx context.Context) error {
	cfg := a.cfg.Tracing
	cfg.ServiceName = cmp.Or(cfg.ServiceName, "better-compute")
	p, err := tracing.New(ctx, cfg)
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	a.Tracing = p
	if p.Enabled() {
		a.cfg.Logger.Info("exporting traces over OTLP", "endpoint", cmp.Or(cfg.Endpoint, "from OTEL_EXPORTER_OTLP_* variables"))
	}
	return nil
}

// stopTracing exports what spans are left, bounded so that an unreachable
// collector cannot hold up a shutdown.
func (a *App) stopTracing() {
	if a.Tracing == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Tracing.Shutdown(ctx); err != nil {
		a.cfg.Logger.Warn("spans were lost at shutdown", "err", err)
	}
}
