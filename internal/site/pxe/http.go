package pxe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /boot/{script}", s.serveScript)
	mux.HandleFunc("GET /files/sha256/{digest}", s.serveBlob)
	mux.HandleFunc("GET /files/{name...}", s.serveFile)
	return mux
}

// serveScript renders the iPXE script of one machine from the Decider.
func (s *Server) serveScript(w http.ResponseWriter, r *http.Request) {
	macText, ok := strings.CutSuffix(r.PathValue("script"), ".ipxe")
	if !ok {
		http.Error(w, "want /boot/<mac>.ipxe", http.StatusNotFound)
		return
	}
	mac, err := normalizeMAC(macText)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if s.pool != nil {
		// In full mode the script (and any token in it) goes only to the
		// address leased to that MAC, so another host on the network
		// cannot read a machine's script by guessing its MAC.
		remote := remoteAddr(r)
		l, ok := s.pool.Lookup(macKey(mac), s.cfg.Clock.Now())
		if !ok || l.IP != remote {
			s.log.Warn("script refused: requester does not hold the machine's lease", "mac", mac.String(), "remote", remote.String())
			http.Error(w, "this address does not hold the machine's lease", http.StatusForbidden)
			return
		}
	}
	req := Request{MAC: mac, Phase: PhaseScript}
	s.seenMu.Lock()
	if prev, ok := s.seen[macKey(mac)]; ok {
		req.Arch, req.HasArch, req.UserClass = prev.Arch, prev.HasArch, prev.UserClass
	}
	s.seenMu.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), handlerTimeout)
	defer cancel()
	b, err := s.cfg.Decider.Decide(ctx, req)
	if err != nil {
		s.log.Warn("decider failed; unknown-machine script served", "mac", mac.String(), "err", err)
		b = Unknown{}
	}
	script, state, err := s.renderScript(mac, b)
	if err != nil {
		// The error names the field, never the token's value.
		s.log.Error("script not rendered", "mac", mac.String(), "err", err)
		http.Error(w, "the machine's boot decision is invalid", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	// A script may carry a single-use token: no cache may keep it.
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(script))
	s.log.Info("ipxe script served", "mac", mac.String(), "state", state)
}

func remoteAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// renderScript writes the iPXE script for b. state names it for the log.
func (s *Server) renderScript(mac net.HardwareAddr, b Boot) (script, state string, err error) {
	var sb strings.Builder
	sb.WriteString("#!ipxe\n")
	switch b := b.(type) {
	case Ramdisk:
		kernel, err := s.refURL(b.Kernel)
		if err != nil {
			return "", "", fmt.Errorf("kernel: %w", err)
		}
		initrd := ""
		if b.Initrd != "" {
			if initrd, err = s.refURL(b.Initrd); err != nil {
				return "", "", fmt.Errorf("initrd: %w", err)
			}
		}
		if !validScriptText(b.Cmdline) {
			return "", "", errors.New("cmdline: control characters")
		}
		args := []string{}
		if initrd != "" {
			// EFI-stub kernels find the initrd by this name; BIOS kernels
			// ignore it.
			args = append(args, "initrd=initrd")
		}
		if b.Cmdline != "" {
			args = append(args, b.Cmdline)
		}
		if b.Token != "" {
			if !validToken(b.Token.Reveal()) {
				return "", "", errors.New("token: not a base64/hex token")
			}
			arg := b.TokenArg
			if arg == "" {
				arg = "bc.token"
			}
			if !validToken(arg) || strings.Contains(arg, "=") {
				return "", "", errors.New("token arg: not a plain parameter name")
			}
			args = append(args, arg+"="+b.Token.Reveal())
		}
		sb.WriteString("echo Better Compute: booting the ramdisk\n")
		if initrd != "" {
			fmt.Fprintf(&sb, "initrd --name initrd %s || goto failed\n", initrd)
		}
		fmt.Fprintf(&sb, "kernel %s %s || goto failed\n", kernel, strings.Join(args, " "))
		sb.WriteString("boot || goto failed\n")
		fmt.Fprintf(&sb, ":failed\necho Better Compute: ramdisk boot failed; retrying in %d s\nsleep %d\n", s.retrySeconds(), s.retrySeconds())
		fmt.Fprintf(&sb, "chain --replace --autofree %s\n", s.scriptURL(mac))
		return sb.String(), "ramdisk", nil
	case LocalDisk:
		sb.WriteString("echo Better Compute: booting the local disk\n")
		// UEFI: leave iPXE so the firmware boots its next entry (the disk).
		// BIOS: boot the first hard disk directly.
		sb.WriteString("iseq ${platform} efi && exit ||\n")
		sb.WriteString("sanboot --no-describe --drive 0x80\n")
		return sb.String(), "local-disk", nil
	case Unknown, nil:
		fmt.Fprintf(&sb, "echo Better Compute: machine %s is not known to this site; asking again in %d s\n", mac, s.retrySeconds())
		fmt.Fprintf(&sb, "sleep %d\n", s.retrySeconds())
		fmt.Fprintf(&sb, "chain --replace --autofree %s\n", s.scriptURL(mac))
		return sb.String(), "unknown", nil
	default:
		return "", "", fmt.Errorf("boot decision of type %T", b)
	}
}

