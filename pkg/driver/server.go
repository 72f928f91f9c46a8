package driver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	driverv1 "github.com/better-compute/better-compute/gen/bettercompute/driver/v1"
)

// ServeBMC serves impl to the host that started this process and returns
// when the host is done with it. It is all a driver binary's main does:
//
//	func main() { driver.ServeBMC(myDriver{}) }
//
// Run by hand (without the host's handshake), the binary says it is a
// driver and exits with status 1.
func ServeBMC(impl BMCDriver) {
	serve(impl, MagicCookieValue, ProtocolVersion)
}

// serve is ServeBMC with the handshake's cookie and version as
// parameters, so tests can build a driver that speaks another one.
func serve(impl BMCDriver, cookieValue string, version int) {
	srv := &server{impl: impl, version: version, sessions: map[string]*session{}}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  handshake(cookieValue),
		VersionedPlugins: map[int]plugin.PluginSet{version: {pluginName: &bmcPlugin{srv: srv}}},
		GRPCServer:       plugin.DefaultGRPCServer,
		// go-plugin's own lines (hclog JSON on stderr, which the host
		// parses into its logger); its debug chatter stays out.
		Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: os.Stderr, JSONFormat: true}),
	})
}

// server answers BMCService for one driver process: every BMC the host
// opened is a session, found by its id.
type server struct {
	driverv1.UnimplementedBMCServiceServer
	impl    BMCDriver
	version int

	mu       sync.Mutex
	sessions map[string]*session
}

type session struct {
	bmc     BMC
	address string
	// sc holds the session's passwords, scrubbed from every error the
	// driver returns before it crosses to the host.
	sc   *scrubber
	name string
}

func (s *server) Info(context.Context, *driverv1.InfoRequest) (*driverv1.InfoResponse, error) {
	info := s.impl.Info()
	info.ProtocolVersion = s.version
	return infoToWire(info), nil
}

func (s *server) Open(ctx context.Context, r *driverv1.OpenRequest) (*driverv1.OpenResponse, error) {
	t := targetFromWire(r)
	sc := newScrubber()
	sc.add(t.Password)
	name := s.impl.Info().Name
	b, err := s.impl.Open(ctx, t)
	if err != nil {
		return nil, failureStatus(err, sc, name, t.Address, "new")
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails
	id := hex.EncodeToString(raw[:])
	s.mu.Lock()
	s.sessions[id] = &session{bmc: b, address: t.Address, sc: sc, name: b.Name()}
	s.mu.Unlock()
	return &driverv1.OpenResponse{Session: id}, nil
}

// call runs fn on the session's BMC, turning its error into a Failure.
func (s *server) call(id, op string, fn func(BMC) error) error {
	s.mu.Lock()
	ss, ok := s.sessions[id]
	s.mu.Unlock()
	if !ok {
		return failureStatus(fmt.Errorf("no open session %q (closed, or opened by another process): %w", id, ErrInvalidArgument),
			newScrubber(), s.impl.Info().Name, "", op)
	}
	if err := fn(ss.bmc); err != nil {
		return failureStatus(err, ss.sc, ss.name, ss.address, op)
	}
	return nil
}

func (s *server) PowerOn(ctx context.Context, r *driverv1.PowerOnRequest) (*driverv1.PowerOnResponse, error) {
	return &driverv1.PowerOnResponse{}, s.call(r.GetSession(), "power on", func(b BMC) error { return b.PowerOn(ctx) })
}

func (s *server) PowerOff(ctx context.Context, r *driverv1.PowerOffRequest) (*driverv1.PowerOffResponse, error) {
	return &driverv1.PowerOffResponse{}, s.call(r.GetSession(), "power off", func(b BMC) error { return b.PowerOff(ctx) })
}

func (s *server) Shutdown(ctx context.Context, r *driverv1.ShutdownRequest) (*driverv1.ShutdownResponse, error) {
	return &driverv1.ShutdownResponse{}, s.call(r.GetSession(), "shutdown", func(b BMC) error { return b.Shutdown(ctx) })
}

func (s *server) PowerCycle(ctx context.Context, r *driverv1.PowerCycleRequest) (*driverv1.PowerCycleResponse, error) {
	return &driverv1.PowerCycleResponse{}, s.call(r.GetSession(), "power cycle", func(b BMC) error { return b.PowerCycle(ctx) })
}

func (s *server) PowerStatus(ctx context.Context, r *driverv1.PowerStatusRequest) (*driverv1.PowerStatusResponse, error) {
	var st PowerState
	err := s.call(r.GetSession(), "power status", func(b BMC) (err error) {
		st, err = b.PowerStatus(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	w, ok := powerStates[st]
	if !ok {
		w = driverv1.PowerState_POWER_STATE_UNKNOWN
	}
	return &driverv1.PowerStatusResponse{State: w}, nil
}

func (s *server) SetBootOverride(ctx context.Context, r *driverv1.SetBootOverrideRequest) (*driverv1.SetBootOverrideResponse, error) {
	return &driverv1.SetBootOverrideResponse{}, s.call(r.GetSession(), "set boot override", func(b BMC) error {
		t, ok := bootTargetOf[r.GetTarget()]
		if !ok {
			return unknownBootTarget(BootTarget(r.GetTarget().String()))
		}
		return b.SetBootOverride(ctx, BootOverride{Target: t, Persistent: r.GetPersistent()})
	})
}

func (s *server) InsertVirtualMedia(ctx context.Context, r *driverv1.InsertVirtualMediaRequest) (*driverv1.InsertVirtualMediaResponse, error) {
	return &driverv1.InsertVirtualMediaResponse{}, s.call(r.GetSession(), "insert virtual media", func(b BMC) error {
		return b.InsertVirtualMedia(ctx, r.GetImageUrl())
	})
}

func (s *server) EjectVirtualMedia(ctx context.Context, r *driverv1.EjectVirtualMediaRequest) (*driverv1.EjectVirtualMediaResponse, error) {
	return &driverv1.EjectVirtualMediaResponse{}, s.call(r.GetSession(), "eject virtual media", func(b BMC) error {
		return b.EjectVirtualMedia(ctx)
	})
}

func (s *server) SetPassword(ctx context.Context, r *driverv1.SetPasswordRequest) (*driverv1.SetPasswordResponse, error) {
	s.mu.Lock()
	if ss, ok := s.sessions[r.GetSession()]; ok {
		ss.sc.add(r.GetPassword())
	}
	s.mu.Unlock()
	return &driverv1.SetPasswordResponse{}, s.call(r.GetSession(), "set password", func(b BMC) error {
		ps, ok := b.(PasswordSetter)
		if !ok {
			return fmt.Errorf("this driver cannot change a BMC password: %w", ErrUnsupported)
		}
		return ps.SetPassword(ctx, r.GetPassword())
	})
}

func (s *server) Close(ctx context.Context, r *driverv1.CloseRequest) (*driverv1.CloseResponse, error) {
	s.mu.Lock()
	ss, ok := s.sessions[r.GetSession()]
	delete(s.sessions, r.GetSession())
	s.mu.Unlock()
	if !ok {
		return &driverv1.CloseResponse{}, nil // closing twice is fine
	}
	if err := ss.bmc.Close(ctx); err != nil {
		return nil, failureStatus(err, ss.sc, ss.name, ss.address, "close")
	}
	return &driverv1.CloseResponse{}, nil
}
