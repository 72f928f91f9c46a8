package hcloud_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest/hcloudemu"
	"github.com/better-compute/better-compute/internal/providers"
	"github.com/better-compute/better-compute/internal/providers/conformance"
	"github.com/better-compute/better-compute/internal/providers/hcloud"
)

const controlPlane = "cp-test"

// request is a valid create on the emulator's catalog.
var request = providers.CreateRequest{
	ServerType: "cx22",
	Image:      "ubuntu-24.04",
	Location:   "fsn1",
	Labels:     map[string]string{"bettercompute.io/pool": "gpu-a"},
}

// newProvider builds the registered hetzner-cloud provider against emu.
func newProvider(t *testing.T, emu *hcloudemu.Server, log *slog.Logger, settings map[string]string) providers.Provider {
	t.Helper()
	f, ok := providers.Lookup(hcloud.Type)
	require.True(t, ok, "hetzner-cloud is not registered")
	p, err := f.New(providers.Config{
		Endpoint:       emu.Endpoint(),
		Credentials:    map[string]string{"token": emu.Token()},
		Settings:       settings,
		ControlPlaneID: controlPlane,
		Logger:         log,
	})
	require.NoError(t, err)
	return p
}

type fixture struct {
	emu *hcloudemu.Server
	p   providers.Provider
	ctx context.Context
}

func setup(t *testing.T, settings map[string]string) fixture {
	t.Helper()
	emu := hcloudemu.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return fixture{emu: emu, p: newProvider(t, emu, nil, settings), ctx: ctx}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, conformance.Harness{
		New: func(t *testing.T, log *slog.Logger) (providers.Provider, conformance.Emulator) {
			emu := hcloudemu.New(t)
			return newProvider(t, emu, log, nil), emu
		},
		Request: request,
	})
}

func TestCreateLabelsAndUserData(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	r := request
	r.InstanceID, r.Name = "ins_labels", "bc-labels"
	r.UserData = "#cloud-config\nruncmd:\n- bcd join --token bcjoin_labels_secret\n"
	s, err := f.p.Create(f.ctx, r)
	require.NoError(t, err)
	require.Equal(t, providers.StatusStarting, s.Status)
	require.Equal(t, "cx22", s.ServerType)
	require.Equal(t, "fsn1", s.Location)
	require.NotEmpty(t, s.IPv4)
	require.True(t, strings.HasSuffix(s.IPv6, "::1"), "IPv6 %q is not the /64's first address", s.IPv6)

	got, ok := f.emu.Find("bc-labels")
	require.True(t, ok)
	want := map[string]string{
		providers.InstanceLabel: "ins_labels",
		providers.ManagedLabel:  controlPlane,
		"bettercompute.io/pool": "gpu-a",
	}
	require.Equal(t, want, got.Labels)
	require.Equal(t, r.UserData, got.UserData, "the join token travels in the user data")
	require.Equal(t, "ubuntu-24.04", got.Image)
}

func TestCreateRejectsOwnLabelsAndBadIDs(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for _, c := range []struct {
		name string
		edit func(r *providers.CreateRequest)
	}{
		{"spoofed instance label", func(r *providers.CreateRequest) {
			r.Labels = map[string]string{providers.InstanceLabel: "ins_other"}
		}},
		{"instance id no label value", func(r *providers.CreateRequest) { r.InstanceID = "ins/with/slashes" }},
		{"no server type", func(r *providers.CreateRequest) { r.ServerType = "" }},
		{"unknown server type", func(r *providers.CreateRequest) { r.ServerType = "cx999" }},
	} {
		r := request
		r.InstanceID, r.Name = "ins_bad", "bc-bad"
		c.edit(&r)
		_, err := f.p.Create(f.ctx, r)
		require.ErrorIs(t, err, providers.ErrInvalid, c.name)
	}
	require.Zero(t, f.emu.Servers())
}

func TestListKeepsControlPlanesApart(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	other, err := hcloud.New(providers.Config{
		Endpoint: f.emu.Endpoint(), Credentials: map[string]string{"token": f.emu.Token()}, ControlPlaneID: "cp-other",
	})
	require.NoError(t, err)
	r := request
	r.InstanceID, r.Name = "ins_mine", "bc-mine"
	_, err = f.p.Create(f.ctx, r)
	require.NoError(t, err)
	r.InstanceID, r.Name = "ins_theirs", "bc-theirs"
	_, err = other.Create(f.ctx, r)
	require.NoError(t, err)

	list, err := f.p.List(f.ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "ins_mine", list[0].InstanceID)
	_, err = f.p.Get(f.ctx, "ins_theirs")
	require.ErrorIs(t, err, providers.ErrNotFound, "another control plane's instance is not ours")
}

func TestOffersCarryPrices(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	offers, err := f.p.Offers(f.ctx)
	require.NoError(t, err)
	require.Len(t, offers, f.emu.Offers())
	var cx22 *providers.Offer
	for i, o := range offers {
		if o.ServerType == "cx22" && o.Location == "fsn1" {
			cx22 = &offers[i]
		}
	}
	require.NotNil(t, cx22)
	want := providers.Offer{
		ServerType: "cx22", Location: "fsn1", VCPU: 2, MemoryGiB: 4, DiskGiB: 40,
		PriceHourly: "0.0060000000", PriceMonthly: "3.7900000000", Currency: "EUR", Available: true,
	}
	require.Equal(t, want, *cx22)
}

