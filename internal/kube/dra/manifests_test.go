package dra_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/better-compute/better-compute/internal/kube/dra"
	"github.com/better-compute/better-compute/internal/kubebind"
)

// decodeManifest decodes every document of a manifest strictly (an
// unknown or misspelt field is an error) into typed objects.
func decodeManifest(t *testing.T, path string) []runtime.Object {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	codec := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		json.SerializerOptions{Yaml: true, Strict: true})
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := codec.Decode(doc, nil, nil)
		require.NoError(t, err, "%s", path)
		out = append(out, obj)
	}
}

// selects compiles a CEL device selector as the scheduler does and
// evaluates it on a device of driver gpu.bcd.dev.
func selects(t *testing.T, expr string, driver string, d resourceapi.Device) bool {
	t.Helper()
	c := cel.GetCompiler(cel.Features{}).CompileCELExpression(expr, cel.Options{})
	require.Nil(t, c.Error, "compile %q", expr)
	ok, _, err := c.DeviceMatches(context.Background(), cel.Device{Driver: driver, Attributes: d.Attributes, Capacity: d.Capacity})
	require.NoError(t, err, "evaluate %q", expr)
	return ok
}

// The manifests decode into typed objects, and their selectors pick the
// devices the driver really publishes.
func TestManifests(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..", "..", "deploy", "kubernetes", "bcd")

	objs := decodeManifest(t, filepath.Join(root, "deviceclass.yaml"))
	require.Len(t, objs, 1)
	class, ok := objs[0].(*resourceapi.DeviceClass)
	require.True(t, ok, "got %T", objs[0])
	require.Equal(t, dra.DriverName, class.Name)

	objs = decodeManifest(t, filepath.Join(root, "examples", "dra-pod.yaml"))
	require.Len(t, objs, 2)
	tmpl, ok := objs[0].(*resourceapi.ResourceClaimTemplate)
	require.True(t, ok, "got %T", objs[0])
	pod, ok := objs[1].(*corev1.Pod)
	require.True(t, ok, "got %T", objs[1])
	req := tmpl.Spec.Spec.Devices.Requests[0]
	require.Equal(t, class.Name, req.Exactly.DeviceClassName)
	require.Equal(t, tmpl.Name, *pod.Spec.ResourceClaims[0].ResourceClaimTemplateName)
	require.Equal(t, pod.Spec.ResourceClaims[0].Name, pod.Spec.Containers[0].Resources.Claims[0].Name)

	f := setup(t)
	mig := kubebind.Device{UUID: "MIG-cccc", Paths: []string{"/dev/nvidia2"}, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 9856, MIGProfile: "1g.10gb", Healthy: true}
	small := kubebind.Device{UUID: "GPU-dddd", Paths: []string{"/dev/nvidia3"}, Model: "NVIDIA L4", MemoryMiB: 23034, Healthy: true}
	require.NoError(t, f.set.Offer("res-1", []kubebind.Device{gpu("GPU-aaaa", 0), mig, small}))
	devs := f.waitSlice(t, "three devices", func(d map[string]resourceapi.Device) bool { return len(d) == 3 })

	tests := []struct {
		uuid        string
		class, tmpl bool
	}{
		{"GPU-aaaa", true, true},
		{"MIG-cccc", true, false}, // a MIG instance
		{"GPU-dddd", true, false}, // too little memory
	}
	for _, tt := range tests {
		for _, s := range class.Spec.Selectors {
			require.Equal(t, tt.class, selects(t, s.CEL.Expression, dra.DriverName, devs[tt.uuid]), "class on %s", tt.uuid)
			require.False(t, selects(t, s.CEL.Expression, "gpu.nvidia.com", devs[tt.uuid]), "class on another driver's device")
		}
		for _, s := range req.Exactly.Selectors {
			require.Equal(t, tt.tmpl, selects(t, s.CEL.Expression, dra.DriverName, devs[tt.uuid]), "template on %s", tt.uuid)
		}
	}
}
