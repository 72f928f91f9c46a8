package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-plugin"

	driverv1 "github.com/better-compute/better-compute/gen/bettercompute/driver/v1"
)

// Options tune how a host starts a driver process. The zero value is
// ready to use.
type Options struct {
	// Logger receives the driver's output: its log lines at their own
	// level, anything else it prints at info, and go-plugin's lines about
	// the process. Known passwords are scrubbed from all of it. Default:
	// discard.
	Logger *slog.Logger
	// StartTimeout bounds the start and the handshake (default 30 s); an
	// earlier deadline of the caller's context wins.
	StartTimeout time.Duration
	// Env is the driver process's environment beyond PATH and TMPDIR (it
	// does not inherit the host's, which may hold secrets).
	Env []string
}

const defaultStartTimeout = 30 * time.Second

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = defaultStartTimeout
	}
	return o
}

// Client is a running driver process. It opens BMCs through the driver;
// Close ends the process and every BMC opened through it.
type Client struct {
	path string
	pc   *plugin.Client
	cp   plugin.ClientProtocol
	rpc  driverv1.BMCServiceClient
	info Info
	sc   *scrubber
}

// Launch starts the driver binary at path as a child process, completes
// the handshake (magic cookie, protocol version, gRPC over a unix socket
// with mutual TLS) and asks the driver for its Info. A binary that is not
// a driver, or speaks another protocol version, is refused with an error
// that says so.
func Launch(ctx context.Context, path string, opts Options) (*Client, error) {
	opts = opts.withDefaults()
	start := opts.StartTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < start {
		start = time.Until(dl)
	}
	sc := newScrubber()
	log := opts.Logger.With("driver", filepath.Base(path))
	cmd := exec.Command(path) //nolint:gosec // the operator names the driver binary; running it is the point
	cmd.Env = append(baseEnv(), opts.Env...)
	pc := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  handshake(MagicCookieValue),
		VersionedPlugins: hostPlugins(),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Managed:          true,
		// Only this host can talk to the driver: the unix socket sits in
		// a private directory, and mutual TLS pins both ends.
		AutoMTLS:     true,
		SkipHostEnv:  true,
		StartTimeout: start,
		Logger:       newHostLogger(log, sc),
		SyncStdout:   &lineLogger{log: log, sc: sc, stream: "stdout"},
		SyncStderr:   &lineLogger{log: log, sc: sc, stream: "stderr"},
	})
	c := &Client{path: path, pc: pc, sc: sc}
	if err := c.connect(ctx); err != nil {
		pc.Kill()
		return nil, err
	}
	return c, nil
}

func (c *Client) connect(ctx context.Context) error {
	cp, err := c.pc.Client()
	if err != nil {
		return c.handshakeError(err)
	}
	raw, err := cp.Dispense(pluginName)
	if err != nil {
		return fmt.Errorf("driver %s: %w: dispensing %q: %s", c.path, ErrDriver, pluginName, c.sc.scrub(err.Error()))
	}
	c.cp, c.rpc = cp, raw.(driverv1.BMCServiceClient)
	if err := c.Ping(); err != nil {
		return err
	}
	r, err := c.rpc.Info(ctx, &driverv1.InfoRequest{})
	if err != nil {
		return fmt.Errorf("driver %s: info: %w", c.path, errorFromStatus(err, c.sc, filepath.Base(c.path), "", "info"))
	}
	c.info = infoFromWire(r)
	if c.info.ProtocolVersion != c.pc.NegotiatedVersion() {
		return fmt.Errorf("driver %s: %w: it negotiated protocol version %d but says it serves %d",
			c.path, ErrDriver, c.pc.NegotiatedVersion(), c.info.ProtocolVersion)
	}
	return nil
}

// handshakeError says why a start failed in an operator's words. A driver
// run with the wrong magic cookie prints why on its stderr and exits, so
// go-plugin sees only an early exit: the host's logger has the driver's
// own words.
func (c *Client) handshakeError(err error) error {
	text := c.sc.scrub(err.Error())
	switch {
	case strings.Contains(text, "incompatible API version"):
		return fmt.Errorf("driver %s: %w: protocol version mismatch: this host speaks BMC driver protocol %d (%s)",
			c.path, ErrDriver, ProtocolVersion, text)
	case strings.Contains(text, "exited before we could connect"), strings.Contains(text, "Unrecognized remote plugin message"):
		return fmt.Errorf("driver %s: %w: handshake failed: the process exited or printed no handshake; "+
			"is it a Better Compute BMC driver (pkg/driver.ServeBMC, magic cookie %s, protocol %d)? (%s)",
			c.path, ErrDriver, MagicCookieKey, ProtocolVersion, text)
	}
	return fmt.Errorf("driver %s: %w: start: %s", c.path, ErrDriver, text)
}

// Info is what the driver said it is.
func (c *Client) Info() Info { return c.info }

// Ping checks that the driver process is alive and serving (the gRPC
// health service go-plugin registers).
func (c *Client) Ping() error {
	if c.pc.Exited() {
		return fmt.Errorf("driver %s: %w: the process exited", c.path, ErrDriver)
	}
	if err := c.cp.Ping(); err != nil {
		return fmt.Errorf("driver %s: %w: health check: %s", c.path, ErrDriver, c.sc.scrub(err.Error()))
	}
	return nil
}

