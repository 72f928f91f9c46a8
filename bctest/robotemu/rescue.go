package robotemu

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
)

// The rescue systems understand the few commands a provider runs to
// install a server, and nothing else (exit 127, as a shell would):
//
//	lsblk -dnpo NAME,TYPE,RM          the block devices
//	[umask 077 && ][mkdir -p DIR && ]cat > FILE[ && chmod 7NN FILE]
//	                                  FILE holds stdin (executable with
//	                                  the chmod)
//	installimage -a -c CONF [-x SCRIPT]
//	                                  install CONF's IMAGE on its DRIVEs,
//	                                  then run SCRIPT in the new system
//	rm -rf PATH                       forget PATH and what lies below it
var (
	writeRE   = regexp.MustCompile(`^(?:umask 0?77 && )?(?:mkdir -p \S+ && )?cat > (/\S+)( && chmod [0-7]?[1357][0-7]{2} (/\S+))?$`)
	imagePath = regexp.MustCompile(`^/root/\.oldroot/nfs/images/([A-Za-z0-9._-]+)\.tar\.(?:gz|zst|xz)$`)
)

func (e *Emulator) startSSH() error {
	signer, err := newHostKey()
	if err != nil {
		return err
	}
	e.hostKey = signer.PublicKey()
	e.sshCfg = &ssh.ServerConfig{
		ServerVersion: "SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3 robotemu",
		PasswordCallback: func(conn ssh.ConnMetadata, password []byte) (*ssh.Permissions, error) {
			if conn.User() != "root" {
				return nil, errors.New("only root logs in to a rescue system")
			}
			e.mu.Lock()
			defer e.mu.Unlock()
			for _, s := range e.servers {
				if s.on && s.bootedRescue != "" && s.bootedRescue == string(password) {
					return &ssh.Permissions{Extensions: map[string]string{"server": strconv.Itoa(s.number)}}, nil
				}
			}
			return nil, errors.New("permission denied")
		},
	}
	e.sshCfg.AddHostKey(signer)
	e.sshLn, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			conn, err := e.sshLn.Accept()
			if err != nil {
				return
			}
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				e.serveSSH(conn)
			}()
		}
	}()
	return nil
}

