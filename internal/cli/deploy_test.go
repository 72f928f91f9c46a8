package cli

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/doctest"
	"github.com/better-compute/better-compute/internal/pki"
)

// The parts of the manifests the test checks against serve.
type (
	k8sMeta struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name      string `yaml:"name"`
			Namespace string `yaml:"namespace"`
		} `yaml:"metadata"`
	}
	k8sProbe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		} `yaml:"httpGet"`
	}
	k8sContainer struct {
		Args []string `yaml:"args"`
		Env  []struct {
			Name      string `yaml:"name"`
			Value     string `yaml:"value"`
			ValueFrom *struct {
				SecretKeyRef *struct {
					Name string `yaml:"name"`
					Key  string `yaml:"key"`
				} `yaml:"secretKeyRef"`
			} `yaml:"valueFrom"`
		} `yaml:"env"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
		} `yaml:"ports"`
		StartupProbe   *k8sProbe `yaml:"startupProbe"`
		LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
		ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	}
	k8sDeployment struct {
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			Template struct {
				Metadata struct {
					Labels map[string]string `yaml:"labels"`
				} `yaml:"metadata"`
				Spec struct {
					Containers []k8sContainer `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	k8sService struct {
		Spec struct {
			Selector map[string]string `yaml:"selector"`
			Ports    []struct {
				Port       int    `yaml:"port"`
				TargetPort string `yaml:"targetPort"`
			} `yaml:"ports"`
		} `yaml:"spec"`
	}
	k8sPDB struct {
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
		} `yaml:"spec"`
	}
)

const controlPlaneDir = "deploy/kubernetes/control-plane"

// k8sObjects decodes every document of the control plane's manifests
// files, by kind and name.
func k8sObjects(t *testing.T, files ...string) map[string]*yaml.Node {
	t.Helper()
	out := map[string]*yaml.Node{}
	for _, f := range files {
		dec := yaml.NewDecoder(strings.NewReader(doctest.Read(t, path.Join(controlPlaneDir, f))))
		for {
			var n yaml.Node
			err := dec.Decode(&n)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, f)
			var m k8sMeta
			require.NoError(t, n.Decode(&m), f)
			require.NotEmpty(t, m.Kind, f)
			if m.Kind != "Namespace" && m.Kind != "Kustomization" {
				require.Equal(t, "better-compute", m.Metadata.Namespace, "%s %s/%s", f, m.Kind, m.Metadata.Name)
			}
			out[m.Kind+"/"+m.Metadata.Name] = &n
		}
	}
	return out
}

func decodeAs[T any](t *testing.T, objs map[string]*yaml.Node, key string) T {
	t.Helper()
	n, ok := objs[key]
	require.True(t, ok, "the manifests have no %s", key)
	var v T
	require.NoError(t, n.Decode(&v), key)
	return v
}

// parseServe parses args as serve's flags, as the command would.
func parseServe(t *testing.T, args []string) *pflag.FlagSet {
	t.Helper()
	cmd := newServeCommand()
	require.NoError(t, cmd.ParseFlags(args), "serve refuses %v", args)
	require.Empty(t, cmd.Flags().Args(), "serve takes no arguments")
	return cmd.Flags()
}

// serveReadsEnv says whether serve reads the environment variable name:
// the secret, the AuthZEN token, or one a flag takes its default from.
func serveReadsEnv(t *testing.T, name string) bool {
	if name == pki.SecretEnv || name == "BETTER_COMPUTE_AUTHZEN_TOKEN" {
		return true
	}
	const sentinel = "env-sentinel-value"
	t.Setenv(name, sentinel)
	found := false
	newServeCommand().Flags().VisitAll(func(f *pflag.Flag) {
		found = found || strings.Contains(f.DefValue, sentinel)
	})
	return found
}

func portOf(t *testing.T, fl *pflag.FlagSet, flag string) int {
	t.Helper()
	v, err := fl.GetString(flag)
	require.NoError(t, err)
	_, p, err := net.SplitHostPort(v)
	require.NoError(t, err, "--%s=%s", flag, v)
	n, err := strconv.Atoi(p)
	require.NoError(t, err, "--%s=%s", flag, v)
	return n
}

var envRef = regexp.MustCompile(`\$\(([A-Z_][A-Z0-9_]*)\)`)

