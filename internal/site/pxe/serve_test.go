package pxe

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/pin/tftp/v3"
	"github.com/stretchr/testify/require"
)

func TestTFTPServesOnlyTheChainloadBinaries(t *testing.T) {
	t.Parallel()
	f := setup(t, ModeProxy, nil)
	// A secret outside the boot directory, reachable by "../" if the server
	// joined paths naively.
	require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(f.bootDir), "secret"), []byte("s3cret"), 0o600))

	c, err := tftp.NewClient(f.srv.TFTPAddr().String())
	require.NoError(t, err)
	c.RequestTSize(true)

	wt, err := c.Receive("undionly.kpxe", "octet")
	require.NoError(t, err)
	var got bytes.Buffer
	_, err = wt.WriteTo(&got)
	require.NoError(t, err)
	require.Equal(t, f.chain, got.Bytes())
	if n, ok := wt.(tftp.IncomingTransfer).Size(); ok {
		require.EqualValues(t, len(f.chain), n, "tsize")
	}

	for _, name := range []string{
		"../etc/passwd", "/etc/passwd", "../secret", "notes.txt",
		"./undionly.kpxe", "/undionly.kpxe", "UNDIONLY.KPXE", "undionly.kpxe/..",
	} {
		_, err := c.Receive(name, "octet")
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "only the iPXE chainload binaries are served", name)
	}
	require.Contains(t, f.logs.String(), "tftp request refused")

	// Nothing can be written.
	rf, err := c.Send("undionly.kpxe", "octet")
	if err == nil {
		_, err = rf.ReadFrom(strings.NewReader("overwrite"))
	}
	require.ErrorContains(t, err, "does not support write requests")
	onDisk, err := os.ReadFile(filepath.Join(f.bootDir, "undionly.kpxe"))
	require.NoError(t, err)
	require.Equal(t, f.chain, onDisk)
}

func TestScriptPerMachineState(t *testing.T) {
	t.Parallel()
	const digest = "sha256:" + "ab12000000000000000000000000000000000000000000000000000000000000"
	const token = "dT0k3n-SINGLE_use.42"
	f := setup(t, ModeProxy, func(c *Config) {
		c.CacheDir = t.TempDir()
		c.FilesDir = t.TempDir()
	})
	f.machines.set(macA, Ramdisk{
		Kernel: digest, Initrd: "ramdisk/initrd.img", Cmdline: "console=ttyS0 bc.mode=ramdisk",
		Token: Secret(token),
	})
	f.machines.set(macB, LocalDisk{})
	base := f.srv.BaseURL() // what the script says
	web := f.web            // where this test reaches it

	get := func(path string) (int, string, http.Header) {
		t.Helper()
		resp, err := http.Get(web + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b), resp.Header
	}

	code, body, hdr := get("/boot/" + macA + ".ipxe")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "no-store", hdr.Get("Cache-Control"))
	require.Equal(t, "#!ipxe\n"+
		"echo Better Compute: booting the ramdisk\n"+
		"initrd --name initrd "+base+"/files/ramdisk/initrd.img || goto failed\n"+
		"kernel "+base+"/files/sha256/ab12000000000000000000000000000000000000000000000000000000000000 initrd=initrd console=ttyS0 bc.mode=ramdisk bc.token="+token+" || goto failed\n"+
		"boot || goto failed\n"+
		":failed\necho Better Compute: ramdisk boot failed; retrying in 30 s\nsleep 30\n"+
		"chain --replace --autofree "+base+"/boot/"+macA+".ipxe\n", body)

	// The MAC may come in any notation.
	code, body2, _ := get("/boot/" + strings.ToUpper(strings.ReplaceAll(macA, ":", "-")) + ".ipxe")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, body, body2)

	code, body, _ = get("/boot/" + macB + ".ipxe")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "#!ipxe\necho Better Compute: booting the local disk\n"+
		"iseq ${platform} efi && exit ||\nsanboot --no-describe --drive 0x80\n", body)

	code, body, _ = get("/boot/" + macC + ".ipxe")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "#!ipxe\necho Better Compute: machine "+macC+" is not known to this site; asking again in 30 s\n"+
		"sleep 30\nchain --replace --autofree "+base+"/boot/"+macC+".ipxe\n", body)

	code, _, _ = get("/boot/not-a-mac.ipxe")
	require.Equal(t, http.StatusBadRequest, code)
	code, _, _ = get("/boot/" + macA)
	require.Equal(t, http.StatusNotFound, code)

	// The Decider was asked for the script phase, with what DHCP had said.
	f.machines.mu.Lock()
	last := f.machines.asked[len(f.machines.asked)-1]
	f.machines.mu.Unlock()
	require.Equal(t, PhaseScript, last.Phase)

	// A token that could change the script is refused, as is a cmdline that
	// would start a new iPXE command; neither reaches the client.
	for _, bad := range []Ramdisk{
		{Kernel: digest, Token: Secret("x\nshell")},
		{Kernel: digest, Token: Secret("${ip}")},
		{Kernel: digest, Cmdline: "quiet\nshell"},
		{Kernel: "../../etc/passwd"},
		{Kernel: "sha256:XYZ"},
		{Kernel: "http://host/a b"},
	} {
		f.machines.set(macA, bad)
		code, body, _ := get("/boot/" + macA + ".ipxe")
		require.Equal(t, http.StatusInternalServerError, code, "%+v", bad)
		require.NotContains(t, body, "shell")
	}

	require.NotContains(t, f.logs.String(), token, "the token must never be logged")
	require.Contains(t, f.logs.String(), "ipxe script served")
}

