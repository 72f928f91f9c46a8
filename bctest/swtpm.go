package bctest

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// SWTPM is a real software TPM 2.0 (Debian's swtpm) manufactured for one
// test: an RSA and an ECC EK, each with a certificate in NV memory issued by
// a local CA of the test's own (swtpm_localca), served over TCP.
type SWTPM struct {
	// Addr is the TPM's command channel as bcd's --attest-tpm takes it:
	// "tcp://127.0.0.1:PORT".
	Addr string
	// EKCAPEM is the local CA's root and issuing certificates, PEM: what
	// an operator registers as the tenant's TPM EK CA.
	EKCAPEM []byte
}

// RequireSWTPM skips the test when swtpm is not installed, except in CI
// (CI=true), where .ci/run installs it and its absence is a failure.
func RequireSWTPM(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"swtpm", "swtpm_setup", "swtpm_localca"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed; .ci/run installs swtpm and swtpm-tools", bin)
			}
			t.Skipf("%s is not installed (apt-get install swtpm swtpm-tools): the TPM attestation test needs a real software TPM", bin)
		}
	}
}

// StartSWTPM manufactures a TPM in t.TempDir() and serves it until the
// test ends. The listener is the test's own, so the address is known and
// connectable before any swtpm runs: no port race, nothing to wait for.
func StartSWTPM(t testing.TB) *SWTPM {
	t.Helper()
	RequireSWTPM(t)
	dir := t.TempDir()
	ca, state := filepath.Join(dir, "ca"), filepath.Join(dir, "state")
	for _, d := range []string{ca, state} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	localca := filepath.Join(dir, "localca.conf")
	setup := filepath.Join(dir, "swtpm_setup.conf")
	write := func(path string, lines ...string) {
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(localca, "statedir = "+ca, "signingkey = "+filepath.Join(ca, "signkey.pem"),
		"issuercert = "+filepath.Join(ca, "issuercert.pem"), "certserial = "+filepath.Join(ca, "certserial"))
	write(filepath.Join(dir, "localca.options"), "--platform-manufacturer BetterCompute", "--platform-version 2.1", "--platform-model test")
	write(setup, "create_certs_tool = "+mustLook(t, "swtpm_localca"), "create_certs_tool_config = "+localca,
		"create_certs_tool_options = "+filepath.Join(dir, "localca.options"), "active_pcr_banks = sha256")
	out, err := exec.Command("swtpm_setup", "--tpm2", "--tpmstate", state, "--create-ek-cert", "--create-platform-cert",
		"--config", setup, "--overwrite").CombinedOutput()
	if err != nil {
		t.Fatalf("swtpm_setup: %v\n%s", err, out)
	}
	var bundle []byte
	for _, f := range []string{"swtpm-localca-rootca-cert.pem", "issuercert.pem"} {
		b, err := os.ReadFile(filepath.Join(ca, f))
		if err != nil {
			t.Fatal(err)
		}
		bundle = append(bundle, b...)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		_ = l.Close()
		<-done
	})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			serveSWTPM(t, c, state)
		}
	}()
	return &SWTPM{Addr: "tcp://" + l.Addr().String(), EKCAPEM: bundle}
}

// serveSWTPM runs one swtpm process for one TCP connection: swtpm's
// "--server type=tcp,fd=N" reads commands from a connected socket, here one
// end of a socket pair whose other end is relayed to c. The state is in
// dir, so each connection sees the TPM the last one left (a TPM restarted
// with startup-clear: persistent keys and NV kept, loaded objects not).
// Connections are served one at a time, as two swtpm processes must not
// share a state directory.
func serveSWTPM(t testing.TB, c net.Conn, dir string) {
	defer func() { _ = c.Close() }()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Errorf("swtpm: socketpair: %v", err)
		return
	}
	theirs, ours := os.NewFile(uintptr(fds[0]), "swtpm-server"), os.NewFile(uintptr(fds[1]), "swtpm-client")
	cmd := exec.Command("swtpm", "socket", "--tpm2", "--server", "type=tcp,fd=3",
		"--flags", "not-need-init,startup-clear", "--tpmstate", "dir="+dir)
	cmd.ExtraFiles = []*os.File{theirs}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Errorf("start swtpm: %v", err)
		_ = theirs.Close()
		_ = ours.Close()
		return
	}
	_ = theirs.Close()
	// A net.Conn of our end, so that CloseWrite can tell swtpm the client
	// hung up (its EOF ends the process) while a read is still pending.
	conn, err := net.FileConn(ours)
	_ = ours.Close()
	if err != nil {
		t.Errorf("swtpm: %v", err)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return
	}
	defer func() { _ = conn.Close() }()
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(conn, c)
		_ = conn.(*net.UnixConn).CloseWrite()
	}()
	_, _ = io.Copy(c, conn)
	_ = c.Close()
	<-copied
	if err := cmd.Wait(); err != nil && stderr.Len() > 0 {
		t.Logf("swtpm: %v: %s", err, stderr.String())
	}
}

func mustLook(t testing.TB, bin string) string {
	t.Helper()
	p, err := exec.LookPath(bin)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
