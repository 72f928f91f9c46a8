package gateway

import (
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// malformed remembers messages whose bytes did not decode. grpc-go answers
// a decode failure with INTERNAL before the handler sees it; the gateway's
// codec instead hands the handler an empty message marked here, and the
// handler refuses it with INVALID_ARGUMENT, as it refuses any bad input.
var malformed sync.Map // proto.Message → error

// agentCodec is the proto codec with decode failures deferred to the
// handler (see malformed).
type agentCodec struct{ base encoding.CodecV2 }

func newAgentCodec() agentCodec { return agentCodec{base: encoding.GetCodecV2("proto")} }

func (c agentCodec) Name() string { return c.base.Name() }

func (c agentCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c agentCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	proto.Reset(m)
	malformed.Store(m, err)
	return nil
}

// decodeError returns the decode failure of m, if the codec saw one, as
// INVALID_ARGUMENT, and forgets it.
func decodeError(m proto.Message) error {
	if err, ok := malformed.LoadAndDelete(m); ok {
		return invalid("malformed message: %v", err)
	}
	return nil
}
