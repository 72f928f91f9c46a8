package driver

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	driverv1 "github.com/better-compute/better-compute/gen/bettercompute/driver/v1"
)

// The handshake a host and a driver agree on before anything else. The
// magic cookie is not a secret: it only makes a driver binary run by hand
// say what it is and exit, instead of waiting for a host that never comes.
const (
	// MagicCookieKey is the environment variable the host sets for the
	// driver process.
	MagicCookieKey = "BETTER_COMPUTE_DRIVER"
	// MagicCookieValue is its value.
	MagicCookieValue = "bmc-6f1d0b8e3c9a47d2"
	// ProtocolVersion is the BMC driver protocol this package speaks
	// (bettercompute.driver.v1.BMCService). A host offers the versions it
	// speaks; the driver picks one of them or the host refuses it.
	ProtocolVersion = 1
)

// pluginName is the one plugin a driver process dispenses.
const pluginName = "bmc"

func handshake(cookieValue string) plugin.HandshakeConfig {
	return plugin.HandshakeConfig{MagicCookieKey: MagicCookieKey, MagicCookieValue: cookieValue}
}

// hostPlugins are the protocol versions a host speaks, with the client
// each dispenses.
func hostPlugins() map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{ProtocolVersion: {pluginName: &bmcPlugin{}}}
}

// bmcPlugin is go-plugin's binding of BMCService: the server half
// registers a driver's implementation, the client half returns the stub.
type bmcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	srv *server
}

func (p *bmcPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	driverv1.RegisterBMCServiceServer(s, p.srv)
	return nil
}

func (p *bmcPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return driverv1.NewBMCServiceClient(c), nil
}
