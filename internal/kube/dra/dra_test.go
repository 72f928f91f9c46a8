package dra_test

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/better-compute/better-compute/bctest/kubeletdra"
	"github.com/better-compute/better-compute/internal/kube/dra"
	"github.com/better-compute/better-compute/internal/kubebind"
)

const node = "gpu-node-1"

type fixture struct {
	ctx     context.Context
	set     *kubebind.Set
	client  *fake.Clientset
	kubelet *kubeletdra.Kubelet
	driver  *dra.Driver
	plugin  *kubeletdra.Plugin
	cdiDir  string
}

// testContext ends shortly before the test binary's deadline, so a wait
// that never ends fails with its own message: the event decides, not a
// guess at how long it takes.
func testContext(t *testing.T) context.Context {
	ctx := t.Context()
	if dl, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-5*time.Second))
		t.Cleanup(cancel)
	}
	return ctx
}

func setup(t *testing.T) *fixture {
	t.Helper()
	// Short: a unix socket path has at most 108 bytes.
	dir, err := os.MkdirTemp("", "dra")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fixture{
		ctx:    testContext(t),
		set:    kubebind.New(),
		client: kubeletdra.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}),
		cdiDir: filepath.Join(dir, "cdi"),
	}
	f.kubelet, err = kubeletdra.Start(f.ctx, filepath.Join(dir, "registry"))
	require.NoError(t, err)
	t.Cleanup(f.kubelet.Close)
	f.driver, err = dra.Start(f.ctx, dra.Config{
		Set: f.set, NodeName: node, Client: f.client,
		PluginDir: filepath.Join(dir, "plugin"), RegistrarDir: filepath.Join(dir, "registry"), CDIDir: f.cdiDir,
	})
	require.NoError(t, err)
	t.Cleanup(f.driver.Stop)
	f.plugin, err = f.kubelet.Plugin(f.ctx, dra.DriverName)
	require.NoError(t, err)
	return f
}

func gpu(uuid string, index int) kubebind.Device {
	return kubebind.Device{
		UUID: uuid, Paths: []string{"/dev/nvidia" + string(rune('0'+index))},
		Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, NVLinkIsland: "island-0", Healthy: true,
	}
}

// waitSlice waits until the node's ResourceSlice is published and its
// devices satisfy cond, and returns them by uuid attribute.
func (f *fixture) waitSlice(t *testing.T, what string, cond func(map[string]resourceapi.Device) bool) map[string]resourceapi.Device {
	t.Helper()
	slices := f.client.ResourceV1().ResourceSlices()
	w, err := slices.Watch(f.ctx, metav1.ListOptions{})
	require.NoError(t, err)
	defer w.Stop()
	for {
		list, err := slices.List(f.ctx, metav1.ListOptions{})
		require.NoError(t, err)
		devs := map[string]resourceapi.Device{}
		published := false
		for _, s := range list.Items {
			if s.Spec.Driver != dra.DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != node {
				continue
			}
			published = true
			for _, d := range s.Spec.Devices {
				devs[*d.Attributes[dra.AttrUUID].StringValue] = d
			}
		}
		if published && cond(devs) {
			return devs
		}
		select {
		case <-w.ResultChan():
		case <-f.ctx.Done():
			t.Fatalf("gave up waiting for the ResourceSlice to show %s; it has %v", what, devs)
		}
	}
}

// claim creates a ResourceClaim allocated the named devices of this
// node's pool, as the scheduler leaves it.
func (f *fixture) claim(t *testing.T, name string, devices ...string) *resourceapi.ResourceClaim {
	t.Helper()
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "gpu", Driver: dra.DriverName, Pool: node, Device: d,
		})
	}
	c, err := f.client.ResourceV1().ResourceClaims("default").Create(f.ctx, c, metav1.CreateOptions{})
	require.NoError(t, err)
	return c
}

func TestRegistration(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// The driver records the kubelet's verdict before answering it, and
	// the test kubelet publishes a plugin only after the answer.
	require.True(t, f.set.Registered())
	require.Contains(t, f.plugin.Services, drapb.DRAPluginService)
	require.Contains(t, f.plugin.Services, drahealthv1.DRAResourceHealthService)
	require.Empty(t, f.kubelet.Refused())

	f.driver.Stop()
	require.NoError(t, f.kubelet.Gone(f.ctx, dra.DriverName))
	require.False(t, f.set.Registered())
	f.driver.Stop() // twice is fine
}

