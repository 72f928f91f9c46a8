package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/placer"
)

// Task is a long-running component: it runs until ctx is done and returns
// nil after a clean stop.
type Task func(ctx context.Context) error

// RunTasks runs every task until ctx is done or one fails; the first failure
// cancels the rest, and RunTasks returns it after all have stopped.
func RunTasks(ctx context.Context, tasks ...Task) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for _, t := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := t(ctx); err != nil && !errors.Is(err, context.Canceled) {
				once.Do(func() { firstErr = err })
			}
			cancel()
		}()
	}
	wg.Wait()
	return firstErr
}

// Listen opens the API listener; callers that need the port before Run
// (tests, `dev` printing its address) listen first.
func (a *App) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", a.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", a.cfg.Listen, err)
	}
	return ln, nil
}

// ListenGateway binds the gateway's address so callers learn it before Run
// (dev prints it; tests use 127.0.0.1:0).
func (a *App) ListenGateway() (net.Addr, error) { return a.Gateway.Listen() }

// ListenReplica opens the replica listener (Config.ReplicaListen) and
// returns its address, or nil where this replica takes no forwards: no
// address, no PKI (BETTER_COMPUTE_SECRET), or SQLite (one process places
// every pool).
func (a *App) ListenReplica() (net.Addr, error) {
	if a.replicaLn != nil {
		return a.replicaLn.Addr(), nil
	}
	if a.cfg.ReplicaListen == "" || a.Replica == nil || a.DB.PgxPool() == nil {
		return nil, nil
	}
	ln, err := net.Listen("tcp", a.cfg.ReplicaListen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", a.cfg.ReplicaListen, err)
	}
	a.replicaLn = ln
	return ln.Addr(), nil
}

// ServeReplica serves the API to other replicas on the replica listener
// until ctx is done: mutual TLS, and only a client with a replica
// certificate of the internal CA gets a request through (replica.Guard).
// The callers' own credentials are then checked as on the API listener.
func (a *App) ServeReplica(ctx context.Context) error {
	if _, err := a.ListenReplica(); err != nil {
		return err
	}
	if a.replicaLn == nil {
		return nil
	}
	// Peers find this replica by its gateway_replicas row while it serves
	// them; a replica that stops touching it is pruned by the others.
	kctx, stopKeep := context.WithCancel(ctx)
	var keep sync.WaitGroup
	keep.Go(func() { a.keepReplicaRow(kctx) })
	defer func() { stopKeep(); keep.Wait() }()
	ln := newLimitListener(a.replicaLn, a.cfg.MaxConnections, a.conns, a.cfg.Logger)
	srv := &http.Server{
		Handler:           a.ReplicaHandler(),
		TLSConfig:         a.Replica.ServerTLS(),
		ReadHeaderTimeout: a.cfg.ReadHeaderTimeout,
		IdleTimeout:       a.cfg.IdleTimeout,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	return a.serveUntilDone(ctx, "replica server", srv, func() error { return srv.ServeTLS(ln, "", "") })
}

// Run serves the configured roles until ctx is done, then shuts down
// cleanly: in-flight requests finish (bounded by ShutdownTimeout), jobs
// stop, and the caller closes the database.
func (a *App) Run(ctx context.Context, ln net.Listener) error {
	var tasks []Task
	if slices.Contains(a.cfg.Roles, RoleAPI) {
		if ln == nil {
			var err error
			if ln, err = a.Listen(); err != nil {
				return err
			}
		}
		tasks = append(tasks, func(ctx context.Context) error { return a.ServeAPI(ctx, ln) })
		// Only with a listener: a task that returns stops the others.
		addr, err := a.ListenReplica()
		if err != nil {
			_ = ln.Close()
			return err
		}
		if addr != nil {
			tasks = append(tasks, a.ServeReplica)
		}
	} else {
		if ln != nil {
			_ = ln.Close()
		}
		if a.replicaLn != nil {
			_ = a.replicaLn.Close()
		}
	}
	if slices.Contains(a.cfg.Roles, RoleGateway) {
		tasks = append(tasks, a.Gateway.Run)
	} else if a.PKI != nil {
		tasks = append(tasks, a.refreshPKI)
	}
	tasks = append(tasks, a.Jobs.Run, a.RunWebhooks)
	return RunTasks(ctx, tasks...)
}

// ServeAPI serves the API on ln until ctx is done, with every phase of a
// connection bounded: headers, unary bodies, idle keep-alive, and the number
// of open connections.
func (a *App) ServeAPI(ctx context.Context, ln net.Listener) error {
	ln = newLimitListener(ln, a.cfg.MaxConnections, a.conns, a.cfg.Logger)
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	// gRPC clients speak HTTP/2 without TLS to a plain-text listener.
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:           publicOnly(a.Handler),
		Protocols:         protocols,
		ReadHeaderTimeout: a.cfg.ReadHeaderTimeout,
		// No ReadTimeout or WriteTimeout: they would cut watch streams.
		// Bodies are bounded per request by bodyDeadline instead.
		IdleTimeout: a.cfg.IdleTimeout,
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	srv.RegisterOnShutdown(a.hub.Shutdown)
	return a.serveUntilDone(ctx, "api server", srv, func() error { return srv.Serve(ln) })
}

// serveUntilDone runs serve (srv's Serve or ServeTLS) until ctx is done,
// then shuts srv down within ShutdownTimeout, closing what is left after it:
// watch streams never finish on their own, so their contexts are cancelled
// when the grace period ends.
func (a *App) serveUntilDone(ctx context.Context, name string, srv *http.Server, serve func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- serve() }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s: %w", name, err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// publicOnly drops the mark of a forwarded request from what the API
// listener receives: only the replica listener, behind replica.Guard,
// carries requests forwarded by another replica.
func publicOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(placer.ForwardedHeader) != "" {
			r = r.Clone(r.Context())
			r.Header.Del(placer.ForwardedHeader)
		}
		next.ServeHTTP(w, r)
	})
}

// pkiRefreshInterval is how often a replica without the gateway role
// reloads the PKI (the gateway reloads it itself): a rotation step or a
// revocation made elsewhere reaches its command signer within it.
const pkiRefreshInterval = 30 * time.Second

// refreshPKI reloads the PKI every pkiRefreshInterval until ctx is done.
func (a *App) refreshPKI(ctx context.Context) error {
	t := time.NewTicker(pkiRefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := a.PKI.Refresh(ctx); err != nil && ctx.Err() == nil {
				a.cfg.Logger.Warn("refresh the PKI", "err", err)
			}
		}
	}
}
