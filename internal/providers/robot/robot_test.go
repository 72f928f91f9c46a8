package robot_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/bctest/robotemu"
	"github.com/better-compute/better-compute/internal/providers"
	"github.com/better-compute/better-compute/internal/providers/conformance"
	"github.com/better-compute/better-compute/internal/providers/robot"
)

const controlPlane = "cptest"

func authorizedKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	k, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}

// request is a valid create on the emulator's fleet.
func request(t *testing.T) providers.CreateRequest {
	return providers.CreateRequest{
		ServerType: "GEX44",
		Image:      "Ubuntu-2404-noble-amd64-base",
		Location:   "FSN1",
		SSHKeys:    []string{authorizedKey(t)},
	}
}

// newProvider builds the registered hetzner-robot provider against emu.
func newProvider(t *testing.T, emu *robotemu.Emulator, log *slog.Logger) providers.Provider {
	t.Helper()
	f, ok := providers.Lookup(robot.Type)
	require.True(t, ok, "hetzner-robot is not registered")
	settings := map[string]string{"user": emu.User(), "rescue_ssh_address": emu.SSHAddr()}
	require.Empty(t, f.Manifest.Validate(settings, map[string]string{"password": "sealed:robot"}))
	p, err := f.New(providers.Config{
		Endpoint:       emu.URL(),
		Credentials:    map[string]string{"password": emu.Password()},
		Settings:       settings,
		ControlPlaneID: controlPlane,
		Logger:         log,
	})
	require.NoError(t, err)
	return p
}

type fixture struct {
	emu  *robotemu.Emulator
	p    providers.Provider
	ctx  context.Context
	logs *strings.Builder
}

func setup(t *testing.T, opts robotemu.Options) fixture {
	t.Helper()
	emu := robotemu.New(t, opts)
	logs := &strings.Builder{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return fixture{emu: emu, p: newProvider(t, emu, log), ctx: ctx, logs: logs}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, conformance.Harness{
		New: func(t *testing.T, log *slog.Logger) (providers.Provider, conformance.Emulator) {
			emu := robotemu.New(t, robotemu.Options{})
			return newProvider(t, emu, log), emu
		},
		Request: request(t),
		Claims:  true,
	})
}

func serverNumber(t *testing.T, s providers.Server) int {
	t.Helper()
	n, err := strconv.Atoi(s.ID)
	require.NoError(t, err, "server id %q", s.ID)
	return n
}

// The join token reaches the server only as the stdin of an SSH command:
// never in a command line, a webservice request (path, query or form), a
// log line or an error; and a released server is free for the next create.
func TestJoinTokenOnlyOverStdinAndReleaseFreesTheServer(t *testing.T) {
	t.Parallel()
	f := setup(t, robotemu.Options{Servers: 2})
	const token = "bcjoin_robot_stdin_only_secret"
	r := request(t)
	r.InstanceID, r.Name = "ins_stdin", "gpu-node-1"
	r.UserData = "#cloud-config\nwrite_files:\n- path: /etc/bcd/join-token\n  content: " + token + "\n"
	s, err := f.p.Create(f.ctx, r)
	require.NoError(t, err)
	require.Equal(t, providers.StatusRunning, s.Status)
	require.Equal(t, "bc-"+controlPlane+"-ins_stdin", s.Name)
	require.Equal(t, map[string]string{providers.InstanceLabel: "ins_stdin", providers.ManagedLabel: controlPlane}, s.Labels)
	n := serverNumber(t, s)

	st, ok := f.emu.Server(n)
	require.True(t, ok)
	require.Equal(t, "Ubuntu-2404-noble-amd64-base", st.Image)
	require.Equal(t, "gpu-node-1", st.Hostname)
	require.Contains(t, st.PostInstall, token, "installimage's post-install script seeds the user data")
	require.Contains(t, st.PostInstall, `rm -f -- "$0"`, "and removes its copy in the new system")
	require.False(t, st.InRescue, "the server boots the installed system at the end")
	require.Equal(t, []string{"hw", "hw"}, st.Resets, "one reset into the rescue system, one out of it")

	require.Contains(t, f.emu.StdinOf(n), token)
	execs := f.emu.Execs(n)
	require.NotEmpty(t, execs)
	for _, x := range execs {
		require.NotContains(t, x.Command, token, "a command line carries the join token")
		require.Zero(t, x.Exit, "%s failed", x.Command)
	}
	secrets := append([]string{token, f.emu.Password()}, f.emu.RescuePasswords()...)
	for _, req := range f.emu.Requests() {
		for _, secret := range []string{token, f.emu.Password()} {
			require.NotContains(t, req.Path+"?"+req.Query+" "+req.Body, secret, "%s %s carries a secret", req.Method, req.Path)
		}
	}
	for _, secret := range secrets {
		require.NotContains(t, f.logs.String(), secret)
	}

	require.NoError(t, f.p.Delete(f.ctx, r.InstanceID))
	st, _ = f.emu.Server(n)
	require.Empty(t, st.Name, "a released server is unnamed again")
	require.False(t, st.On, "a released server is off: its old system no longer runs as a node")
	require.False(t, st.RescueActive)
	require.Zero(t, f.emu.Servers())

	// Two servers: the released one is the lowest free number again.
	r2 := request(t)
	r2.InstanceID, r2.Name = "ins_next", "gpu-node-2"
	s2, err := f.p.Create(f.ctx, r2)
	require.NoError(t, err)
	require.Equal(t, s.ID, s2.ID, "the next create claims the released server")
	require.Equal(t, providers.StatusRunning, s2.Status, "a create powers on a released server")
	require.Equal(t, 1, f.emu.Servers())
	st, _ = f.emu.Server(n)
	require.Empty(t, st.PostInstall, "a create without user data writes no seed")
}

