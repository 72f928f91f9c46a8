package bmc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/metal/bmc"
)

func TestCredentialsNeverPrintThePassword(t *testing.T) {
	t.Parallel()
	c := bmc.NewCredentials("admin", password)
	require.Equal(t, password, c.Password())
	require.Equal(t, "admin", c.Username())

	var outs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T %v"} {
		outs = append(outs, fmt.Sprintf(verb, c))
	}
	wrapped := struct {
		Creds bmc.Credentials
		Ptr   *bmc.Credentials
	}{c, &c}
	outs = append(outs, fmt.Sprintf("%+v", wrapped), fmt.Sprintf("%#v", wrapped), fmt.Sprint(c), fmt.Sprintln(c))

	j, err := json.Marshal(wrapped)
	require.NoError(t, err)
	outs = append(outs, string(j))
	require.Contains(t, string(j), `"username":"admin"`)
	require.Contains(t, string(j), `"password":"[redacted]"`)

	for _, h := range []func(*bytes.Buffer) slog.Handler{
		func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
		func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
	} {
		var buf bytes.Buffer
		slog.New(h(&buf)).Info("enroll", "creds", c, "wrapped", wrapped)
		outs = append(outs, buf.String())
		require.Contains(t, buf.String(), "admin")
	}

	for _, out := range outs {
		require.NotContains(t, out, password, out)
		require.NotContains(t, out, fmt.Sprintf("%x", password), out)
	}
}

func TestErrorsAndLogsNeverCarryThePassword(t *testing.T) {
	t.Parallel()
	// The password is also the user name's suffix and part of the address
	// a caller got wrong: every echo of it must be scrubbed.
	var logs bytes.Buffer
	opts := bmc.Options{Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, tc := range []struct{ driver, address string }{
		{"redfish", "http://admin:" + password + "@192.0.2.1"},
		{"ipmi", "admin:" + password + "@192.0.2.1"},
		{"redfish", "ftp://192.0.2.1/" + password},
	} {
		_, err := bmc.New(tc.driver, tc.address, bmc.NewCredentials("admin", password), opts)
		require.ErrorIs(t, err, bmc.ErrInvalidAddress, tc.address)
		require.NotContains(t, err.Error(), password)
	}
	d, err := bmc.New("redfish", "http://127.0.0.1:1", bmc.NewCredentials("admin", password), opts)
	require.NoError(t, err)
	_, err = d.PowerStatus(context.Background())
	require.ErrorIs(t, err, bmc.ErrUnreachable)
	require.NotContains(t, err.Error(), password)
	require.NotContains(t, fmt.Sprintf("%+v %#v", err, err), password)
	require.Contains(t, logs.String(), "bmc call failed")
	require.NotContains(t, logs.String(), password)
}
