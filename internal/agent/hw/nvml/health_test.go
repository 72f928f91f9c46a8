//go:build cgo

package nvml_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/stretchr/testify/require"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw/nvml"
	"github.com/better-compute/better-compute/internal/gpuhealth"
)

// A mock without the health calls makes no finding and no error; each
// reading that says something makes its finding; a lost GPU keeps the
// UUID an earlier poll read; idle and power-cap clock reasons and a lower
// link width at the maximum are no findings.
func TestReadFindings(t *testing.T) {
	t.Parallel()
	srv := dgxh100.New()
	require.Equal(t, gonvml.SUCCESS, srv.Init())
	var st nvml.FindingState
	got, err := nvml.ReadFindings(context.Background(), srv, &st)
	require.NoError(t, err)
	require.Empty(t, got, "the plain mock supports none of the readings")

	d0, d1, d2 := srv.Devices[0].(*server.Device), srv.Devices[1].(*server.Device), srv.Devices[2].(*server.Device)
	d0.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 1, true, false, gonvml.SUCCESS }
	d0.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) {
		return gonvml.ClocksEventReasonGpuIdle | gonvml.ClocksEventReasonSwPowerCap, gonvml.SUCCESS
	}
	d0.GetCurrPcieLinkWidthFunc = func() (int, gonvml.Return) { return 16, gonvml.SUCCESS }
	d0.GetMaxPcieLinkWidthFunc = func() (int, gonvml.Return) { return 16, gonvml.SUCCESS }
	d1.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) {
		return gonvml.ClocksEventReasonGpuIdle | gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown, gonvml.SUCCESS
	}
	d1.GetTotalEccErrorsFunc = func(gonvml.MemoryErrorType, gonvml.EccCounterType) (uint64, gonvml.Return) {
		return 0, gonvml.ERROR_NOT_SUPPORTED
	}
	d1.GetRetiredPagesFunc = func(c gonvml.PageRetirementCause) ([]uint64, gonvml.Return) {
		return make([]uint64, 30), gonvml.SUCCESS // 30 per cause: 60 in all
	}
	uuid2 := d2.UUID
	d2.GetUUIDFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_GPU_IS_LOST }

	got, err = nvml.ReadFindings(context.Background(), srv, &st)
	require.NoError(t, err)
	type f struct {
		kind     string
		gpu      int32
		code     int64
		severity string
	}
	var have []f
	for _, e := range got {
		require.NotNil(t, e.GpuIndex)
		require.NotEmpty(t, e.GetMessage())
		have = append(have, f{e.GetKind(), e.GetGpuIndex(), e.GetCode(), e.GetSeverity()})
		if e.GetGpuIndex() == 2 {
			require.Equal(t, uuid2, e.GetDevice(), "the lost GPU keeps the UUID of the first poll")
		}
	}
	require.Equal(t, []f{
		{gpuhealth.KindRowRemapPending, 0, 0, gpuhealth.SeverityError},
		{gpuhealth.KindRetiredPages, 1, 60, gpuhealth.SeverityError},
		{gpuhealth.KindThrottle, 1, gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown, gpuhealth.SeverityWarning},
		{gpuhealth.KindLost, 2, 0, gpuhealth.SeverityCritical},
	}, have)
}

// XIDs raised on a watched GPU come out with its UUID, index and the
// compute process running on it; a GPU that refuses registration is not
// watched and the watch ends with its context.
func TestWatchXIDs(t *testing.T) {
	t.Parallel()
	srv := dgxh100.New()
	require.Equal(t, gonvml.SUCCESS, srv.Init())
	ch := make(chan gonvml.EventData, 4)
	set := &mock.EventSet{
		WaitFunc: func(ms uint32) (gonvml.EventData, gonvml.Return) {
			select {
			case d := <-ch:
				return d, gonvml.SUCCESS
			case <-time.After(time.Duration(ms) * time.Millisecond):
				return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() gonvml.Return { return gonvml.SUCCESS },
	}
	srv.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return set, gonvml.SUCCESS }
	for i, d := range srv.Devices {
		sd := d.(*server.Device)
		sd.RegisterEventsFunc = func(uint64, gonvml.EventSet) gonvml.Return {
			if i == 1 {
				return gonvml.ERROR_NOT_SUPPORTED
			}
			return gonvml.SUCCESS
		}
	}
	d3 := srv.Devices[3].(*server.Device)
	d3.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		return []gonvml.ProcessInfo{{Pid: uint32(os.Getpid())}}, gonvml.SUCCESS
	}
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var got []*agentv1.HealthEvent
	done := make(chan error, 1)
	go func() {
		done <- nvml.WatchXIDs(ctx, srv, func(ev *agentv1.HealthEvent) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, ev)
			if len(got) == 2 {
				cancel()
			}
		})
	}()
	ch <- gonvml.EventData{Device: d3, EventType: gonvml.EventTypeXidCriticalError, EventData: 79}
	ch <- gonvml.EventData{Device: srv.Devices[0], EventType: gonvml.EventTypeXidCriticalError, EventData: 13}
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not end")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 2)
	require.Equal(t, gpuhealth.KindXID, got[0].GetKind())
	require.Equal(t, d3.UUID, got[0].GetDevice())
	require.EqualValues(t, 79, got[0].GetCode())
	require.EqualValues(t, 3, got[0].GetGpuIndex())
	require.EqualValues(t, os.Getpid(), got[0].GetPid())
	require.NotEmpty(t, got[0].GetProcessName(), "/proc/<pid>/comm of this test")
	require.NotNil(t, got[0].GetTime())
	require.Zero(t, got[1].GetPid(), "no process runs on GPU 0")
}

// On a machine with an NVIDIA GPU (BC_TEST_NVML=1), the health reading
// and a one-second XID watch run without error, and a healthy GPU has no
// critical finding.
func TestHealthOnRealGPU(t *testing.T) {
	if os.Getenv("BC_TEST_NVML") == "" {
		t.Skip("set BC_TEST_NVML=1 on a machine with an NVIDIA GPU and driver")
	}
	b, err := nvml.New()
	if errors.Is(err, nvml.ErrUnavailable) {
		t.Fatalf("BC_TEST_NVML is set but NVML is unavailable: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	for poll := range 2 { // the second poll compares NVLinks with the first
		got, err := b.Findings(context.Background())
		require.NoError(t, err)
		for _, f := range got {
			t.Logf("poll %d: gpu %d %s: %s %d (%s) %s", poll, f.GetGpuIndex(), f.GetDevice(), f.GetKind(), f.GetCode(), f.GetSeverity(), f.GetMessage())
			require.NotEqual(t, gpuhealth.SeverityCritical, f.GetSeverity(), "a healthy GPU: %v", f)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = b.WatchXIDs(ctx, func(ev *agentv1.HealthEvent) { t.Logf("xid: %v", ev) })
	require.NoError(t, err)
}
