package fleetconfig

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/better-compute/better-compute/client"
)

// exportDoc is a document as written.
type exportDoc struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   Metadata `yaml:"metadata"`
	Spec       any      `yaml:"spec"`
}

// exportFiles names the file each kind is written to.
var exportFiles = map[string]string{KindProject: "projects.yaml", KindPool: "pools.yaml", KindFlavor: "flavors.yaml", KindIPPool: "ip-pools.yaml",
	KindQuota: "quotas.yaml", KindTenant: "tenants.yaml", KindSite: "sites.yaml", KindImage: "images.yaml",
	KindSandboxTemplate: "sandbox-templates.yaml", KindWebhook: "webhooks.yaml", KindIAMPolicy: "iam-policies.yaml"}

// Export reads the objects of the covered kinds in one scope (a tenant, or
// the platform's flavors and IP pools when tenant is empty) and returns
// them as documents per kind file, such that a plan of them against the
// same state shows no changes.
func Export(ctx context.Context, c *client.Client, tenant string) (map[string][]byte, error) {
	s := &scope{name: tenant}
	if err := readScope(ctx, c, s); err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(s.live))
	for k := range s.live {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	files := map[string]*bytes.Buffer{}
	docNames := map[string]int{}
	for _, k := range keys {
		l := s.live[k]
		name := l.name
		switch l.kind {
		case KindQuota:
			name = quotaDocName(l.spec.(*QuotaSpec))
		case KindWebhook:
			// Named after its url; two urls that read alike get a number.
			name = webhookDocName(l.name)
			if docNames[name]++; docNames[name] > 1 {
				name += "-" + itoa(docNames[name])
			}
		}
		b, err := yaml.Marshal(exportDoc{APIVersion: APIVersion, Kind: l.kind, Metadata: Metadata{Name: name, Tenant: tenant}, Spec: l.spec})
		if err != nil {
			return nil, err
		}
		f := exportFiles[l.kind]
		if files[f] == nil {
			files[f] = &bytes.Buffer{}
		} else {
			files[f].WriteString("---\n")
		}
		files[f].Write(b)
	}
	out := make(map[string][]byte, len(files))
	for f, b := range files {
		out[f] = b.Bytes()
	}
	return out, nil
}

// quotaDocName names a quota's document after its scope: tenant,
// project-web, project-web-pool-h100-model-h100.
func quotaDocName(s *QuotaSpec) string {
	var parts []string
	if s.Project != "" {
		parts = append(parts, "project-"+s.Project)
	}
	if s.Pool != "" {
		parts = append(parts, "pool-"+s.Pool)
	}
	if s.Model != "" {
		parts = append(parts, "model-"+strings.ToLower(s.Model))
	}
	if len(parts) == 0 {
		return "tenant"
	}
	return strings.Join(parts, "-")
}

// WriteExport writes an export's files into dir (created if need be), or,
// for dir "-", every document to w in kind order.
func WriteExport(files map[string][]byte, dir string, w io.Writer) error {
	if dir == "-" {
		first := true
		for _, k := range Kinds {
			b, ok := files[exportFiles[k]]
			if !ok {
				continue
			}
			if !first {
				fmt.Fprintln(w, "---")
			}
			first = false
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		return nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o640); err != nil {
			return err
		}
	}
	return nil
}