func TestSecretNeverPrints(t *testing.T) {
	t.Parallel()
	r := Ramdisk{Kernel: "k", Token: Secret("hunter2")}
	var buf bytes.Buffer
	logger := newTestLogger(&buf)
	logger.Info("decision", "boot", r, "token", r.Token)
	for _, s := range []string{buf.String(), r.Token.String(), sprintAll(r)} {
		require.NotContains(t, s, "hunter2")
	}
	require.Equal(t, "hunter2", r.Token.Reveal())
}

func TestScriptInFullModeOnlyForTheLeaseHolder(t *testing.T) {
	t.Parallel()
	// The range is on loopback so the test's HTTP client can take the
	// leased address as its source.
	f := setup(t, ModeFull, func(c *Config) {
		c.ServerIP = netip.MustParseAddr("127.0.0.1")
		c.Subnet = netip.MustParsePrefix("127.0.0.0/8")
		c.RangeStart = netip.MustParseAddr("127.0.0.2")
		c.RangeEnd = netip.MustParseAddr("127.0.0.3")
		c.Router = netip.Addr{}
		c.DNS = nil
	})
	f.machines.set(macA, LocalDisk{})
	f.machines.set(macB, LocalDisk{})
	scriptA := f.srv.BaseURL() + "/boot/" + macA + ".ipxe"
	scriptB := f.srv.BaseURL() + "/boot/" + macB + ".ipxe"
	from := func(src string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	status := func(c *http.Client, url string) int {
		t.Helper()
		resp, err := c.Get(url)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusForbidden, status(from("127.0.0.2"), scriptA), "no lease yet")

	c := newDHCPClient(t, f.srv.DHCPAddr())
	offer := c.exchange(discover(t, macA, ipxe(iana.INTEL_X86PC)...))
	require.Equal(t, scriptA, offer.BootFileName, "iPXE is pointed at its script")
	ack := c.exchange(request(t, offer, ipxe(iana.INTEL_X86PC)...))
	require.Equal(t, dhcpv4.MessageTypeAck, ack.MessageType())
	require.Equal(t, ip("127.0.0.2"), ack.YourIPAddr.To4())

	require.Equal(t, http.StatusOK, status(from("127.0.0.2"), scriptA))
	require.Equal(t, http.StatusForbidden, status(from("127.0.0.3"), scriptA), "another host")
	require.Equal(t, http.StatusForbidden, status(from("127.0.0.2"), scriptB), "B's script is not for A's address")
}

func newTestLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, nil))
}

