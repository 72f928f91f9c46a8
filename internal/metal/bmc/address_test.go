package bmc_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/metal/bmc"
)

func TestParseAddress(t *testing.T) {
	t.Parallel()
	good := []struct {
		driver, address string
		want            bmc.Endpoint
		str             string
	}{
		{"ipmi", "10.0.0.5", bmc.Endpoint{Scheme: "ipmi", Host: "10.0.0.5", Port: 623}, "10.0.0.5:623"},
		{"ipmi", "10.0.0.5:6230", bmc.Endpoint{Scheme: "ipmi", Host: "10.0.0.5", Port: 6230}, "10.0.0.5:6230"},
		{"ipmi", "bmc-rack1-u12.site.example", bmc.Endpoint{Scheme: "ipmi", Host: "bmc-rack1-u12.site.example", Port: 623}, "bmc-rack1-u12.site.example:623"},
		{"ipmi", "[fd00::5]:623", bmc.Endpoint{Scheme: "ipmi", Host: "fd00::5", Port: 623}, "[fd00::5]:623"},
		{"ipmi", "fd00::5", bmc.Endpoint{Scheme: "ipmi", Host: "fd00::5", Port: 623}, "[fd00::5]:623"},
		{"redfish", "https://10.0.0.6", bmc.Endpoint{Scheme: "https", Host: "10.0.0.6", Port: 443}, "https://10.0.0.6:443"},
		{"redfish", "https://10.0.0.6:8443/", bmc.Endpoint{Scheme: "https", Host: "10.0.0.6", Port: 8443}, "https://10.0.0.6:8443"},
		{"redfish", "HTTP://127.0.0.1:8000", bmc.Endpoint{Scheme: "http", Host: "127.0.0.1", Port: 8000}, "http://127.0.0.1:8000"},
		{"redfish", "10.0.0.6", bmc.Endpoint{Scheme: "https", Host: "10.0.0.6", Port: 443}, "https://10.0.0.6:443"},
		{"redfish", "bmc1.example:8443", bmc.Endpoint{Scheme: "https", Host: "bmc1.example", Port: 8443}, "https://bmc1.example:8443"},
		{"redfish", "https://[fd00::6]", bmc.Endpoint{Scheme: "https", Host: "fd00::6", Port: 443}, "https://[fd00::6]:443"},
	}
	for _, tc := range good {
		got, err := bmc.ParseAddress(tc.driver, tc.address)
		require.NoError(t, err, "%s %s", tc.driver, tc.address)
		require.Equal(t, tc.want, got, "%s %s", tc.driver, tc.address)
		require.Equal(t, tc.str, got.String())
	}

	bad := []struct{ driver, address, why string }{
		{"ipmi", "", "empty"},
		{"ipmi", "https://10.0.0.5", "not a URL"},
		{"ipmi", "ipmi://10.0.0.5", "not a URL"},
		{"ipmi", "10.0.0.5/24", "no '/'"},
		{"ipmi", "admin@10.0.0.5", "no '/', '@'"},
		{"ipmi", "10.0.0.5:0", "port"},
		{"ipmi", "10.0.0.5:99999", "port"},
		{"ipmi", "10.0.0.5:http", "port"},
		{"ipmi", "10.0.0.5 ; reboot", "space"},
		{"ipmi", "10.0.0.5\n", "control character"},
		{"ipmi", "under_score.example", "neither an IP address nor a DNS name"},
		{"ipmi", "-bad.example", "neither an IP address nor a DNS name"},
		{"ipmi", "[10.0.0.5]:623", "not an IPv6 address"},
		{"ipmi", "[fd00::5", "unclosed"},
		{"redfish", "ftp://10.0.0.6", "not ftp://"},
		{"redfish", "file:///etc/passwd", "not file://"},
		{"redfish", "https://admin:pw@10.0.0.6", "must not carry a user"},
		{"redfish", "https://10.0.0.6/redfish/v1", "must not carry a path"},
		{"redfish", "https://10.0.0.6/../../other", "must not carry a path"},
		{"redfish", "https://10.0.0.6?x=1", "query"},
		{"redfish", "https://10.0.0.6#frag", "query or a fragment"},
		{"redfish", "https://", "host is empty"},
		{"redfish", "10.0.0.6/redfish", "plain host[:port]"},
		{"redfish", "https://10.0.0.6:0", "port"},
	}
	for _, tc := range bad {
		_, err := bmc.ParseAddress(tc.driver, tc.address)
		require.ErrorIs(t, err, bmc.ErrInvalidAddress, "%s %q", tc.driver, tc.address)
		require.Contains(t, err.Error(), tc.why, "%s %q", tc.driver, tc.address)
		_, err = bmc.New(tc.driver, tc.address, bmc.NewCredentials("admin", "pw"), bmc.Options{})
		require.ErrorIs(t, err, bmc.ErrInvalidAddress, "New refuses it too: %s %q", tc.driver, tc.address)
	}
	_, err := bmc.ParseAddress("ilo", "10.0.0.1")
	require.ErrorIs(t, err, bmc.ErrUnsupported)
}

func TestCredentialsAreChecked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		driver, user, pass, why string
	}{
		{"redfish", "", "pw", "user name is empty"},
		{"ipmi", "", "pw", "user name is empty"},
		{"redfish", "ad:min", "pw", "':'"},
		{"ipmi", "admin", "this-password-is-too-long", "at most 20 bytes"},
		{"ipmi", "a-user-name-longer-than-sixteen", "pw", "user names are at most"},
	} {
		_, err := bmc.New(tc.driver, "127.0.0.1:623", bmc.NewCredentials(tc.user, tc.pass), bmc.Options{})
		require.ErrorIs(t, err, bmc.ErrInvalidArgument, "%+v", tc)
		require.Contains(t, err.Error(), tc.why)
		require.NotContains(t, err.Error(), tc.pass)
	}
}
