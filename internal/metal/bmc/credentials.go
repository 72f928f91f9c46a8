package bmc

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
)

// redacted stands in for a password wherever Credentials are printed.
const redacted = "[redacted]"

// Credentials are a BMC's user name and password. The password can be read
// only through Password(); every way of printing a Credentials value (fmt
// with any verb, slog, encoding/json) shows the user name and "[redacted]".
type Credentials struct {
	username string
	password string
}

// NewCredentials holds a user name and password for a BMC.
func NewCredentials(username, password string) Credentials {
	return Credentials{username: username, password: password}
}

// Username is the BMC user name (not secret).
func (c Credentials) Username() string { return c.username }

// Password is the BMC password: hand it to the BMC, never to a log.
func (c Credentials) Password() string { return c.password }

func (c Credentials) validate() error {
	if c.username == "" {
		return fmt.Errorf("user name is empty")
	}
	if strings.ContainsAny(c.username, "\x00\r\n:") {
		return fmt.Errorf("user name holds a control character or ':'")
	}
	return nil
}

// String shows the user name only.
func (c Credentials) String() string {
	return "bmc.Credentials{Username:" + c.username + " Password:" + redacted + "}"
}

// GoString serves %#v like String.
func (c Credentials) GoString() string { return c.String() }

// Format serves every fmt verb (%v, %+v, %s, %d, %x, …) the redacted form;
// without it a verb that bypasses String would print the struct's fields.
func (c Credentials) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(c.String())) }

// LogValue keeps the password out of slog output.
func (c Credentials) LogValue() slog.Value {
	return slog.GroupValue(slog.String("username", c.username), slog.String("password", redacted))
}

// MarshalJSON keeps the password out of JSON.
func (c Credentials) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Username string `json:"username"`
		Password string `json:"password"`
	}{c.username, redacted})
}

// scrub removes the password from a message a library or a BMC produced.
func (c Credentials) scrub(s string) string {
	if c.password == "" {
		return s
	}
	return strings.ReplaceAll(s, c.password, redacted)
}