// A server another claimer named between the claim and its read-back is
// left to it: the create takes the next free one.
func TestClaimRaceTakesTheNextServer(t *testing.T) {
	t.Parallel()
	f := setup(t, robotemu.Options{Servers: 4})
	f.emu.StealNextClaim()
	r := request(t)
	r.InstanceID = "ins_race"
	s, err := f.p.Create(f.ctx, r)
	require.NoError(t, err)
	require.Equal(t, robotemu.FirstServerNumber+1, serverNumber(t, s))
	st, _ := f.emu.Server(robotemu.FirstServerNumber)
	require.Equal(t, "claimed-elsewhere", st.Name)
	require.Empty(t, st.Image, "the lost server was not touched")
}

// Servers an operator named are never claimed, never listed, and a create
// matches the request's product and location.
func TestClaimsOnlyFreeServersOfTheRequest(t *testing.T) {
	t.Parallel()
	f := setup(t, robotemu.Options{Servers: 8, Named: map[int]string{robotemu.FirstServerNumber: "db-1"}})
	r := request(t)
	r.InstanceID = "ins_gpu"
	s, err := f.p.Create(f.ctx, r)
	require.NoError(t, err)
	require.Equal(t, robotemu.FirstServerNumber+1, serverNumber(t, s))
	require.Equal(t, "FSN1", s.Location)

	r.InstanceID, r.ServerType, r.Location = "ins_cpu", "EX44", "hel1"
	s, err = f.p.Create(f.ctx, r)
	require.NoError(t, err)
	require.Equal(t, "EX44", s.ServerType)
	require.Equal(t, "HEL1", s.Location)

	list, err := f.p.List(f.ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	st, _ := f.emu.Server(robotemu.FirstServerNumber)
	require.Equal(t, "db-1", st.Name)

	r.InstanceID, r.ServerType = "ins_none", "GEX130"
	_, err = f.p.Create(f.ctx, r)
	require.Equal(t, providers.KindQuota, providers.KindOf(err), "%v", err)
}

// A create whose install failed leaves the claim; the retry installs the
// same server instead of claiming another.
func TestCreateResumesAFailedInstall(t *testing.T) {
	t.Parallel()
	f := setup(t, robotemu.Options{Servers: 3})
	r := request(t)
	r.InstanceID = "ins_resume"
	r.UserData = "#cloud-config\nbcd: bcjoin_resume_secret_token\n"
	r.Image = "No-Such-Image"
	_, err := f.p.Create(f.ctx, r)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "bcjoin_resume_secret_token")
	require.Contains(t, err.Error(), "installimage exited 1")
	s, err := f.p.Get(f.ctx, r.InstanceID)
	require.NoError(t, err)
	require.Equal(t, providers.StatusStarting, s.Status, "a claim whose install has not finished")

	r.Image = "Debian-1208-bookworm-amd64-base"
	s2, err := f.p.Create(f.ctx, r)
	require.NoError(t, err)
	require.Equal(t, s.ID, s2.ID)
	require.Equal(t, 1, f.emu.Servers())
	st, _ := f.emu.Server(serverNumber(t, s2))
	require.Equal(t, "Debian-1208-bookworm-amd64-base", st.Image)
}

func TestRateLimitRetryAfter(t *testing.T) {
	t.Parallel()
	f := setup(t, robotemu.Options{})
	f.emu.RateLimitNext(1)
	_, err := f.p.List(f.ctx)
	require.True(t, errors.Is(err, providers.ErrRateLimited), "%v", err)
	ok, after := providers.Retryable(err)
	require.True(t, ok)
	require.Equal(t, 18*time.Second, after, "3600 s / 200 requests")
}

func TestOffers(t *testing.T) {
	t.Parallel()
	f := setup(t, robotemu.Options{})
	offers, err := f.p.Offers(f.ctx)
	require.NoError(t, err)
	require.Len(t, offers, f.emu.Offers())
	var gex providers.Offer
	for _, o := range offers {
		if o.ServerType == "GEX44" && o.Location == "FSN1" {
			gex = o
		}
	}
	require.Equal(t, providers.Offer{
		ServerType: "GEX44", Location: "FSN1", MemoryGiB: 64, DiskGiB: 3840, GPUs: 1,
		GPUModel: "NVIDIA RTX 4000 SFF Ada Generation", PriceHourly: "0.2521", PriceMonthly: "184.0000",
		Currency: "EUR", Available: true,
	}, gex)
}

func TestManifestAndConfig(t *testing.T) {
	t.Parallel()
	problems := robot.Manifest.Validate(map[string]string{"password": "inline"}, nil)
	require.Contains(t, problems, "password")
	require.Contains(t, problems, "user")
	_, err := robot.New(providers.Config{Credentials: map[string]string{"password": "pw123456"}, ControlPlaneID: "cp"})
	require.Equal(t, providers.KindInvalid, providers.KindOf(err))
}