func sprintAll(v any) string {
	return fmt.Sprintf("%v %+v %#v %s", v, v, v, v)
}

func TestCacheFetchesThroughVerifiesAndServesRanges(t *testing.T) {
	t.Parallel()
	good := bytes.Repeat([]byte("kernel-bytes-"), 10_000)
	sum := sha256.Sum256(good)
	goodHex := hex.EncodeToString(sum[:])
	evilHex := strings.Repeat("e", 64)
	var calls atomic.Int32
	cacheDir := t.TempDir()
	f := setup(t, ModeProxy, func(c *Config) {
		c.CacheDir = cacheDir
		c.Upstream = func(_ context.Context, digest string) (io.ReadCloser, error) {
			calls.Add(1)
			switch digest {
			case "sha256:" + goodHex:
				return io.NopCloser(bytes.NewReader(good)), nil
			case "sha256:" + evilHex:
				// Upstream answers with content that is not what was asked.
				return io.NopCloser(strings.NewReader("tampered")), nil
			}
			return nil, errors.New("no such blob")
		}
	})
	base := f.web

	resp, err := http.Get(base + "/files/sha256/" + goodHex)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, good, body)
	require.Equal(t, `"sha256:`+goodHex+`"`, resp.Header.Get("ETag"))
	cached, err := os.ReadFile(filepath.Join(cacheDir, "sha256", goodHex))
	require.NoError(t, err)
	require.Equal(t, good, cached)

	// A Range request is served from the cache, without upstream.
	req, err := http.NewRequest(http.MethodGet, base+"/files/sha256/"+goodHex, nil)
	require.NoError(t, err)
	req.Header.Set("Range", "bytes=13-25")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusPartialContent, resp.StatusCode)
	require.Equal(t, good[13:26], body)
	require.EqualValues(t, 1, calls.Load(), "the second request hit the cache")

	// Wrong content: refused, and nothing left in the cache.
	for range 2 {
		resp, err = http.Get(base + "/files/sha256/" + evilHex)
		require.NoError(t, err)
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusBadGateway, resp.StatusCode)
		require.NotContains(t, string(body), "tampered")
		_, err = os.Stat(filepath.Join(cacheDir, "sha256", evilHex))
		require.ErrorIs(t, err, os.ErrNotExist)
	}
	require.EqualValues(t, 3, calls.Load(), "a refused blob is fetched again, never served from cache")
	tmp, err := os.ReadDir(filepath.Join(cacheDir, "tmp"))
	require.NoError(t, err)
	require.Empty(t, tmp, "no partial files left")

	for path, want := range map[string]int{
		"/files/sha256/" + strings.Repeat("0", 64): http.StatusBadGateway, // upstream has none
		"/files/sha256/NOTHEX":                     http.StatusBadRequest,
		"/files/../../etc/passwd":                  http.StatusNotFound,
		"/files/anything":                          http.StatusNotFound, // no FilesDir
	} {
		resp, err := http.Get(base + path)
		require.NoError(t, err, path)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, path)
	}
}

func TestFilesDirServesNamedFilesInsideItOnly(t *testing.T) {
	t.Parallel()
	files := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(files, "ramdisk"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(files, "ramdisk", "vmlinuz"), []byte("0123456789"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(files), "outside"), []byte("no"), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(filepath.Dir(files), "outside"), filepath.Join(files, "link")))
	f := setup(t, ModeProxy, func(c *Config) { c.FilesDir = files })

	req, err := http.NewRequest(http.MethodGet, f.web+"/files/ramdisk/vmlinuz", nil)
	require.NoError(t, err)
	req.Header.Set("Range", "bytes=2-4")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusPartialContent, resp.StatusCode)
	require.Equal(t, "234", string(body))

	for _, p := range []string{"/files/link", "/files/ramdisk/../../outside", "/files/%2e%2e/outside"} {
		resp, err := http.Get(f.web + p)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NotEqual(t, "no", string(b), p)
		require.NotEqual(t, http.StatusOK, resp.StatusCode, p)
	}
}
