package envelope_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/envelope"
)

// TestClientAddr: X-Forwarded-For counts only through trusted proxies, read
// from the right; a client's own header never names the client.
func TestClientAddr(t *testing.T) {
	t.Parallel()
	trusted, err := envelope.ParseTrustedProxies("10.0.0.0/8, 192.0.2.7, 2001:db8::/32")
	require.NoError(t, err)
	xff := func(v ...string) http.Header {
		h := http.Header{}
		for _, s := range v {
			h.Add("X-Forwarded-For", s)
		}
		return h
	}
	for _, c := range []struct {
		name, peer string
		h          http.Header
		want       string
	}{
		{"direct client", "198.51.100.1:5555", nil, "198.51.100.1"},
		{"direct client lying", "198.51.100.1:5555", xff("203.0.113.9"), "198.51.100.1"},
		{"through a proxy", "10.1.2.3:443", xff("203.0.113.9"), "203.0.113.9"},
		{"client's own header before the proxy's", "10.1.2.3:443", xff("1.1.1.1, 203.0.113.9"), "203.0.113.9"},
		{"two proxies", "10.1.2.3:443", xff("203.0.113.9, 192.0.2.7"), "203.0.113.9"},
		{"headers split", "10.1.2.3:443", xff("203.0.113.9", "10.9.9.9"), "203.0.113.9"},
		{"all hops trusted", "10.1.2.3:443", xff("10.4.4.4"), "10.4.4.4"},
		{"garbage hop", "10.1.2.3:443", xff("not-an-ip, 203.0.113.9"), "203.0.113.9"},
		{"garbage last hop", "10.1.2.3:443", xff("203.0.113.9, junk"), "10.1.2.3"},
		{"proxy without header", "10.1.2.3:443", nil, "10.1.2.3"},
		{"ipv6 through a proxy", "[2001:db8::1]:443", xff("2001:db9::5"), "2001:db9::5"},
		{"mapped ipv4 peer", "[::ffff:10.1.2.3]:443", xff("203.0.113.9"), "203.0.113.9"},
		{"in-process", "", xff("203.0.113.9"), ""},
	} {
		require.Equal(t, c.want, envelope.ClientAddr(c.peer, c.h, trusted), c.name)
	}
	require.Equal(t, "203.0.113.9", envelope.ClientAddr("203.0.113.9:1", xff("1.1.1.1"), nil), "no proxies trusted")
	_, err = envelope.ParseTrustedProxies("10.0.0.0/33")
	require.Error(t, err)
	_, err = envelope.ParseTrustedProxies("proxy.example")
	require.Error(t, err)
}
