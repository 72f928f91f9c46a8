package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

const manifestDir = "../../deploy/kubernetes/bcd"

// bcdManifests decodes every manifest of deploy/kubernetes/bcd (but the
// kustomization) into client-go's typed objects, strictly: a misspelt or
// misplaced field fails, as the API server would refuse it.
func bcdManifests(t *testing.T) map[string][]runtime.Object {
	t.Helper()
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	out := map[string][]runtime.Object{}
	for _, f := range files {
		name := filepath.Base(f)
		if name == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, name)
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			obj, _, err := dec.Decode(doc, nil, nil)
			require.NoError(t, err, name)
			out[name] = append(out[name], obj)
		}
	}
	return out
}

func only[T runtime.Object](t *testing.T, objs map[string][]runtime.Object) T {
	t.Helper()
	var found []T
	for _, list := range objs {
		for _, o := range list {
			if x, ok := o.(T); ok {
				found = append(found, x)
			}
		}
	}
	require.Len(t, found, 1, "want exactly one %T", *new(T))
	return found[0]
}

// TestBcdManifests checks the security-relevant fields of bcd's DaemonSet
// and RBAC, and that the pieces name each other: the DaemonSet's flags are
// bcd's, its ConfigMap keys exist, its service account is the one bound.
func TestBcdManifests(t *testing.T) {
	t.Parallel()
	objs := bcdManifests(t)
	ns := only[*corev1.Namespace](t, objs)
	ds := only[*appsv1.DaemonSet](t, objs)
	cm := only[*corev1.ConfigMap](t, objs)
	sa := only[*corev1.ServiceAccount](t, objs)
	role := only[*rbacv1.ClusterRole](t, objs)
	binding := only[*rbacv1.ClusterRoleBinding](t, objs)
	policy := only[*admissionv1.ValidatingAdmissionPolicy](t, objs)
	policyBinding := only[*admissionv1.ValidatingAdmissionPolicyBinding](t, objs)
	secret := only[*corev1.Secret](t, objs)

	for name, list := range objs {
		for _, o := range list {
			m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
			require.NoError(t, err)
			meta, _ := m["metadata"].(map[string]any)
			if n, ok := meta["namespace"]; ok {
				require.Equal(t, ns.Name, n, "%s: every namespaced object is in bcd's namespace", name)
			}
		}
	}

	t.Run("daemonset", func(t *testing.T) {
		spec := ds.Spec.Template.Spec
		require.False(t, spec.HostPID, "bcd reads pods' devices from PodResources, not /proc")
		require.False(t, spec.HostNetwork)
		require.False(t, spec.HostIPC)
		require.Equal(t, sa.Name, spec.ServiceAccountName)
		require.Len(t, spec.Containers, 1)
		c := spec.Containers[0]
		sc := c.SecurityContext
		require.NotNil(t, sc)
		require.NotNil(t, sc.Privileged)
		require.False(t, *sc.Privileged, "bcd runs unprivileged: the NVIDIA runtime gives it the GPUs")
		require.NotNil(t, sc.AllowPrivilegeEscalation)
		require.False(t, *sc.AllowPrivilegeEscalation)
		require.NotNil(t, sc.ReadOnlyRootFilesystem)
		require.True(t, *sc.ReadOnlyRootFilesystem)
		require.NotNil(t, sc.Capabilities)
		require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
		require.Empty(t, sc.Capabilities.Add)
		require.NotNil(t, spec.SecurityContext.SeccompProfile)
		require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, spec.SecurityContext.SeccompProfile.Type)

		// Host paths: read-write exactly where bcd writes; nothing
		// broader than it needs (no /, /dev, whole cgroup tree, whole
		// kubelet directory).
		writable := map[string]bool{
			"/var/run/cdi":                      true,
			"/var/lib/bcd":                      true,
			"/sys/fs/cgroup/bettercompute":      true,
			"/var/lib/kubelet/device-plugins":   true,
			"/var/lib/kubelet/plugins":          true,
			"/var/lib/kubelet/plugins_registry": true,
		}
		readOnly := map[string]bool{"/var/lib/kubelet/pod-resources": true, "/var/lib/kubelet/pki": true}
		hostPaths := map[string]string{}
		for _, v := range spec.Volumes {
			if v.HostPath != nil {
				hostPaths[v.Name] = v.HostPath.Path
				require.True(t, writable[v.HostPath.Path] || readOnly[v.HostPath.Path], "host path %s is not one bcd needs", v.HostPath.Path)
			}
		}
		mounted := map[string]bool{}
		for _, m := range c.VolumeMounts {
			p, ok := hostPaths[m.Name]
			if !ok {
				continue
			}
			mounted[p] = true
			require.Equal(t, p, m.MountPath, "host path %s is mounted where bcd looks for it", p)
			if readOnly[p] {
				require.True(t, m.ReadOnly, "%s must be mounted read-only", p)
			} else {
				require.False(t, m.ReadOnly, "%s is where bcd writes", p)
			}
		}
		for p := range writable {
			require.True(t, mounted[p], "%s is not mounted", p)
		}
		for p := range readOnly {
			require.True(t, mounted[p], "%s is not mounted", p)
		}

		// GPU nodes only, as NFD or GFD label them.
		var keys []string
		for _, term := range spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, e := range term.MatchExpressions {
				keys = append(keys, e.Key)
			}
		}
		require.ElementsMatch(t, []string{"feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"}, keys)

		env := map[string]corev1.EnvVar{}
		for _, e := range c.Env {
			env[e.Name] = e
			if r := e.ValueFrom; r != nil && r.ConfigMapKeyRef != nil {
				require.Equal(t, cm.Name, r.ConfigMapKeyRef.Name, e.Name)
				require.Contains(t, cm.Data, r.ConfigMapKeyRef.Key, "%s names a key the ConfigMap lacks", e.Name)
			}
		}
		require.Equal(t, "spec.nodeName", env["NODE_NAME"].ValueFrom.FieldRef.FieldPath)
		_, tokenInEnv := env["BCD_JOIN_TOKEN"]
		require.False(t, tokenInEnv, "the join tokens are a volume, one file per Node")
		var tokens *corev1.SecretVolumeSource
		for _, v := range spec.Volumes {
			if v.Secret != nil {
				tokens = v.Secret
			}
		}
		require.NotNil(t, tokens)
		require.Equal(t, secret.Name, tokens.SecretName)

		// Every flag is one bcd has: a renamed flag fails here, not on a
		// node. The args expand $(VAR)s, which bcd never sees.
		fs := flag.NewFlagSet("bcd", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var o options
		o.register(fs)
		for _, a := range c.Args {
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			require.True(t, strings.HasPrefix(a, "--"), "arg %q is not a flag", a)
			if fs.Lookup(name) == nil {
				t.Errorf("the DaemonSet passes --%s, which bcd does not have", name)
			}
		}
		require.Contains(t, c.Args, "--kube-node-name=$(NODE_NAME)")
	})

	t.Run("rbac", func(t *testing.T) {
		require.Equal(t, role.Name, binding.RoleRef.Name)
		require.Equal(t, "ClusterRole", binding.RoleRef.Kind)
		require.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: ns.Name}}, binding.Subjects)
		got := map[string][]string{}
		for _, r := range role.Rules {
			require.Empty(t, r.ResourceNames)
			require.Empty(t, r.NonResourceURLs)
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					require.NotContains(t, []string{"*", "secrets", "pods"}, res)
					got[g+"/"+res] = append(got[g+"/"+res], r.Verbs...)
				}
			}
		}
		require.Equal(t, map[string][]string{
			"/nodes":                         {"get", "list", "watch"},
			"resource.k8s.io/resourceclaims": {"get", "list", "watch"},
			"resource.k8s.io/resourceslices": {"get", "list", "watch", "create", "update", "delete"},
		}, got)
		require.Equal(t, policy.Name, policyBinding.Spec.PolicyName)
		require.Equal(t, []admissionv1.ValidationAction{admissionv1.Deny}, policyBinding.Spec.ValidationActions)
		require.Contains(t, policy.Spec.MatchConditions[0].Expression, "system:serviceaccount:"+ns.Name+":"+sa.Name)
	})

	t.Run("kustomization", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(manifestDir, "kustomization.yaml"))
		require.NoError(t, err)
		var k struct {
			APIVersion string   `json:"apiVersion"`
			Kind       string   `json:"kind"`
			Resources  []string `json:"resources"`
		}
		require.NoError(t, yaml.UnmarshalStrict(b, &k))
		require.Equal(t, "Kustomization", k.Kind)
		var want []string
		for name := range objs {
			if name != "secret.example.yaml" { // a template the operator fills
				want = append(want, name)
			}
		}
		require.ElementsMatch(t, want, k.Resources)
	})
}
