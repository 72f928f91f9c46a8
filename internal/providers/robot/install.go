package robot

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/internal/providers"
)

// imageRE is an installimage image: a name under the rescue system's image
// directory, or a path or URL (no spaces: it is one config line).
var imageRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:+-]*$`)

// rescueImageDir is where Hetzner's rescue system keeps its images.
const rescueImageDir = "/root/.oldroot/nfs/images/"

// workDir is the rescue system's scratch directory for the install (RAM:
// gone at the next boot).
const workDir = "/tmp/bc"

// install is one run of rescue + installimage on a claimed server.
type install struct {
	server     robotServer
	instanceID string
	image      string
	hostname   string
	keys       []ssh.PublicKey
	// userData is written, as the stdin of an SSH command and nowhere
	// else, into the installed system's cloud-init NoCloud seed.
	userData string
	// owner is the name the server must still carry before anything on
	// it is reset: another claimer's name means it is no longer ours.
	owner string
}

type rescueKey struct {
	Key struct {
		Fingerprint string `json:"fingerprint"`
	} `json:"key"`
}

// rescueAnswer is Robot's rescue object as an activation returns it.
type rescueAnswer struct {
	Rescue struct {
		Password string      `json:"password"`
		HostKey  []rescueKey `json:"host_key"`
	} `json:"rescue"`
}

// parseKeys parses the request's authorized keys.
func (p *Provider) parseKeys(lines []string) ([]ssh.PublicKey, error) {
	var keys []ssh.PublicKey
	for i, line := range lines {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			return nil, providers.Errorf(Type, providers.KindInvalid, "ssh key %d is no authorized_keys line: %v", i+1, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// ensureKeys puts the keys in Robot's key store (a rescue takes only keys
// from there, by fingerprint) and returns their fingerprints.
func (p *Provider) ensureKeys(ctx context.Context, keys []ssh.PublicKey) ([]string, error) {
	fps := make([]string, 0, len(keys))
	for _, k := range keys {
		fp := ssh.FingerprintLegacyMD5(k)
		form := url.Values{
			"name": {"bc-" + p.names.tag + "-" + strings.ReplaceAll(fp, ":", "")[:12]},
			"data": {strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))},
		}
		if err := p.call(ctx, http.MethodPost, "/key", form, nil); err != nil && !isKind(err, providers.KindConflict) {
			return nil, err
		}
		fps = append(fps, fp)
	}
	return fps, nil
}

// install boots the server's rescue system and installs the image from it:
// rescue activated with the keys, the server reset into it, installimage
// run over SSH with the rescue's one-time password, and the server reset
// again into the installed system.
func (p *Provider) install(ctx context.Context, in install) error {
	n := strconv.Itoa(in.server.Number)
	fps, err := p.ensureKeys(ctx, in.keys)
	if err != nil {
		return err
	}
	if cur, err := p.getServer(ctx, in.server.Number); err != nil {
		return err
	} else if cur.Name != in.owner {
		return providers.Errorf(Type, providers.KindConflict, "server %d is no longer claimed for instance %s", in.server.Number, in.instanceID)
	}
	// A rescue an earlier, failed attempt activated has a password this
	// one never saw: start over.
	if err := p.call(ctx, http.MethodDelete, "/boot/"+n+"/rescue", nil, nil); err != nil && !isKind(err, providers.KindNotFound) {
		return err
	}
	form := url.Values{"os": {"linux"}}
	for _, fp := range fps {
		form.Add("authorized_key[]", fp)
	}
	var rescue rescueAnswer
	if err := p.call(ctx, http.MethodPost, "/boot/"+n+"/rescue", form, &rescue); err != nil {
		return err
	}
	password := rescue.Rescue.Password
	secrets := []string{password, in.userData}
	if password == "" {
		return p.errorf(providers.KindInternal, secrets, "server %d: the rescue activation returned no password", in.server.Number)
	}
	var hostKeys []string
	for _, k := range rescue.Rescue.HostKey {
		hostKeys = append(hostKeys, k.Key.Fingerprint)
	}
	if err := p.startInto(ctx, in.server.Number, secrets); err != nil {
		return err
	}
	p.log.InfoContext(ctx, "booting the rescue system", "server", in.server.Number, "instance", in.instanceID)
	client, err := p.dialRescue(ctx, in.server, password, hostKeys, secrets)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = client.Close() })
	err = p.runInstall(ctx, client, in, secrets)
	stop()
	_ = client.Close()
	if err != nil {
		return err
	}
	// The activation was good for one boot: this one starts the installed
	// system.
	return p.resetServer(ctx, in.server.Number, "hw")
}

// startInto (re)starts a server: power for one that is off, else the hw
// reset.
func (p *Provider) startInto(ctx context.Context, number int, secrets []string) error {
	info, err := p.resetInfo(ctx, number)
	if err != nil {
		return err
	}
	typ := "hw"
	if info.OperatingStatus == "shut off" {
		typ = "power"
	}
	if len(info.Types) > 0 && !slices.Contains(info.Types, typ) {
		return p.errorf(providers.KindNotSupported, secrets, "server %d takes no %s reset", number, typ)
	}
	return p.resetServer(ctx, number, typ)
}

// dialRescue waits for the rescue system's SSH: it takes a minute or two
// to boot, and until then the address answers with the old system or not
// at all. The host key must be one the activation announced; an
// activation that announced none leaves the connection unpinned, which is
// logged.
func (p *Provider) dialRescue(ctx context.Context, s robotServer, password string, hostKeys []string, secrets []string) (*ssh.Client, error) {
	addr := strings.ReplaceAll(p.sshAddress, "{ip}", s.IP)
	if len(hostKeys) == 0 {
		p.log.WarnContext(ctx, "the rescue activation announced no host key: its SSH connection is not pinned", "server", s.Number)
	}
	cfg := &ssh.ClientConfig{
		User: "root",
		Auth: []ssh.AuthMethod{ssh.Password(password)},
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			if len(hostKeys) == 0 {
				return nil
			}
			md5, sha := ssh.FingerprintLegacyMD5(key), ssh.FingerprintSHA256(key)
			for _, fp := range hostKeys {
				if strings.EqualFold(fp, md5) || fp == sha {
					return nil
				}
			}
			return errors.New("host key is none the rescue activation announced")
		},
		Timeout: 30 * time.Second,
	}
	wait := 2 * time.Second
	for {
		client, err := dialSSH(ctx, addr, cfg)
		if err == nil {
			return client, nil
		}
		p.log.DebugContext(ctx, "rescue system not reachable yet", "server", s.Number, "err", p.redact(err.Error(), secrets...))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, p.errorf(providers.KindUnavailable, secrets, "server %d: the rescue system never answered SSH at %s: %v", s.Number, addr, err)
		case <-t.C:
		}
		wait = min(2*wait, 15*time.Second)
	}
}

func dialSSH(ctx context.Context, addr string, cfg *ssh.ClientConfig) (*ssh.Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	// The handshake gets the dial's timeout, or what is left of ctx.
	deadline := time.Now().Add(cfg.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = conn.SetDeadline(deadline)
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}

// runInstall runs installimage on the rescue system: the drives it finds,
// the config and the post-install script (which carries the user data)
// written from stdin, then installimage itself.
func (p *Provider) runInstall(ctx context.Context, c *ssh.Client, in install, secrets []string) error {
	out, err := p.exec(ctx, c, in.server.Number, "lsblk -dnpo NAME,TYPE,RM", "", secrets)
	if err != nil {
		return err
	}
	drives := parseDrives(out)
	if len(drives) == 0 {
		return p.errorf(providers.KindInternal, secrets, "server %d: the rescue system lists no fixed disk", in.server.Number)
	}
	write := "umask 077 && mkdir -p " + workDir + " && cat > "
	conf := workDir + "/installimage.conf"
	if _, err := p.exec(ctx, c, in.server.Number, write+conf, installConfig(in, drives), secrets); err != nil {
		return err
	}
	cmd := "installimage -a -c " + conf
	if in.userData != "" {
		script := workDir + "/post-install.sh"
		// installimage runs only an executable script.
		if _, err := p.exec(ctx, c, in.server.Number, write+script+" && chmod 700 "+script, postInstallScript(in), secrets); err != nil {
			return err
		}
		cmd += " -x " + script
	}
	p.log.InfoContext(ctx, "running installimage", "server", in.server.Number, "instance", in.instanceID, "image", in.image, "drives", len(drives))
	if _, err := p.exec(ctx, c, in.server.Number, cmd, "", secrets); err != nil {
		return err
	}
	// The seed holds the join token: it leaves the rescue's RAM now
	// rather than at the reboot.
	_, err = p.exec(ctx, c, in.server.Number, "rm -rf "+workDir, "", secrets)
	return err
}

// exec runs one command; stdin is the only way a secret reaches it.
func (p *Provider) exec(ctx context.Context, c *ssh.Client, number int, cmd, stdin string, secrets []string) (string, error) {
	sess, err := c.NewSession()
	if err != nil {
		return "", p.sshFailure(ctx, number, cmd, err, "", secrets)
	}
	defer func() { _ = sess.Close() }()
	// Two buffers: the session copies stdout and stderr concurrently.
	var out, errOut bytes.Buffer
	sess.Stdout, sess.Stderr = &out, &errOut
	if stdin != "" {
		sess.Stdin = strings.NewReader(stdin)
	}
	if err := sess.Run(cmd); err != nil {
		return "", p.sshFailure(ctx, number, cmd, err, out.String()+errOut.String(), secrets)
	}
	return out.String(), nil
}

func (p *Provider) sshFailure(ctx context.Context, number int, cmd string, err error, out string, secrets []string) error {
	name, _, _ := strings.Cut(cmd, " ")
	if _, rest, ok := strings.Cut(cmd, "&& cat > "); ok {
		name, _, _ = strings.Cut(rest, " ")
		name = "writing " + name
	}
	var exit *ssh.ExitError
	if errors.As(err, &exit) {
		if len(out) > 512 {
			out = out[len(out)-512:]
		}
		return p.errorf(providers.KindInternal, secrets, "server %d: %s exited %d: %s", number, name, exit.ExitStatus(), strings.TrimSpace(out))
	}
	if ctx.Err() != nil {
		return p.errorf(providers.KindUnavailable, secrets, "server %d: %s: %v", number, name, ctx.Err())
	}
	return p.errorf(providers.KindUnavailable, secrets, "server %d: %s: the rescue's SSH connection failed: %v", number, name, err)
}

// parseDrives takes the fixed disks from lsblk's NAME TYPE RM lines.
func parseDrives(out string) []string {
	var drives []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[1] == "disk" && f[2] == "0" && strings.HasPrefix(f[0], "/dev/") {
			drives = append(drives, f[0])
		}
	}
	return drives
}

// installConfig is installimage's config: every fixed disk (mirrored where
// there are two or more), a boot and a root partition, the image, the
// hostname, and the rescue's authorized keys carried into the new system.
func installConfig(in install, drives []string) string {
	var b strings.Builder
	for i, d := range drives {
		fmt.Fprintf(&b, "DRIVE%d %s\n", i+1, d)
	}
	if len(drives) > 1 {
		b.WriteString("SWRAID 1\nSWRAIDLEVEL 1\n")
	} else {
		b.WriteString("SWRAID 0\n")
	}
	b.WriteString("BOOTLOADER grub\n")
	fmt.Fprintf(&b, "HOSTNAME %s\n", in.hostname)
	b.WriteString("PART /boot ext3 1024M\nPART / ext4 all\n")
	image := in.image
	if !strings.ContainsAny(image, "/:") {
		image = rescueImageDir + image + ".tar.gz"
	}
	fmt.Fprintf(&b, "IMAGE %s\n", image)
	if len(in.keys) > 0 {
		b.WriteString("SSHKEYS_URL /root/.ssh/authorized_keys\n")
	}
	return b.String()
}

// postInstallScript runs in the installed system (installimage -x copies
// it to /post-install there and runs it chrooted) and seeds cloud-init's
// NoCloud source with the user data, which the script holds in a quoted
// here-document whose delimiter the user data does not contain. It removes
// its copy however it ends, so the token stays only in the seed.
func postInstallScript(in install) string {
	delim := "BC_USER_DATA"
	for strings.Contains(in.userData, delim) {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		delim = "BC_USER_DATA_" + hex.EncodeToString(b)
	}
	userData := strings.TrimSuffix(in.userData, "\n")
	return "#!/bin/sh\n" +
		"# Better Compute: seed cloud-init (NoCloud) with the instance's user data.\n" +
		"set -eu\n" +
		"trap 'rm -f -- \"$0\"' EXIT\n" +
		"if ! command -v cloud-init >/dev/null 2>&1; then\n" +
		"  echo 'the image has no cloud-init: the node cannot join' >&2\n" +
		"  exit 1\n" +
		"fi\n" +
		"seed=/var/lib/cloud/seed/nocloud\n" +
		"install -d -m 0700 \"$seed\"\n" +
		"umask 077\n" +
		"printf 'instance-id: %s\\nlocal-hostname: %s\\n' '" + in.instanceID + "' '" + in.hostname + "' > \"$seed/meta-data\"\n" +
		"cat > \"$seed/user-data\" <<'" + delim + "'\n" +
		userData + "\n" +
		delim + "\n"
}
