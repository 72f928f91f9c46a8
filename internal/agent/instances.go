package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// InstanceRunner runs the instance and volume command kinds (vmcmd.Kinds):
// internal/agent/hypervisor on a node that runs guests (Config.Instances).
type InstanceRunner interface {
	// Apply runs one command: params are its JSON; the result is marshalled
	// to JSON for CommandUpdate.result. An error with a FailureCode()
	// method carries its failure code.
	Apply(ctx context.Context, kind string, params []byte) (any, error)
	// Capabilities are the vmcmd capabilities enforced on this host.
	Capabilities() []string
}

func isInstanceKind(kind string) bool { return slices.Contains(vmcmd.Kinds, kind) }

// isAsync reports whether kind runs on a goroutine of its own: a process,
// or an instance command (a create boots a guest, a stop waits for its
// shutdown); neither may hold up the node's other commands.
func isAsync(kind string) bool { return kind == KindProcessExec || isInstanceKind(kind) }

// orderKey is what an instance command must be ordered with: commands for
// one instance (or volume) apply in the order they came, commands for
// different ones at the same time. instance.list and instance.tunnel need
// no order.
func orderKey(c *agentv1.Command) string {
	// A tunnel changes nothing about its instance: it waits for no other
	// command (a slow create, another tunnel still dialling).
	if c.GetKind() == vmcmd.KindInstanceTunnel {
		return ""
	}
	f := c.GetParams().GetFields()
	if id := f["instance_id"].GetStringValue(); id != "" {
		return "instance/" + id
	}
	if id := f["volume_id"].GetStringValue(); id != "" {
		return "volume/" + id
	}
	return ""
}

// keyedOrder hands out turns per key in the order enter is called.
type keyedOrder struct {
	mu    sync.Mutex
	tails map[string]chan struct{}
}

// enter takes the next turn for key: wait is closed when every earlier
// turn ended; done ends this one (after the earlier ones, so a turn given
// up early never lets a later one overtake an earlier one still running).
func (o *keyedOrder) enter(key string) (wait <-chan struct{}, done func()) {
	mine := make(chan struct{})
	if key == "" {
		closed := make(chan struct{})
		close(closed)
		return closed, func() { close(mine) }
	}
	o.mu.Lock()
	if o.tails == nil {
		o.tails = map[string]chan struct{}{}
	}
	prev := o.tails[key]
	o.tails[key] = mine
	o.mu.Unlock()
	if prev == nil {
		prev = make(chan struct{})
		close(prev)
	}
	return prev, func() {
		<-prev
		o.mu.Lock()
		if o.tails[key] == mine {
			delete(o.tails, key)
		}
		o.mu.Unlock()
		close(mine)
	}
}

// applyInstance hands an instance command to the hypervisor.
func (a *Agent) applyInstance(ctx context.Context, c *agentv1.Command) (outcome, error) {
	if a.cfg.Instances != nil && c.GetKind() == vmcmd.KindInstanceTunnel {
		return a.openTunnel(ctx, c)
	}
	if a.cfg.Instances == nil {
		return outcome{}, fail(vmcmd.FailNoRuntime, fmt.Errorf("command kind %q: this bcd runs no instances (start it with --instances-dir and --guest-images)", c.GetKind()))
	}
	params := []byte("{}")
	if p := c.GetParams(); p != nil {
		b, err := protojson.Marshal(p)
		if err != nil {
			return outcome{}, fail(vmcmd.FailInvalid, fmt.Errorf("params: %w", err))
		}
		params = b
	}
	res, err := a.cfg.Instances.Apply(ctx, c.GetKind(), params)
	if err != nil {
		// Canceled or stopped first: a QEMU or qemu-img killed with the
		// context fails with its own error, which would read as the
		// host's fault.
		if cerr := ctx.Err(); cerr != nil {
			return outcome{}, fmt.Errorf("%w: %w", cerr, err)
		}
		var coded interface{ FailureCode() string }
		if errors.As(err, &coded) {
			return outcome{}, fail(coded.FailureCode(), err)
		}
		return outcome{}, fail(vmcmd.FailRuntime, err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return outcome{}, fail(vmcmd.FailRuntime, fmt.Errorf("result: %w", err))
	}
	st := &structpb.Struct{}
	if err := protojson.Unmarshal(b, st); err != nil {
		return outcome{}, fail(vmcmd.FailRuntime, fmt.Errorf("result: %w", err))
	}
	return outcome{result: st}, nil
}