func TestSlicesFollowTheOffer(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// An empty pool is published too: the driver runs, nothing is offered.
	f.waitSlice(t, "an empty pool", func(d map[string]resourceapi.Device) bool { return len(d) == 0 })
	list, err := f.client.ResourceV1().ResourceSlices().List(f.ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, list.Items, 1)
	require.Equal(t, node, list.Items[0].Spec.Pool.Name)

	require.NoError(t, f.set.Offer("res-1", []kubebind.Device{gpu("GPU-aaaa", 0), gpu("GPU-bbbb", 1)}))
	devs := f.waitSlice(t, "res-1's two GPUs", func(d map[string]resourceapi.Device) bool { return len(d) == 2 })
	got := devs["GPU-aaaa"]
	require.Equal(t, "gpu-aaaa", got.Name)
	require.Equal(t, "NVIDIA H100 80GB HBM3", *got.Attributes[dra.AttrModel].StringValue)
	require.Equal(t, "island-0", *got.Attributes[dra.AttrNVLinkIsland].StringValue)
	require.Equal(t, "res-1", *got.Attributes[dra.AttrReservation].StringValue)
	require.False(t, *got.Attributes[dra.AttrMIG].BoolValue)
	require.NotContains(t, got.Attributes, resourceapi.QualifiedName(dra.AttrMIGProfile))
	mem := got.Capacity[dra.CapMemory].Value
	require.Equal(t, int64(81559)<<20, mem.Value())

	mig := kubebind.Device{UUID: "MIG-cccc", Paths: []string{"/dev/nvidia2"}, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 9856, MIGProfile: "1g.10gb", Healthy: true}
	require.NoError(t, f.set.Offer("res-2", []kubebind.Device{mig}))
	devs = f.waitSlice(t, "res-2's MIG instance", func(d map[string]resourceapi.Device) bool { return len(d) == 3 })
	require.Equal(t, "1g.10gb", *devs["MIG-cccc"].Attributes[dra.AttrMIGProfile].StringValue)
	require.True(t, *devs["MIG-cccc"].Attributes[dra.AttrMIG].BoolValue)

	// A quarantined GPU leaves the slice; healed, it comes back.
	f.set.SetHealth("GPU-bbbb", false)
	f.waitSlice(t, "GPU-bbbb quarantined away", func(d map[string]resourceapi.Device) bool {
		_, ok := d["GPU-bbbb"]
		return !ok && len(d) == 2
	})
	f.set.SetHealth("GPU-bbbb", true)
	f.waitSlice(t, "GPU-bbbb back", func(d map[string]resourceapi.Device) bool { return len(d) == 3 })

	<-f.set.Withdraw("res-1")
	f.waitSlice(t, "res-1 withdrawn", func(d map[string]resourceapi.Device) bool {
		_, ok := d["MIG-cccc"]
		return ok && len(d) == 1
	})
}

func TestPrepare(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.NoError(t, f.set.Offer("res-1", []kubebind.Device{gpu("GPU-aaaa", 0), gpu("GPU-bbbb", 1), gpu("GPU-cccc", 2)}))
	devs := f.waitSlice(t, "three GPUs", func(d map[string]resourceapi.Device) bool { return len(d) == 3 })
	c := f.claim(t, "train", devs["GPU-aaaa"].Name, devs["GPU-bbbb"].Name)

	resp, err := f.plugin.Prepare(f.ctx, c)
	require.NoError(t, err)
	got := resp[string(c.UID)]
	require.Empty(t, got.Error)
	require.Len(t, got.Devices, 2)
	cdiID := "bcd.dev/gpu=" + string(c.UID)
	// The claim's one CDI device is named once for its request.
	require.Equal(t, []string{cdiID}, got.Devices[0].CdiDeviceIds)
	require.Empty(t, got.Devices[1].CdiDeviceIds)
	require.Equal(t, node, got.Devices[0].PoolName)
	require.Equal(t, "gpu-aaaa", got.Devices[0].DeviceName)
	require.Equal(t, []string{"gpu"}, got.Devices[0].RequestNames)
	require.Equal(t, []string{"GPU-aaaa", "GPU-bbbb"}, f.set.Holders()["claim/"+string(c.UID)])

	var spec struct {
		CDIVersion string `json:"cdiVersion"`
		Kind       string `json:"kind"`
		Devices    []struct {
			Name           string            `json:"name"`
			Annotations    map[string]string `json:"annotations"`
			ContainerEdits struct {
				Env         []string `json:"env"`
				DeviceNodes []struct {
					Path string `json:"path"`
				} `json:"deviceNodes"`
			} `json:"containerEdits"`
		} `json:"devices"`
	}
	path := filepath.Join(f.cdiDir, "bcd.dev-gpu_"+string(c.UID)+".json")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &spec))
	require.Equal(t, "bcd.dev/gpu", spec.Kind)
	require.Len(t, spec.Devices, 1)
	d := spec.Devices[0]
	require.Equal(t, string(c.UID), d.Name)
	require.Equal(t, "res-1", d.Annotations[dra.AnnotationReservation])
	require.Equal(t, []string{"NVIDIA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb", "CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb"}, d.ContainerEdits.Env)
	require.Len(t, d.ContainerEdits.DeviceNodes, 2)
	require.Equal(t, "/dev/nvidia0", d.ContainerEdits.DeviceNodes[0].Path)

	// The kubelet retries: the same answer, even once the GPU was
	// quarantined under the running pod.
	f.set.SetHealth("GPU-aaaa", false)
	again, err := f.plugin.Prepare(f.ctx, c)
	require.NoError(t, err)
	require.Empty(t, again[string(c.UID)].Error)
	require.Equal(t, got.Devices[0].CdiDeviceIds, again[string(c.UID)].Devices[0].CdiDeviceIds)
	require.Equal(t, []string{"GPU-aaaa", "GPU-bbbb"}, f.set.Holders()["claim/"+string(c.UID)])
}

func TestPrepareRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.NoError(t, f.set.Offer("res-1", []kubebind.Device{gpu("GPU-aaaa", 0), gpu("GPU-bbbb", 1), gpu("GPU-cccc", 2), gpu("GPU-dddd", 3)}))
	devs := f.waitSlice(t, "four GPUs", func(d map[string]resourceapi.Device) bool { return len(d) == 4 })
	first := f.claim(t, "first", devs["GPU-cccc"].Name)
	resp, err := f.plugin.Prepare(f.ctx, first)
	require.NoError(t, err)
	require.Empty(t, resp[string(first.UID)].Error)

	f.set.SetHealth("GPU-bbbb", false)
	// A pod given GPU-dddd by the device plugin, as PodResources lists it.
	f.set.SetHolders("pod/", map[string][]string{"uid-p": {"GPU-dddd"}})
	ok := f.claim(t, "ok", devs["GPU-aaaa"].Name)
	tests := []struct {
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{f.claim(t, "not-offered", "gpu-zzzz"), "device gpu-zzzz is not offered by bcd on node " + node},
		{f.claim(t, "unhealthy", devs["GPU-bbbb"].Name), "device GPU-bbbb is unhealthy"},
		{f.claim(t, "taken", devs["GPU-cccc"].Name), "device gpu-cccc is held by claim/uid-first already"},
		{f.claim(t, "device-plugin", devs["GPU-dddd"].Name), "device gpu-dddd is held by pod/uid-p already"},
	}
	claims := []*resourceapi.ResourceClaim{ok}
	for _, tt := range tests {
		claims = append(claims, tt.claim)
	}
	// One call, as for a pod with several claims: each is judged alone.
	resp, err = f.plugin.Prepare(f.ctx, claims...)
	require.NoError(t, err)
	require.Empty(t, resp[string(ok.UID)].Error)
	for _, tt := range tests {
		got := resp[string(tt.claim.UID)]
		require.Contains(t, got.Error, "claim default/"+tt.claim.Name+": ")
		require.Contains(t, got.Error, tt.want)
		require.NotContains(t, f.set.Holders(), "claim/"+string(tt.claim.UID))
		require.NoFileExists(t, filepath.Join(f.cdiDir, "bcd.dev-gpu_"+string(tt.claim.UID)+".json"))
	}
}