// Close ends the driver process: a graceful shutdown, then a kill. It
// is safe to call twice.
func (c *Client) Close() error {
	c.pc.Kill()
	return nil
}

// Open opens the BMC at t through the driver. The BMC also implements
// PasswordSetter when the driver has CapSetPassword.
func (c *Client) Open(ctx context.Context, t Target) (BMC, error) {
	// Known before the driver sees it, so whatever it logs or returns
	// from here on is scrubbed.
	c.sc.add(t.Password)
	r, err := c.rpc.Open(ctx, targetToWire(t))
	if err != nil {
		return nil, errorFromStatus(err, c.sc, c.info.Name, t.Address, "new")
	}
	b := &remoteBMC{c: c, session: r.GetSession(), address: t.Address}
	if slices.Contains(c.info.Capabilities, CapSetPassword) {
		return &remoteSetter{b}, nil
	}
	return b, nil
}

// OpenBMC starts the driver at path and opens the BMC at t through it: a
// host's one call for one BMC. Close the BMC, then the io.Closer, which
// ends the process.
func OpenBMC(ctx context.Context, path string, t Target, opts Options) (BMC, io.Closer, error) {
	c, err := Launch(ctx, path, opts)
	if err != nil {
		return nil, nil, err
	}
	b, err := c.Open(ctx, t)
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	return b, c, nil
}

// baseEnv is what a driver inherits from the host: enough to find
// programs and write temporary files.
func baseEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// remoteBMC is a BMC served by a driver process.
type remoteBMC struct {
	c       *Client
	session string
	address string
}

func (b *remoteBMC) Name() string { return b.c.info.Name }

func (b *remoteBMC) fail(err error, op string) error {
	if err == nil {
		return nil
	}
	e := errorFromStatus(err, b.c.sc, b.c.info.Name, b.address, op)
	var de *Error
	if errors.As(e, &de) && errors.Is(de.Kind, ErrDriver) && b.c.pc.Exited() {
		de.Detail = "the driver process exited: " + de.Detail
	}
	return e
}

func (b *remoteBMC) PowerOn(ctx context.Context) error {
	_, err := b.c.rpc.PowerOn(ctx, &driverv1.PowerOnRequest{Session: b.session})
	return b.fail(err, "power on")
}

func (b *remoteBMC) PowerOff(ctx context.Context) error {
	_, err := b.c.rpc.PowerOff(ctx, &driverv1.PowerOffRequest{Session: b.session})
	return b.fail(err, "power off")
}

func (b *remoteBMC) Shutdown(ctx context.Context) error {
	_, err := b.c.rpc.Shutdown(ctx, &driverv1.ShutdownRequest{Session: b.session})
	return b.fail(err, "shutdown")
}

func (b *remoteBMC) PowerCycle(ctx context.Context) error {
	_, err := b.c.rpc.PowerCycle(ctx, &driverv1.PowerCycleRequest{Session: b.session})
	return b.fail(err, "power cycle")
}

func (b *remoteBMC) PowerStatus(ctx context.Context) (PowerState, error) {
	r, err := b.c.rpc.PowerStatus(ctx, &driverv1.PowerStatusRequest{Session: b.session})
	if err != nil {
		return PowerUnknown, b.fail(err, "power status")
	}
	if st, ok := powerStateOf[r.GetState()]; ok {
		return st, nil
	}
	return PowerUnknown, nil
}

func (b *remoteBMC) SetBootOverride(ctx context.Context, o BootOverride) error {
	t, ok := bootTargets[o.Target]
	if !ok {
		return &Error{Driver: b.c.info.Name, Address: b.address, Op: "set boot override", Kind: ErrInvalidArgument,
			Detail: unknownBootTarget(o.Target).Error()}
	}
	_, err := b.c.rpc.SetBootOverride(ctx, &driverv1.SetBootOverrideRequest{Session: b.session, Target: t, Persistent: o.Persistent})
	return b.fail(err, "set boot override")
}

func (b *remoteBMC) InsertVirtualMedia(ctx context.Context, imageURL string) error {
	_, err := b.c.rpc.InsertVirtualMedia(ctx, &driverv1.InsertVirtualMediaRequest{Session: b.session, ImageUrl: imageURL})
	return b.fail(err, "insert virtual media")
}

func (b *remoteBMC) EjectVirtualMedia(ctx context.Context) error {
	_, err := b.c.rpc.EjectVirtualMedia(ctx, &driverv1.EjectVirtualMediaRequest{Session: b.session})
	return b.fail(err, "eject virtual media")
}

func (b *remoteBMC) Close(ctx context.Context) error {
	if b.c.pc.Exited() {
		return nil // nothing is left to release
	}
	_, err := b.c.rpc.Close(ctx, &driverv1.CloseRequest{Session: b.session})
	return b.fail(err, "close")
}

// remoteSetter is a remoteBMC whose driver sets passwords.
type remoteSetter struct{ *remoteBMC }

func (b *remoteSetter) SetPassword(ctx context.Context, password string) error {
	b.c.sc.add(password)
	_, err := b.c.rpc.SetPassword(ctx, &driverv1.SetPasswordRequest{Session: b.session, Password: password})
	return b.fail(err, "set password")
}

// CleanupClients ends every driver process this host started and has not
// closed: call it (deferred) in a host's main, so a crash of the host's
// own code leaves no driver behind.
func CleanupClients() { plugin.CleanupClients() }
