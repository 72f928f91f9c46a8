package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// tunnelChunk is the most a tunnel frame carries.
const tunnelChunk = 32 << 10

// openTunnel runs instance.tunnel: it dials the guest's sshd through the
// hypervisor and carries the connection on a new Tunnel stream of the
// session's gateway connection. The command ends once the stream is open;
// the bytes flow until either side closes. A guest that cannot be reached
// still opens the stream, to tell the waiting request why, and fails the
// command.
func (a *Agent) openTunnel(ctx context.Context, c *agentv1.Command) (outcome, error) {
	var p vmcmd.TunnelParams
	raw, err := protojson.Marshal(c.GetParams())
	if err != nil {
		return outcome{}, fail(vmcmd.FailInvalid, fmt.Errorf("params: %w", err))
	}
	if err := vmcmd.Decode(raw, &p); err != nil {
		return outcome{}, fail(vmcmd.FailInvalid, err)
	}
	if !vmcmd.ValidID(p.InstanceID) || p.TunnelID == "" || len(p.TunnelID) > 64 {
		return outcome{}, fail(vmcmd.FailInvalid, fmt.Errorf("instance_id %q and tunnel_id (1-64 characters) are required", p.InstanceID))
	}
	dialer, ok := a.cfg.Instances.(vmcmd.GuestDialer)
	if !ok {
		return outcome{}, fail(vmcmd.FailUnsupported, errors.New("this hypervisor cannot dial guests"))
	}
	s := a.currentSession()
	if s == nil || s.conn == nil {
		return outcome{}, fail(vmcmd.FailRuntime, errors.New("no gateway session to open the tunnel on"))
	}
	guest, dialErr := dialer.DialGuest(ctx, p.InstanceID)
	// The stream outlives the command: it ends when either side closes,
	// or with the session's connection.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := agentv1.NewAgentServiceClient(s.conn).Tunnel(sctx)
	if err != nil {
		cancel()
		if guest != nil {
			_ = guest.Close()
		}
		return outcome{}, fail(vmcmd.FailRuntime, fmt.Errorf("open tunnel stream: %w", err))
	}
	first := &agentv1.TunnelRequest{TunnelId: p.TunnelID}
	if dialErr != nil {
		first.Error = dialErr.Error()
	}
	if err := stream.Send(first); err != nil {
		cancel()
		if guest != nil {
			_ = guest.Close()
		}
		return outcome{}, fail(vmcmd.FailRuntime, fmt.Errorf("open tunnel stream: %w", err))
	}
	if dialErr != nil {
		_ = stream.CloseSend()
		// The gateway's answer ends the stream; nothing more to carry.
		go func() {
			defer cancel()
			for {
				if _, err := stream.Recv(); err != nil {
					return
				}
			}
		}()
		var coded interface{ FailureCode() string }
		if errors.As(dialErr, &coded) {
			return outcome{}, fail(coded.FailureCode(), dialErr)
		}
		return outcome{}, fail(vmcmd.FailRuntime, dialErr)
	}
	// The gateway accepts with an empty frame, or refuses (a tunnel id
	// issued for another node, no request waiting any more).
	if _, err := stream.Recv(); err != nil {
		cancel()
		_ = guest.Close()
		return outcome{}, fail(vmcmd.FailRuntime, fmt.Errorf("tunnel refused by the gateway: %w", err))
	}
	go a.pipeTunnel(stream, guest, cancel)
	res, err := structpb.NewStruct(map[string]any{"tunnel_id": p.TunnelID})
	if err != nil {
		return outcome{}, fail(vmcmd.FailRuntime, err)
	}
	return outcome{result: res}, nil
}

// pipeTunnel copies both ways until either side ends, then closes both.
func (a *Agent) pipeTunnel(stream agentv1.AgentService_TunnelClient, guest net.Conn, cancel context.CancelFunc) {
	var once sync.Once
	end := func() {
		once.Do(func() {
			cancel()
			_ = guest.Close()
		})
	}
	defer end()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer end()
		for {
			f, err := stream.Recv()
			if err != nil {
				return
			}
			if _, err := guest.Write(f.GetData()); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, tunnelChunk)
	for {
		n, err := guest.Read(buf)
		if n > 0 {
			if serr := stream.Send(&agentv1.TunnelRequest{Data: append([]byte(nil), buf[:n]...)}); serr != nil {
				break
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				a.log.Debug("tunnel: guest read", "err", err)
			}
			_ = stream.CloseSend()
			break
		}
	}
	<-done
}