func TestUnprepareLetsGo(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.NoError(t, f.set.Offer("res-1", []kubebind.Device{gpu("GPU-aaaa", 0)}))
	devs := f.waitSlice(t, "one GPU", func(d map[string]resourceapi.Device) bool { return len(d) == 1 })
	c := f.claim(t, "train", devs["GPU-aaaa"].Name)
	resp, err := f.plugin.Prepare(f.ctx, c)
	require.NoError(t, err)
	require.Empty(t, resp[string(c.UID)].Error)

	released := f.set.Withdraw("res-1")
	select {
	case <-released:
		t.Fatal("the release completed while the claim holds the GPU")
	default:
	}
	// The claim may be gone from the API by now; unprepare needs only
	// its reference.
	require.NoError(t, f.client.ResourceV1().ResourceClaims("default").Delete(f.ctx, c.Name, metav1.DeleteOptions{}))
	for range 2 { // the kubelet retries
		un, err := f.plugin.Unprepare(f.ctx, c)
		require.NoError(t, err)
		require.Empty(t, un[string(c.UID)].Error)
	}
	select {
	case <-released:
	case <-f.ctx.Done():
		t.Fatal("gave up waiting for the release to complete after unprepare")
	}
	require.NoFileExists(t, filepath.Join(f.cdiDir, "bcd.dev-gpu_"+string(c.UID)+".json"))
	require.Empty(t, f.set.Holders())
}

func TestHealthReports(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.NoError(t, f.set.Offer("res-1", []kubebind.Device{gpu("GPU-aaaa", 0), gpu("GPU-bbbb", 1)}))
	stream, err := f.plugin.WatchHealth(f.ctx)
	require.NoError(t, err)
	health := func() map[string]drahealthv1.HealthStatus {
		resp, err := stream.Recv()
		require.NoError(t, err)
		out := map[string]drahealthv1.HealthStatus{}
		for _, d := range resp.Devices {
			require.Equal(t, node, d.Device.PoolName)
			out[d.Device.DeviceName] = d.Health
		}
		return out
	}
	want := map[string]drahealthv1.HealthStatus{"gpu-aaaa": drahealthv1.HealthStatus_HEALTHY, "gpu-bbbb": drahealthv1.HealthStatus_UNHEALTHY}
	// The first report may predate the offer; each change sends another.
	for got := health(); !maps.Equal(got, map[string]drahealthv1.HealthStatus{"gpu-aaaa": drahealthv1.HealthStatus_HEALTHY, "gpu-bbbb": drahealthv1.HealthStatus_HEALTHY}); got = health() {
	}
	f.set.SetHealth("GPU-bbbb", false)
	for got := health(); !maps.Equal(got, want); got = health() {
	}
}

// A bcd restarted under a running pod holds the claim's GPUs again once
// they are offered: the kubelet does not prepare it a second time, and
// the release must still wait for the unprepare.
func TestRestartAdoptsPreparedClaims(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.NoError(t, f.set.Offer("res-1", []kubebind.Device{gpu("GPU-aaaa", 0)}))
	devs := f.waitSlice(t, "one GPU", func(d map[string]resourceapi.Device) bool { return len(d) == 1 })
	c := f.claim(t, "train", devs["GPU-aaaa"].Name)
	resp, err := f.plugin.Prepare(f.ctx, c)
	require.NoError(t, err)
	require.Empty(t, resp[string(c.UID)].Error)
	f.driver.Stop()
	require.NoError(t, f.kubelet.Gone(f.ctx, dra.DriverName))

	// The new bcd starts with an empty offer; the agent binds again.
	f.set = kubebind.New()
	f.driver, err = dra.Start(f.ctx, dra.Config{
		Set: f.set, NodeName: node, Client: f.client,
		PluginDir: filepath.Join(filepath.Dir(f.cdiDir), "plugin"), RegistrarDir: filepath.Join(filepath.Dir(f.cdiDir), "registry"), CDIDir: f.cdiDir,
	})
	require.NoError(t, err)
	t.Cleanup(f.driver.Stop)
	f.plugin, err = f.kubelet.Plugin(f.ctx, dra.DriverName)
	require.NoError(t, err)
	// With a second GPU, so the slice the old driver left changes.
	require.NoError(t, f.set.Offer("res-1", []kubebind.Device{gpu("GPU-aaaa", 0), gpu("GPU-bbbb", 1)}))
	// The driver adopts before it publishes the offer it adopted from.
	f.waitSlice(t, "the new offer", func(d map[string]resourceapi.Device) bool {
		_, ok := d["GPU-bbbb"]
		return ok
	})
	require.Equal(t, []string{"GPU-aaaa"}, f.set.Holders()["claim/"+string(c.UID)])

	released := f.set.Withdraw("res-1")
	select {
	case <-released:
		t.Fatal("the release completed under the running pod")
	default:
	}
	un, err := f.plugin.Unprepare(f.ctx, c)
	require.NoError(t, err)
	require.Empty(t, un[string(c.UID)].Error)
	select {
	case <-released:
	case <-f.ctx.Done():
		t.Fatal("gave up waiting for the release to complete after unprepare")
	}
}