func (s *Server) retrySeconds() int { return max(1, int(s.cfg.RetryDelay/time.Second)) }

// refURL turns a Ramdisk reference into the URL iPXE loads.
func (s *Server) refURL(ref string) (string, error) {
	switch {
	case ref == "":
		return "", errors.New("empty reference")
	case !validScriptText(ref) || strings.ContainsAny(ref, " $"):
		return "", fmt.Errorf("reference %q: spaces, '$' and control characters are not allowed", ref)
	case strings.HasPrefix(ref, "sha256:"):
		hexDigest, err := parseDigest(ref)
		if err != nil {
			return "", err
		}
		if s.cache == nil {
			return "", errors.New("a sha256 reference needs Config.CacheDir")
		}
		return s.BaseURL() + "/files/sha256/" + hexDigest, nil
	case strings.HasPrefix(ref, "http://") || strings.HasPrefix(ref, "https://"):
		return ref, nil
	default:
		if s.filesDir == nil {
			return "", fmt.Errorf("reference %q names a file but Config.FilesDir is not set", ref)
		}
		if !localName(ref) {
			return "", fmt.Errorf("reference %q: not a relative path inside FilesDir", ref)
		}
		return s.BaseURL() + "/files/" + ref, nil
	}
}

// localName accepts a clean relative path with no "." or ".." elements.
func localName(name string) bool {
	if name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, "\\") {
		return false
	}
	for _, part := range strings.Split(name, "/") {
		if part == "" || part == "." || part == ".." {
			return false
		}
	}
	return true
}

// serveBlob serves a cached blob by digest, fetching it through from upstream
// on a miss; http.ServeContent answers Range requests.
func (s *Server) serveBlob(w http.ResponseWriter, r *http.Request) {
	hexDigest := r.PathValue("digest")
	if !validHex64(hexDigest) {
		http.Error(w, "want /files/sha256/<64 lower-case hex digits>", http.StatusBadRequest)
		return
	}
	if s.cache == nil {
		http.Error(w, "no cache configured", http.StatusNotFound)
		return
	}
	f, err := s.cache.Open(r.Context(), hexDigest)
	switch {
	case errors.Is(err, ErrDigestMismatch):
		s.log.Error("upstream blob refused", "digest", "sha256:"+hexDigest, "err", err)
		http.Error(w, "upstream content does not match sha256:"+hexDigest, http.StatusBadGateway)
		return
	case errors.Is(err, ErrNotCached):
		http.Error(w, "sha256:"+hexDigest+" is not cached", http.StatusNotFound)
		return
	case err != nil:
		s.log.Error("blob not served", "digest", "sha256:"+hexDigest, "err", err)
		http.Error(w, "could not fetch sha256:"+hexDigest, http.StatusBadGateway)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		http.Error(w, "stat failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("ETag", `"sha256:`+hexDigest+`"`)
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", st.ModTime(), f)
}

// serveFile serves a named file from FilesDir, through an os.Root so no
// request leaves the directory.
func (s *Server) serveFile(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if s.filesDir == nil || !localName(name) {
		http.NotFound(w, r)
		return
	}
	f, err := s.filesDir.Open(name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", st.ModTime(), f)
}
