package redfish_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Debian's own Redfish clients must accept the emulator: it is proof that
// it follows the schema rather than what our driver happens to expect.

func TestRedfishtoolAcceptsTheService(t *testing.T) {
	t.Parallel()
	tool, err := exec.LookPath("redfishtool")
	if err != nil {
		t.Skip("redfishtool is not installed (apt-get install redfishtool); CI installs it")
	}
	f := setup(t)
	host := strings.TrimPrefix(f.srv.URL, "http://")
	run := func(auth string, args ...string) (string, error) {
		// -S Never: the test server speaks plain HTTP on loopback.
		cmd := exec.CommandContext(context.Background(), tool,
			append([]string{"-r", host, "-u", "admin", "-p", "pw-7f3a", "-S", "Never", "-A", auth}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, auth := range []string{"Basic", "Session"} {
		out, err := run(auth, "Systems")
		require.NoError(t, err, out)
		var coll map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &coll), out)
		require.EqualValues(t, 1, coll["Members@odata.count"])
	}

	out, err := run("Session", "Systems", "reset", "On")
	require.NoError(t, err, out)
	on, err := f.power.IsOn(context.Background())
	require.NoError(t, err)
	require.True(t, on, "redfishtool's reset On powered the machine")
	require.Zero(t, f.svc.Sessions(), "redfishtool logged out")

	out, err = run("Basic", "Systems", "setBootOverride", "Once", "Pxe")
	require.NoError(t, err, out)
	target, enabled := f.svc.BootOverride()
	require.Equal(t, "Pxe", target)
	require.Equal(t, "Once", enabled)

	out, err = run("Basic", "-P", "PowerState", "Systems", "get")
	require.NoError(t, err, out)
	require.Contains(t, out, `"PowerState": "On"`)

	out, err = run("Basic", "Systems", "reset", "ForceOff")
	require.NoError(t, err, out)
	on, err = f.power.IsOn(context.Background())
	require.NoError(t, err)
	require.False(t, on, "redfishtool's reset ForceOff powered the machine off")

	// A wrong password is a 401 redfishtool reports as such.
	cmd := exec.Command(tool, "-r", host, "-u", "admin", "-p", "wrong", "-S", "Never", "Systems")
	bad, err := cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(bad), "401")
}

const sushyScript = `
import sys, sushy
url, user, password = sys.argv[1:4]
c = sushy.Sushy(url + '/redfish/v1', username=user, password=password, verify=False)
s = c.get_system('/redfish/v1/Systems/1')
print('before', s.power_state.value)
s.reset_system(sushy.RESET_ON)
s.set_system_boot_options(sushy.BOOT_SOURCE_TARGET_PXE, enabled=sushy.BOOT_SOURCE_ENABLED_CONTINUOUS)
s.refresh()
print('after', s.power_state.value, s.boot.target.value, s.boot.enabled.value)
vm = c.get_manager('/redfish/v1/Managers/BMC').virtual_media.get_members()[0]
vm.insert_media('http://192.0.2.1/ramdisk.iso')
vm.refresh()
print('media', vm.image, vm.inserted)
`

func TestSushyAcceptsTheService(t *testing.T) {
	t.Parallel()
	python := ""
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import sushy").Run() == nil {
			python = p
			break
		}
	}
	if python == "" {
		t.Skip("no python3 with sushy (apt-get install python3-sushy); CI installs it")
	}
	f := setup(t)
	out, err := exec.Command(python, "-c", sushyScript, f.srv.URL, "admin", "pw-7f3a").CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "before Off")
	require.Contains(t, string(out), "after On Pxe Continuous")
	require.Contains(t, string(out), "media http://192.0.2.1/ramdisk.iso True")
	target, enabled := f.svc.BootOverride()
	require.Equal(t, "Pxe", target)
	require.Equal(t, "Continuous", enabled)
	require.Zero(t, f.svc.Sessions(), "sushy logged out")
}
