package runtime

import (
	"bytes"
	"context"
	"fmt"
	"mime/multipart"
	"net/netip"
	"net/textproto"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Seed is a guest's cloud-init NoCloud configuration: identity, SSH trust
// and static network. The runtime writes it as a small vfat volume labelled
// CIDATA.
type Seed struct {
	Hostname string `json:"hostname"`
	// InstanceID changes when the guest should re-run first-boot modules
	// (default: the spec's ID).
	InstanceID string `json:"instance_id,omitempty"`
	// User is the login account.
	User           string   `json:"user"`
	AuthorizedKeys []string `json:"authorized_keys,omitempty"`
	// TrustedUserCAKeys are CA public keys (authorized_keys form) whose
	// user certificates sshd accepts, for AuthorizedPrincipals only.
	TrustedUserCAKeys []string `json:"trusted_user_ca_keys,omitempty"`
	// AuthorizedPrincipals are the certificate principals that log in as
	// User (sshd's AuthorizedPrincipalsFile). Without the file sshd takes
	// the account name as the principal, which every guest shares: a
	// certificate for one guest would open all of them. Required with
	// TrustedUserCAKeys.
	AuthorizedPrincipals []string `json:"authorized_principals,omitempty"`
	// HostKey is the guest's Ed25519 host key (OpenSSH PEM) and
	// HostCertificate its CA-signed certificate (authorized_keys form).
	HostKey         string   `json:"host_key,omitempty"`
	HostCertificate string   `json:"host_certificate,omitempty"`
	Address         string   `json:"address,omitempty"` // CIDR, e.g. 10.0.0.2/24
	Gateway         string   `json:"gateway,omitempty"`
	DNS             []string `json:"dns,omitempty"`
	// UserData is the tenant's own user data (#cloud-config or a script),
	// sent next to the runtime's as a MIME multipart.
	UserData string `json:"user_data,omitempty"`
}

var (
	hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	userRE     = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
	// principalRE keeps a principal one token of an AuthorizedPrincipalsFile
	// line: no space, comma, quote or option syntax.
	principalRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$`)
)

// reservedUsers cannot be the login account: the seed would lock or
// re-key a system account.
var reservedUsers = map[string]bool{"root": true, "daemon": true, "bin": true, "sys": true, "nobody": true, "sshd": true}

func (s *Seed) validate() error {
	bad := func(field, format string, a ...any) error {
		return &SpecError{Field: "seed." + field, Reason: fmt.Sprintf(format, a...)}
	}
	if !hostnameRE.MatchString(s.Hostname) {
		return bad("hostname", "%q is not a DNS label", s.Hostname)
	}
	if s.InstanceID != "" && !idRE.MatchString(s.InstanceID) {
		return bad("instance_id", "must be 1-63 of a-z, 0-9 and '-'")
	}
	if !userRE.MatchString(s.User) || reservedUsers[s.User] {
		return bad("user", "%q is not an allowed account name", s.User)
	}
	if len(s.AuthorizedKeys) == 0 && len(s.TrustedUserCAKeys) == 0 {
		return bad("authorized_keys", "an authorized key or a trusted user CA is required to log in")
	}
	for i, k := range append(append([]string{}, s.AuthorizedKeys...), s.TrustedUserCAKeys...) {
		if strings.ContainsAny(k, "\n\r") || !strings.HasPrefix(k, "ssh-") && !strings.HasPrefix(k, "ecdsa-") {
			return bad("authorized_keys", "key %d is not one authorized_keys line", i)
		}
	}
	switch {
	case len(s.TrustedUserCAKeys) > 0 && len(s.AuthorizedPrincipals) == 0:
		return bad("authorized_principals", "are required with a trusted user CA (without them every certificate of the CA logs in)")
	case len(s.TrustedUserCAKeys) == 0 && len(s.AuthorizedPrincipals) > 0:
		return bad("authorized_principals", "need a trusted user CA")
	}
	for i, p := range s.AuthorizedPrincipals {
		if !principalRE.MatchString(p) {
			return bad(fmt.Sprintf("authorized_principals[%d]", i), "%q is not a principal (1-128 of A-Z, a-z, 0-9, '.', '_', '@', '-')", p)
		}
	}
	if (s.HostKey == "") != (s.HostCertificate == "") {
		return bad("host_certificate", "host key and host certificate come together")
	}
	if s.HostKey != "" && !strings.Contains(s.HostKey, "OPENSSH PRIVATE KEY") {
		return bad("host_key", "must be an OpenSSH private key")
	}
	if s.HostCertificate != "" && (!strings.Contains(s.HostCertificate, "-cert-v01@openssh.com ") || strings.ContainsAny(strings.TrimSpace(s.HostCertificate), "\n")) {
		return bad("host_certificate", "must be one OpenSSH certificate line")
	}
	if s.Address == "" {
		if s.Gateway != "" || len(s.DNS) > 0 {
			return bad("address", "is required with a gateway or DNS")
		}
		return nil
	}
	p, err := netip.ParsePrefix(s.Address)
	if err != nil || !p.Addr().Is4() {
		return bad("address", "%q is not an IPv4 address/prefix", s.Address)
	}
	if s.Gateway != "" {
		g, err := netip.ParseAddr(s.Gateway)
		if err != nil || !g.Is4() {
			return bad("gateway", "%q is not an IPv4 address", s.Gateway)
		}
		if !p.Masked().Contains(g) {
			return bad("gateway", "%s is outside %s", g, p.Masked())
		}
	}
	for i, d := range s.DNS {
		if _, err := netip.ParseAddr(d); err != nil {
			return bad(fmt.Sprintf("dns[%d]", i), "%q is not an IP address", d)
		}
	}
	return nil
}

// Paths in the guest the seed writes; the image's sshd includes
// sshd_config.d.
const (
	guestHostKey = "/etc/ssh/ssh_host_ed25519_key"
	guestUserCA  = "/etc/ssh/better_compute_user_ca.pub"
	// guestPrincipals holds one file per account (sshd expands %u), so a
	// certificate logs in as the seed's account only.
	guestPrincipals = "/etc/ssh/better_compute_principals"
	guestSSHDConf   = "/etc/ssh/sshd_config.d/50-better-compute.conf"
)

// RenderSeed returns the NoCloud files: meta-data, user-data and
// network-config. mac is the guest NIC's address (the network config
// matches it).
func RenderSeed(s *Seed, instanceID, mac string) (map[string][]byte, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	if s.InstanceID != "" {
		instanceID = s.InstanceID
	}
	meta, err := yaml.Marshal(map[string]string{"instance-id": instanceID, "local-hostname": s.Hostname})
	if err != nil {
		return nil, fmt.Errorf("runtime: seed meta-data: %w", err)
	}

	type file struct {
		Path        string `yaml:"path"`
		Content     string `yaml:"content"`
		Permissions string `yaml:"permissions"`
		Owner       string `yaml:"owner,omitempty"`
	}
	var files []file
	sshd := []string{"PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin no"}
	if s.HostKey != "" {
		files = append(files,
			file{Path: guestHostKey, Content: s.HostKey, Permissions: "0600", Owner: "root:root"},
			file{Path: guestHostKey + "-cert.pub", Content: strings.TrimSpace(s.HostCertificate) + "\n", Permissions: "0644"})
		sshd = append(sshd, "HostKey "+guestHostKey, "HostCertificate "+guestHostKey+"-cert.pub")
	}
	if len(s.TrustedUserCAKeys) > 0 {
		files = append(files, file{Path: guestUserCA, Content: strings.Join(s.TrustedUserCAKeys, "\n") + "\n", Permissions: "0644"})
		files = append(files, file{Path: guestPrincipals + "/" + s.User, Content: strings.Join(s.AuthorizedPrincipals, "\n") + "\n",
			Permissions: "0644", Owner: "root:root"})
		sshd = append(sshd, "TrustedUserCAKeys "+guestUserCA, "AuthorizedPrincipalsFile "+guestPrincipals+"/%u")
	}
	files = append(files, file{Path: guestSSHDConf, Content: strings.Join(sshd, "\n") + "\n", Permissions: "0644"})
	if len(s.DNS) > 0 {
		// The image has no resolvconf; ifupdown ignores dns-* lines, so
		// the seed writes resolv.conf itself.
		var b strings.Builder
		for _, d := range s.DNS {
			fmt.Fprintf(&b, "nameserver %s\n", d)
		}
		files = append(files, file{Path: "/etc/resolv.conf", Content: b.String(), Permissions: "0644"})
	}
	user := map[string]any{
		"name": s.User, "shell": "/bin/bash", "lock_passwd": true,
	}
	if len(s.AuthorizedKeys) > 0 {
		user["ssh_authorized_keys"] = s.AuthorizedKeys
	}
	// The image carries no host keys: a seed with one installs it; without
	// one (an instance with no CA-certified host key) cloud-init makes an
	// Ed25519 key at first boot, or sshd would not start.
	genKeys := []string{}
	if s.HostKey == "" {
		genKeys = []string{"ed25519"}
	}
	cc := map[string]any{
		"hostname":          s.Hostname,
		"preserve_hostname": false,
		"manage_etc_hosts":  true,
		"users":             []any{user},
		"ssh_pwauth":        false,
		"ssh_deletekeys":    false,
		"ssh_genkeytypes":   genKeys,
		"write_files":       files,
	}
	ccYAML, err := yaml.Marshal(cc)
	if err != nil {
		return nil, fmt.Errorf("runtime: seed user-data: %w", err)
	}
	userData := append([]byte("#cloud-config\n"), ccYAML...)
	if s.UserData != "" {
		userData, err = multipartUserData(userData, []byte(s.UserData))
		if err != nil {
			return nil, err
		}
	}

	out := map[string][]byte{"meta-data": meta, "user-data": userData}
	if s.Address != "" {
		subnet := map[string]any{"type": "static", "address": s.Address}
		if s.Gateway != "" {
			subnet["gateway"] = s.Gateway
		}
		if len(s.DNS) > 0 {
			subnet["dns_nameservers"] = s.DNS
		}
		iface := map[string]any{"type": "physical", "name": "eth0", "subnets": []any{subnet}}
		if mac != "" {
			iface["mac_address"] = strings.ToLower(mac)
		}
		nc, err := yaml.Marshal(map[string]any{"version": 1, "config": []any{iface}})
		if err != nil {
			return nil, fmt.Errorf("runtime: seed network-config: %w", err)
		}
		out["network-config"] = nc
	}
	return out, nil
}

// multipartUserData sends the runtime's cloud-config and the tenant's user
// data together; cloud-init merges cloud-configs and runs scripts.
func multipartUserData(ours, theirs []byte) ([]byte, error) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=%q\nMIME-Version: 1.0\n\n", w.Boundary())
	theirType := "text/cloud-config"
	switch {
	case bytes.HasPrefix(theirs, []byte("#!")):
		theirType = "text/x-shellscript"
	case bytes.HasPrefix(theirs, []byte("#cloud-config")):
	default:
		return nil, &SpecError{Field: "seed.user_data", Reason: "must start with #cloud-config or #!"}
	}
	for i, part := range []struct {
		typ  string
		body []byte
	}{{"text/cloud-config", ours}, {theirType, theirs}} {
		h := textproto.MIMEHeader{}
		h.Set("Content-Type", part.typ+`; charset="utf-8"`)
		h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="part-%d"`, i))
		pw, err := w.CreatePart(h)
		if err != nil {
			return nil, fmt.Errorf("runtime: seed user-data: %w", err)
		}
		if _, err := pw.Write(part.body); err != nil {
			return nil, fmt.Errorf("runtime: seed user-data: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("runtime: seed user-data: %w", err)
	}
	return b.Bytes(), nil
}

// WriteSeedImage writes files into a new vfat image at path labelled
// CIDATA (mkfs.vfat and mcopy, from dosfstools and mtools).
func WriteSeedImage(ctx context.Context, path string, files map[string][]byte) error {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".seed-")
	if err != nil {
		return fmt.Errorf("runtime: seed: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	tmp := filepath.Join(dir, "seed.img")
	// 2 MiB holds any seed a spec may carry (user data is bounded by the API).
	if out, err := exec.CommandContext(ctx, "mkfs.vfat", "-n", "CIDATA", "-C", tmp, "2048").CombinedOutput(); err != nil {
		return fmt.Errorf("runtime: seed: mkfs.vfat: %w: %s", err, bytes.TrimSpace(out))
	}
	args := []string{"-i", tmp}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, body, 0o600); err != nil {
			return fmt.Errorf("runtime: seed: %w", err)
		}
		args = append(args, p)
	}
	args = append(args, "::")
	cmd := exec.CommandContext(ctx, "mcopy", args...)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("runtime: seed: mcopy: %w: %s", err, bytes.TrimSpace(out))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("runtime: seed: %w", err)
	}
	return nil
}
