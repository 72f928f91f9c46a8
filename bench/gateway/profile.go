package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"time"
)

// startProfiles writes, into o.profileDir, the control plane's heap profile
// (after a GC, with every session up) and its goroutines, then starts CPU
// profiles of both processes for the dispatch phase. The returned func
// stops the harness's profile and waits for the control plane's.
func startProfiles(o options) (func(), error) {
	if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
		return nil, err
	}
	for name, path := range map[string]string{
		"gateway-heap.pprof":      "/debug/pprof/heap?gc=1",
		"gateway-heap.txt":        "/debug/pprof/heap?debug=1",
		"gateway-goroutines.txt":  "/debug/pprof/goroutine?debug=1",
		"gateway-goroutine.pprof": "/debug/pprof/goroutine",
	} {
		if err := fetch(path, filepath.Join(o.profileDir, name), time.Minute); err != nil {
			return nil, err
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		path := fmt.Sprintf("/debug/pprof/profile?seconds=%d", o.cpuSeconds)
		if err := fetch(path, filepath.Join(o.profileDir, "gateway-cpu.pprof"), time.Duration(o.cpuSeconds)*time.Second+time.Minute); err != nil {
			logf("gateway CPU profile: %v", err)
		}
	})
	stop, err := startCPUProfile(filepath.Join(o.profileDir, "harness-cpu.pprof"))
	if err != nil {
		return nil, err
	}
	return func() {
		stop()
		wg.Wait()
		logf("profiles in %s", o.profileDir)
	}, nil
}

// startCPUProfile profiles the harness into file until the returned func
// is called.
func startCPUProfile(file string) (func(), error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

func fetch(path, file string, timeout time.Duration) error {
	c := http.Client{Timeout: timeout}
	res, err := c.Get("http://" + pprofAddr + path)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", path, err)
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch %s: %s", path, res.Status)
	}
	out, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, res.Body); err != nil {
		_ = out.Close()
		return fmt.Errorf("fetch %s: %w", path, err)
	}
	return out.Close()
}

// snapshotGoroutines writes the control plane's goroutines every 4 s
// (gateway-reconnect-goroutines-NNs.txt, seconds since start) until the
// returned func is called: where sessions wait during the reconnect, which
// a CPU profile cannot show.
func snapshotGoroutines(dir string, start time.Time) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(4 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				name := fmt.Sprintf("gateway-reconnect-goroutines-%02.0fs.txt", time.Since(start).Seconds())
				if err := fetch("/debug/pprof/goroutine?debug=1", filepath.Join(dir, name), 10*time.Second); err != nil {
					logf("goroutines: %v", err)
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
