package tunnel_test

import (
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/tunnel"
)

func TestAttachOnlyFromItsNode(t *testing.T) {
	h := tunnel.New()
	p := h.Expect("tun1", "nod_a")
	a, b := net.Pipe()
	defer func() { _ = a.Close(); _ = b.Close() }()
	require.ErrorIs(t, h.Attach("tun1", "nod_b", tunnel.Opened{Stream: a}), tunnel.ErrWrongNode)
	require.ErrorIs(t, h.Attach("other", "nod_a", tunnel.Opened{Stream: a}), tunnel.ErrUnknownTunnel)
	require.Equal(t, 1, h.Waiting())
	require.NoError(t, h.Attach("tun1", "nod_a", tunnel.Opened{Stream: a}))
	o := <-p.Opened()
	require.Equal(t, io.ReadWriteCloser(a), io.ReadWriteCloser(o.Stream))
	require.ErrorIs(t, h.Attach("tun1", "nod_a", tunnel.Opened{Stream: a}), tunnel.ErrUnknownTunnel, "only once")
	p.Close()
	require.Zero(t, h.Waiting())

	p = h.Expect("tun2", "nod_a")
	p.Close()
	require.ErrorIs(t, h.Attach("tun2", "nod_a", tunnel.Opened{Stream: a}), tunnel.ErrUnknownTunnel, "a request that gave up")
}

func TestPipeBothWays(t *testing.T) {
	c1, c2 := net.Pipe()
	s1, s2 := net.Pipe()
	done := make(chan struct{})
	go func() { tunnel.Pipe(c2, s1); close(done) }()
	go func() { _, _ = c1.Write([]byte("ping")) }()
	buf := make([]byte, 4)
	_, err := io.ReadFull(s2, buf)
	require.NoError(t, err)
	require.Equal(t, "ping", string(buf))
	go func() { _, _ = s2.Write([]byte("pong")) }()
	_, err = io.ReadFull(c1, buf)
	require.NoError(t, err)
	require.Equal(t, "pong", string(buf))
	require.NoError(t, s2.Close(), "one side closing ends it")
	<-done
	_, err = c1.Read(buf)
	require.Error(t, err)
}

func TestCloseReleasesAnUntakenStream(t *testing.T) {
	h := tunnel.New()
	p := h.Expect("tun1", "nod_a")
	a, b := net.Pipe()
	defer func() { _ = b.Close() }()
	require.NoError(t, h.Attach("tun1", "nod_a", tunnel.Opened{Stream: a}))
	p.Close()
	_, err := b.Write([]byte("x"))
	require.Error(t, err, "the stream nobody took was closed")
}

func TestFailOnlyForItsNode(t *testing.T) {
	h := tunnel.New()
	p := h.Expect("tun1", "nod_a")
	defer p.Close()
	h.Fail("tun1", "nod_b", io.EOF)
	require.Equal(t, 1, h.Waiting(), "another node's failure leaves it waiting")
	h.Fail("tun1", "nod_a", io.ErrUnexpectedEOF)
	o := <-p.Opened()
	require.ErrorIs(t, o.Err, io.ErrUnexpectedEOF)
	require.Zero(t, h.Waiting())
}