func (e *Emulator) serveSSH(nc net.Conn) {
	defer func() { _ = nc.Close() }()
	conn, chans, reqs, err := ssh.NewServerConn(nc, e.sshCfg)
	if err != nil {
		return
	}
	defer func() { _ = conn.Close() }()
	go ssh.DiscardRequests(reqs)
	number, _ := strconv.Atoi(conn.Permissions.Extensions["server"])
	for nch := range chans {
		if nch.ChannelType() != "session" {
			_ = nch.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, chReqs, err := nch.Accept()
		if err != nil {
			continue
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.serveSession(number, ch, chReqs)
		}()
	}
}

func (e *Emulator) serveSession(number int, ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer func() { _ = ch.Close() }()
	for req := range reqs {
		if req.Type != "exec" {
			// env, pty-req and the like: a rescue shell would take them;
			// nothing here depends on them.
			_ = req.Reply(req.Type == "env", nil)
			continue
		}
		var payload struct{ Command string }
		if err := ssh.Unmarshal(req.Payload, &payload); err != nil {
			_ = req.Reply(false, nil)
			return
		}
		_ = req.Reply(true, nil)
		stdin, _ := io.ReadAll(ch)
		out, code := e.run(number, payload.Command, string(stdin))
		_, _ = io.WriteString(ch, out)
		_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
		return
	}
}

// run runs command on server number's rescue system and records it.
func (e *Emulator) run(number int, command, stdin string) (string, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.serverLocked(number)
	out, code := e.runLocked(s, command, stdin)
	s.execs = append(s.execs, Exec{Command: command, Stdin: stdin, Exit: code})
	return out, code
}

func (e *Emulator) runLocked(s *server, command, stdin string) (string, int) {
	if s.bootedRescue == "" || s.files == nil {
		return "the rescue system is gone\n", 255
	}
	if m := writeRE.FindStringSubmatch(command); m != nil {
		s.files[m[1]] = stdin
		delete(s.executable, m[1])
		if m[2] != "" {
			if m[3] != m[1] {
				return "chmod: cannot access '" + m[3] + "': No such file or directory\n", 1
			}
			s.executable[m[1]] = true
		}
		return "", 0
	}
	fields := strings.Fields(command)
	switch {
	case command == "lsblk -dnpo NAME,TYPE,RM":
		var b strings.Builder
		for _, d := range e.opts.Disks {
			fmt.Fprintf(&b, "%s disk 0\n", d)
		}
		b.WriteString("/dev/loop0 loop 0\n/dev/sr0 rom 1\n")
		return b.String(), 0
	case len(fields) == 3 && fields[0] == "rm" && fields[1] == "-rf":
		for f := range s.files {
			if f == fields[2] || strings.HasPrefix(f, strings.TrimSuffix(fields[2], "/")+"/") {
				delete(s.files, f)
				delete(s.executable, f)
			}
		}
		return "", 0
	case len(fields) > 0 && fields[0] == "installimage":
		return e.installLocked(s, fields[1:])
	}
	return fmt.Sprintf("sh: 1: %s: not found\n", fields[0]), 127
}

// installLocked is installimage's automatic mode: it checks the config as
// installimage would (drives, image, hostname, partitions) and records
// what it installed; the post-install script is kept as it would run.
func (e *Emulator) installLocked(s *server, args []string) (string, int) {
	var conf, script string
	auto := false
	for i := 0; i < len(args); i++ {
		switch {
		case args[i] == "-a":
			auto = true
		case args[i] == "-c" && i+1 < len(args):
			i++
			conf = args[i]
		case args[i] == "-x" && i+1 < len(args):
			i++
			script = args[i]
		default:
			return "installimage: unknown option " + args[i] + "\n", 1
		}
	}
	if !auto || conf == "" {
		return "installimage: only the automatic mode (-a -c CONFIG) runs here\n", 1
	}
	text, ok := s.files[conf]
	if !ok {
		return "installimage: config file " + conf + " not found\n", 1
	}
	var image, hostname string
	var drives, parts []string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, _ := strings.Cut(line, " ")
		v = strings.TrimSpace(v)
		switch {
		case strings.HasPrefix(k, "DRIVE"):
			if !slices.Contains(e.opts.Disks, v) {
				return "installimage: no drive " + v + "\n", 1
			}
			drives = append(drives, v)
		case k == "IMAGE":
			m := imagePath.FindStringSubmatch(v)
			if m == nil || !slices.Contains(e.opts.Images, m[1]) {
				return "installimage: image " + v + " not found\n", 1
			}
			image = m[1]
		case k == "HOSTNAME":
			hostname = v
		case k == "PART":
			parts = append(parts, v)
		case k == "SWRAID", k == "SWRAIDLEVEL", k == "BOOTLOADER", k == "SSHKEYS_URL":
		default:
			return "installimage: unknown config line " + k + "\n", 1
		}
	}
	switch {
	case len(drives) == 0:
		return "installimage: no DRIVE1\n", 1
	case image == "":
		return "installimage: no IMAGE\n", 1
	case hostname == "":
		return "installimage: no HOSTNAME\n", 1
	case len(parts) == 0:
		return "installimage: no PART\n", 1
	}
	post := ""
	if script != "" {
		if post, ok = s.files[script]; !ok {
			return "installimage: post-install script " + script + " not found\n", 1
		}
		if !s.executable[script] {
			return "installimage: post-install script " + script + " isn't executable\n", 1
		}
	}
	s.image, s.hostname, s.postInstall = image, hostname, post
	return "Installation complete. You can now reboot into your new system.\n", 0
}
