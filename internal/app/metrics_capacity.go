package app

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// registerMetrics registers the scrape-time database collector and the
// placer's observations on the app's registry. It runs once the capacity
// runner is built.
func (a *App) registerMetrics() {
	placement := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "bc_placement_duration_seconds",
		Help:    "From a mutation's submission to its pool's placer on this replica to its answer (queue wait and batch commit), by outcome (ok, error).",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"outcome"})
	batchSize := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "bc_placer_batch_size", Help: "Mutations committed by one placer transaction.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 9), // 1 to 256, MaxBatch
	})
	batchHold := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "bc_placer_batch_duration_seconds", Help: "How long one placer transaction held the writer, BEGIN to COMMIT.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	})
	a.Registry.MustRegister(placement, batchSize, batchHold, newDBCollector(a.DB, a.cfg.Clock, a.cfg.Logger))
	if a.Capacity == nil {
		return
	}
	e := a.Capacity.Engine
	e.ObserveSubmits(func(wait time.Duration, err error) {
		outcome := "ok"
		if err != nil {
			outcome = "error"
		}
		placement.WithLabelValues(outcome).Observe(wait.Seconds())
	})
	e.ObserveBatches(func(size int, hold time.Duration) {
		batchSize.Observe(float64(size))
		batchHold.Observe(hold.Seconds())
	})
}