// TestControlPlaneManifests keeps deploy/kubernetes/control-plane in step
// with serve: the Deployment passes only flags serve accepts and
// environment variables it reads (or that its arguments reference), its
// ports are the ones the flags listen on, its probes ask for paths the
// server answers, and the Services and the PodDisruptionBudget select its
// pods. Not parallel: it sets environment variables.
func TestControlPlaneManifests(t *testing.T) {
	kust := struct {
		Resources []string `yaml:"resources"`
	}{}
	require.NoError(t, yaml.Unmarshal([]byte(doctest.Read(t, path.Join(controlPlaneDir, "kustomization.yaml"))), &kust))
	objs := k8sObjects(t, append(kust.Resources, "secret.example.yaml", "postgres-cluster.yaml")...)

	d := decodeAs[k8sDeployment](t, objs, "Deployment/better-compute")
	pods := d.Spec.Template.Metadata.Labels
	require.Equal(t, d.Spec.Selector.MatchLabels, pods, "the Deployment selects its own pods")
	require.Len(t, d.Spec.Template.Spec.Containers, 1)
	c := d.Spec.Template.Spec.Containers[0]
	require.NotEmpty(t, c.Args)
	require.Equal(t, "serve", c.Args[0])
	fl := parseServe(t, c.Args[1:])

	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	require.Equal(t, map[string]int{"api": portOf(t, fl, "listen"), "gateway": portOf(t, fl, "gateway-listen"),
		"replica": portOf(t, fl, "replica-listen")}, ports, "the container ports are those serve listens on")

	// Kubernetes expands $(NAME) in args and env values: a variable set
	// only for that need not be serve's.
	referenced := map[string]bool{}
	for _, a := range c.Args {
		for _, m := range envRef.FindAllStringSubmatch(a, -1) {
			referenced[m[1]] = true
		}
	}
	secret := decodeAs[struct {
		StringData map[string]string `yaml:"stringData"`
	}](t, objs, "Secret/better-compute")
	for _, e := range c.Env {
		t.Run("env "+e.Name, func(t *testing.T) {
			require.True(t, referenced[e.Name] || serveReadsEnv(t, e.Name), "serve reads no %s and no argument references it", e.Name)
		})
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			ref := e.ValueFrom.SecretKeyRef
			require.Equal(t, "better-compute", ref.Name, e.Name)
			require.Contains(t, secret.StringData, ref.Key, "secret.example.yaml has the key %s takes", e.Name)
		}
	}
	names := func() []string {
		var out []string
		for _, e := range c.Env {
			out = append(out, e.Name)
		}
		return out
	}()
	require.Contains(t, names, pki.SecretEnv, "the gateway role needs the secret")
	require.Contains(t, names, "BETTER_COMPUTE_DATABASE_URL", "replicas share PostgreSQL")

	// The probes ask the API port for paths a control plane answers.
	cp := bctest.NewControlPlane(t)
	for what, p := range map[string]*k8sProbe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		require.NotNil(t, p, "%s probe", what)
		require.Equal(t, "api", p.HTTPGet.Port, "%s probe", what)
		res, err := http.Get(cp.URL + p.HTTPGet.Path)
		require.NoError(t, err)
		_ = res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode, "%s probe %s", what, p.HTTPGet.Path)
	}
	require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path, "ready only while the database answers")

	for key, want := range map[string]string{"Service/better-compute-api": "api", "Service/better-compute-gateway": "gateway"} {
		s := decodeAs[k8sService](t, objs, key)
		require.NotEmpty(t, s.Spec.Selector, key)
		for k, v := range s.Spec.Selector {
			require.Equal(t, v, pods[k], "%s selects the pods by %s", key, k)
		}
		require.Len(t, s.Spec.Ports, 1, key)
		require.Equal(t, want, s.Spec.Ports[0].TargetPort, key)
		require.Equal(t, ports[want], s.Spec.Ports[0].Port, "%s listens where the pods do", key)
	}
	pdb := decodeAs[k8sPDB](t, objs, "PodDisruptionBudget/better-compute")
	require.Equal(t, pods, pdb.Spec.Selector.MatchLabels)

	// The example database URL names the CloudNativePG cluster's
	// read-write service and database.
	db := decodeAs[struct {
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Spec struct {
			Bootstrap struct {
				InitDB struct {
					Database string `yaml:"database"`
				} `yaml:"initdb"`
			} `yaml:"bootstrap"`
		} `yaml:"spec"`
	}](t, objs, "Cluster/better-compute-db")
	require.Contains(t, secret.StringData["database-url"], "@"+db.Metadata.Name+"-rw:5432/"+db.Spec.Bootstrap.InitDB.Database+"?")
}

// TestSystemdUnit keeps deploy/systemd/better-compute.service in step with
// serve: its ExecStart passes only flags serve accepts, and its
// environment file example sets only variables serve reads. Not
// parallel: it sets environment variables.
func TestSystemdUnit(t *testing.T) {
	unit := doctest.Read(t, "deploy/systemd/better-compute.service")
	var exec []string
	var envFile string
	sc := bufio.NewScanner(strings.NewReader(unit))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "ExecStart":
			exec = strings.Fields(v)
		case "EnvironmentFile":
			envFile = v
		case "Environment":
			t.Errorf("set the environment in the EnvironmentFile, where the example documents it: %s", v)
		}
	}
	require.GreaterOrEqual(t, len(exec), 2)
	require.Equal(t, "/usr/local/bin/better-compute", exec[0])
	require.Equal(t, "serve", exec[1])
	fl := parseServe(t, exec[2:])
	dir, err := fl.GetString("state-dir")
	require.NoError(t, err)
	require.Equal(t, "/var/lib/better-compute", dir, "the StateDirectory systemd makes for the service")
	require.Contains(t, unit, "\nStateDirectory=better-compute\n")

	require.Equal(t, "/etc/better-compute/better-compute.env", envFile)
	example := doctest.Read(t, "deploy/systemd/better-compute.env.example")
	var names []string
	for _, l := range strings.Split(example, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		name, _, ok := strings.Cut(l, "=")
		require.True(t, ok, "not NAME=value: %q", l)
		names = append(names, name)
		t.Run("env "+name, func(t *testing.T) {
			require.True(t, serveReadsEnv(t, name), "serve reads no %s", name)
		})
	}
	require.True(t, slices.Contains(names, pki.SecretEnv))
}
