package webhook_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/client/webhook"
)

func TestSignVerify(t *testing.T) {
	t.Parallel()
	s1, err := webhook.NewSecret()
	require.NoError(t, err)
	s2, err := webhook.NewSecret()
	require.NoError(t, err)
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"specversion":"1.0"}`)
	h := http.Header{}
	require.NoError(t, webhook.Sign(h, []string{s1, s2}, "whd_1", now, body))

	require.NoError(t, webhook.VerifyAt(s1, h, body, now), "the new secret verifies")
	require.NoError(t, webhook.VerifyAt(s2, h, body, now.Add(4*time.Minute)), "the old one too, during the overlap")
	require.ErrorIs(t, webhook.VerifyAt(s1, h, []byte(`{"specversion":"1.1"}`), now), webhook.ErrSignature)
	other, _ := webhook.NewSecret()
	require.ErrorIs(t, webhook.VerifyAt(other, h, body, now), webhook.ErrSignature)
	// A replay: the same signed request, six minutes later (or early).
	require.ErrorIs(t, webhook.VerifyAt(s1, h, body, now.Add(6*time.Minute)), webhook.ErrTimestamp)
	require.ErrorIs(t, webhook.VerifyAt(s1, h, body, now.Add(-6*time.Minute)), webhook.ErrTimestamp)
	// A replay with a fresh timestamp but the old signature.
	h2 := h.Clone()
	h2.Set(webhook.HeaderTimestamp, "1800000300")
	require.ErrorIs(t, webhook.VerifyAt(s1, h2, body, now.Add(5*time.Minute)), webhook.ErrSignature)
	require.ErrorIs(t, webhook.VerifyAt(s1, http.Header{}, body, now), webhook.ErrMissingHeaders)
	require.ErrorIs(t, webhook.VerifyAt("nope", h, body, now), webhook.ErrBadSecret)
}

// TestKnownVector checks the scheme against the Standard Webhooks reference
// example.
func TestKnownVector(t *testing.T) {
	t.Parallel()
	sig, err := webhook.Signature("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
		1614265330, []byte(`{"test": 2432232314}`))
	require.NoError(t, err)
	require.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", sig)
}
