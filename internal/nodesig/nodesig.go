// Package nodesig is what a node signs with its own key: the final update
// of a command and its allocation reports (bound, released). The gateway
// verifies each against the certificate of the session it came on and
// keeps the signed bytes, so a record that a node wiped a disk or bound an
// allocation can be checked later by anyone holding the node CA, and a
// replica cannot make one up.
package nodesig

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// Context separates node report signatures from every other use of a key.
const Context = "better-compute node report v1"

// ErrBadSignature: the report's signature is missing or does not verify.
var ErrBadSignature = errors.New("the report's node signature does not verify")

// Signed reports whether m is a message a node signs: a command's final
// update, or an allocation report.
func Signed(m proto.Message) bool {
	switch x := m.(type) {
	case *agentv1.CommandUpdate:
		switch x.GetState() {
		case agentv1.CommandState_COMMAND_STATE_SUCCEEDED, agentv1.CommandState_COMMAND_STATE_FAILED, agentv1.CommandState_COMMAND_STATE_CANCELED:
			return true
		}
	case *agentv1.AllocationBound, *agentv1.AllocationReleased:
		return true
	}
	return false
}

// signature reads and sets the signature field of a signed message.
func signature(m proto.Message) (get func() []byte, set func([]byte)) {
	switch x := m.(type) {
	case *agentv1.CommandUpdate:
		return x.GetNodeSignature, func(b []byte) { x.NodeSignature = b }
	case *agentv1.AllocationBound:
		return x.GetNodeSignature, func(b []byte) { x.NodeSignature = b }
	case *agentv1.AllocationReleased:
		return x.GetNodeSignature, func(b []byte) { x.NodeSignature = b }
	}
	return nil, nil
}

// Bytes is what a node signs for m: the context, the trust domain, the
// node id, the message's type and its deterministic encoding with the
// signature left out.
func Bytes(trustDomain, nodeID string, m proto.Message) ([]byte, error) {
	c := proto.Clone(m)
	if _, set := signature(c); set != nil {
		set(nil)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(body)+128)
	for _, s := range []string{Context, trustDomain, nodeID, string(m.ProtoReflect().Descriptor().FullName())} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return append(b, body...), nil
}

// Sign sets m's signature by key (the node's certificate key).
func Sign(key crypto.Signer, trustDomain, nodeID string, m proto.Message) error {
	_, set := signature(m)
	if set == nil {
		return fmt.Errorf("nodesig: %T is not signed", m)
	}
	b, err := Bytes(trustDomain, nodeID, m)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	sig, err := key.Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		return err
	}
	set(sig)
	return nil
}

// Verify checks m's signature by pub and returns the bytes it covers.
func Verify(pub crypto.PublicKey, trustDomain, nodeID string, m proto.Message) ([]byte, error) {
	get, _ := signature(m)
	if get == nil || len(get()) == 0 {
		return nil, fmt.Errorf("%w: unsigned", ErrBadSignature)
	}
	k, ok := pub.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%w: the node's key is %T", ErrBadSignature, pub)
	}
	b, err := Bytes(trustDomain, nodeID, m)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	if !ecdsa.VerifyASN1(k, sum[:], get()) {
		return nil, ErrBadSignature
	}
	return b, nil
}
