package robotemu

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

type client struct {
	t *testing.T
	e *Emulator
}

func (c client) do(method, path string, form url.Values) (int, map[string]any) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.e.URL()+path, body)
	require.NoError(c.t, err)
	req.SetBasicAuth(c.e.User(), c.e.Password())
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	var out map[string]any
	if strings.HasPrefix(string(raw), "{") {
		require.NoError(c.t, json.Unmarshal(raw, &out))
	}
	return resp.StatusCode, out
}

func TestWebserviceErrorsAndAuth(t *testing.T) {
	t.Parallel()
	e := New(t, Options{Servers: 2})
	c := client{t, e}
	status, body := c.do("GET", "/server/1", nil)
	require.Equal(t, 404, status)
	require.Equal(t, "SERVER_NOT_FOUND", body["error"].(map[string]any)["code"])

	req, _ := http.NewRequest("GET", e.URL()+"/server", nil)
	req.SetBasicAuth(e.User(), "wrong")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 401, resp.StatusCode)

	e.RateLimitNext(1)
	status, body = c.do("GET", "/server", nil)
	require.Equal(t, 403, status)
	require.EqualValues(t, 3600, body["error"].(map[string]any)["interval"])

	status, _ = c.do("POST", "/reset/"+strconv.Itoa(FirstServerNumber), url.Values{"type": {"kick"}})
	require.Equal(t, 400, status)
}

// A rescue activation is good for one boot; its password logs in to the
// rescue SSH, which runs installimage from a config written over stdin.
func TestRescueInstall(t *testing.T) {
	t.Parallel()
	e := New(t, Options{Servers: 1})
	c := client{t, e}
	n := strconv.Itoa(FirstServerNumber)
	status, body := c.do("POST", "/boot/"+n+"/rescue", url.Values{"os": {"linux"}})
	require.Equal(t, 200, status)
	rescue := body["rescue"].(map[string]any)
	password := rescue["password"].(string)
	status, _ = c.do("POST", "/boot/"+n+"/rescue", url.Values{"os": {"linux"}})
	require.Equal(t, 409, status, "a second activation")

	cfg := &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.Password(password)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second}
	_, err := ssh.Dial("tcp", e.SSHAddr(), cfg)
	require.Error(t, err, "the rescue answers only once the server booted it")

	status, _ = c.do("POST", "/reset/"+n, url.Values{"type": {"hw"}})
	require.Equal(t, 200, status)
	st, _ := e.Server(FirstServerNumber)
	require.True(t, st.InRescue)
	require.False(t, st.RescueActive, "the activation was used up")

	cl, err := ssh.Dial("tcp", e.SSHAddr(), cfg)
	require.NoError(t, err)
	defer cl.Close()
	run := func(cmd, stdin string) (string, error) {
		s, err := cl.NewSession()
		require.NoError(t, err)
		defer s.Close()
		s.Stdin = strings.NewReader(stdin)
		out, err := s.Output(cmd)
		return string(out), err
	}
	conf := "DRIVE1 /dev/nvme0n1\nHOSTNAME n1\nPART / ext4 all\nIMAGE /root/.oldroot/nfs/images/Ubuntu-2404-noble-amd64-base.tar.gz\n"
	_, err = run("cat > /tmp/c", conf)
	require.NoError(t, err)
	_, err = run("installimage -a -c /tmp/c", "")
	require.NoError(t, err)
	_, err = run("reboot", "")
	require.Error(t, err)
	st, _ = e.Server(FirstServerNumber)
	require.Equal(t, "Ubuntu-2404-noble-amd64-base", st.Image)
	require.Equal(t, "n1", st.Hostname)
	require.Equal(t, conf, e.StdinOf(FirstServerNumber))
	require.Equal(t, 127, e.Execs(FirstServerNumber)[2].Exit)

	status, body = c.do("GET", "/reset/"+n, nil)
	require.Equal(t, 200, status)
	require.Equal(t, "running", body["reset"].(map[string]any)["operating_status"])
	c.do("POST", "/reset/"+n, url.Values{"type": {"power_long"}})
	_, body = c.do("GET", "/reset/"+n, nil)
	require.Equal(t, "shut off", body["reset"].(map[string]any)["operating_status"])
}