func TestRateLimitRetryAfter(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.emu.RateLimitNext(1)
	_, err := f.p.List(f.ctx)
	require.ErrorIs(t, err, providers.ErrRateLimited)
	ok, after := providers.Retryable(err)
	require.True(t, ok)
	// The budget refills a request a second: the wait is about that.
	require.GreaterOrEqual(t, after, time.Second)
	require.LessOrEqual(t, after, 2*time.Second)
	require.Equal(t, 1, f.emu.Requests(), "the client must not retry a 429 itself")
}

func TestSSHKeysAndNetwork(t *testing.T) {
	t.Parallel()
	emu := hcloudemu.New(t)
	keyID := emu.AddSSHKey("ops", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl ops@example")
	netID := emu.AddNetwork("fleet", "10.0.0.0/16")
	p := newProvider(t, emu, nil, map[string]string{"network": "fleet", "location": "nbg1"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := request
	r.Location = ""
	r.InstanceID, r.Name, r.SSHKeys = "ins_keys", "bc-keys", []string{"ops"}
	s, err := p.Create(ctx, r)
	require.NoError(t, err)
	require.Equal(t, "nbg1", s.Location, "the account's default location")
	got, ok := emu.Find("bc-keys")
	require.True(t, ok)
	require.Equal(t, []int64{keyID}, got.SSHKeys)
	require.Equal(t, []int64{netID}, got.Networks)

	r.InstanceID, r.Name, r.SSHKeys = "ins_nokey", "bc-nokey", []string{"missing"}
	_, err = p.Create(ctx, r)
	require.ErrorIs(t, err, providers.ErrInvalid)
}

func TestManifest(t *testing.T) {
	t.Parallel()
	f, ok := providers.Lookup(hcloud.Type)
	require.True(t, ok)
	require.Empty(t, f.Manifest.Validate(map[string]string{"location": "fsn1"}, map[string]string{"token": "secret/hcloud"}))
	problems := f.Manifest.Validate(map[string]string{"token": "inline"}, nil)
	require.Contains(t, problems, "token")
	_, err := f.New(providers.Config{ControlPlaneID: controlPlane})
	require.ErrorIs(t, err, providers.ErrInvalid)
}

func TestErrorsNeverCarryTheToken(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.emu.FailNext(409, "name taken; token "+f.emu.Token())
	r := request
	r.InstanceID, r.Name = "ins_conflict", "bc-conflict"
	_, err := f.p.Create(f.ctx, r)
	require.Error(t, err)
	require.NotContains(t, err.Error(), f.emu.Token())
	var pe *providers.Error
	require.True(t, errors.As(err, &pe))
	require.Equal(t, providers.KindConflict, pe.Kind)
}

// TestHcloudCLIAgainstEmulator drives Debian's hcloud CLI (hcloud-cli)
// against the emulator: proof that it speaks the real API, not only what
// hcloud-go v2 expects.
func TestHcloudCLIAgainstEmulator(t *testing.T) {
	if os.Getenv("BC_HCLOUD_CLI") != "1" {
		t.Skip("set BC_HCLOUD_CLI=1 to run the hcloud CLI against the emulator (needs /usr/bin/hcloud: apt-get install hcloud-cli)")
	}
	bin, err := exec.LookPath("hcloud")
	require.NoError(t, err, "BC_HCLOUD_CLI=1 but no hcloud binary: apt-get install hcloud-cli")
	emu := hcloudemu.New(t)
	// The CLI lists one page of per_page=50, the API's own cap, and trusts
	// it to hold everything: give it the real cap (hcloud-go's paging is
	// what the conformance suite's small pages check).
	emu.SetPageSize(50)
	dir := t.TempDir()
	hcloudCmd := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(),
			"HCLOUD_TOKEN="+emu.Token(),
			"HCLOUD_ENDPOINT="+emu.Endpoint(),
			"HCLOUD_CONFIG="+filepath.Join(dir, "cli.toml"),
			"HCLOUD_CONTEXT=",
		)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "hcloud %s: %s", strings.Join(args, " "), providers.Redact(string(out), emu.Token()))
		return string(out)
	}

	var types []struct {
		Name   string `json:"name"`
		Prices []struct {
			Location string `json:"location"`
		} `json:"prices"`
	}
	require.NoError(t, json.Unmarshal([]byte(hcloudCmd("server-type", "list", "-o", "json")), &types))
	names := map[string]bool{}
	for _, st := range types {
		names[st.Name] = true
	}
	require.True(t, names["cx22"] && names["ccx23"], "server types across pages: %v", names)

	hcloudCmd("server", "create", "--name", "x", "--type", "cx22", "--image", "ubuntu-24.04",
		"--location", "fsn1", "--label", providers.InstanceLabel+"=ins_cli")
	var servers []struct {
		Name   string            `json:"name"`
		Status string            `json:"status"`
		Labels map[string]string `json:"labels"`
	}
	require.NoError(t, json.Unmarshal([]byte(hcloudCmd("server", "list", "-o", "json")), &servers))
	require.Len(t, servers, 1)
	require.Equal(t, "x", servers[0].Name)
	require.Equal(t, "running", servers[0].Status)
	require.Equal(t, "ins_cli", servers[0].Labels[providers.InstanceLabel])

	hcloudCmd("server", "delete", "x")
	require.Zero(t, emu.Servers())
}
