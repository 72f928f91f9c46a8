package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// HardwareKey is the node's machine identity: hex SHA-256 over the DMI
// product UUID, product serial, board serial and the sorted GPU UUIDs, one
// per line, trimmed, UUIDs lower-cased. Two machines with one key are one
// machine to the gateway.
func HardwareKey(id *agentv1.HardwareIdentity) string {
	gpus := make([]string, 0, len(id.GetGpuUuids()))
	for _, u := range id.GetGpuUuids() {
		gpus = append(gpus, strings.ToLower(strings.TrimSpace(u)))
	}
	slices.Sort(gpus)
	h := sha256.New()
	fmt.Fprintf(h, "product_uuid:%s\nproduct_serial:%s\nboard_serial:%s\n",
		strings.ToLower(strings.TrimSpace(id.GetDmiProductUuid())),
		strings.TrimSpace(id.GetDmiProductSerial()), strings.TrimSpace(id.GetDmiBoardSerial()))
	for _, u := range gpus {
		fmt.Fprintf(h, "gpu:%s\n", u)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// placeholderValues are what vendors leave in DMI fields they did not fill.
var placeholderValues = []string{
	"", "to be filled by o.e.m.", "default string", "not specified", "system serial number",
	"0", "none", "not applicable", "n/a", "123456789", "0123456789",
	"03000200-0400-0500-0006-000700080009",
}

// IsPlaceholder reports whether a DMI value identifies nothing: empty, a
// vendor's filler text, or an all-zero (or all-F) UUID.
func IsPlaceholder(v string) bool {
	v = strings.ToLower(strings.TrimSpace(v))
	if slices.Contains(placeholderValues, v) {
		return true
	}
	digits := strings.ReplaceAll(v, "-", "")
	return len(digits) >= 8 && (strings.Trim(digits, "0") == "" || strings.Trim(digits, "f") == "")
}

// PlaceholderReason says why a hardware identity cannot identify a machine
// on its own (so a join needs an operator's approval), or "" when it can.
// The product UUID, the product serial and the board serial must all be
// real values.
func PlaceholderReason(id *agentv1.HardwareIdentity) string {
	var bad []string
	if IsPlaceholder(id.GetDmiProductUuid()) {
		bad = append(bad, "product UUID")
	}
	if IsPlaceholder(id.GetDmiProductSerial()) {
		bad = append(bad, "product serial")
	}
	if IsPlaceholder(id.GetDmiBoardSerial()) {
		bad = append(bad, "board serial")
	}
	if len(bad) == 0 {
		return ""
	}
	return "placeholder DMI " + strings.Join(bad, ", ")
}

// NodeName turns a hostname into a resource name ([a-z0-9-]{1,63}): the
// first label, lower-cased, other characters replaced by '-'. It returns
// "node" for a hostname with nothing usable.
func NodeName(hostname string) string {
	host, _, _ := strings.Cut(strings.TrimSpace(hostname), ".")
	var b strings.Builder
	for _, r := range strings.ToLower(host) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-")
	for strings.Contains(name, "--") {
		name = strings.ReplaceAll(name, "--", "-")
	}
	// Room for a "-NNNN" suffix on collision.
	if len(name) > 57 {
		name = strings.TrimRight(name[:57], "-")
	}
	if name == "" {
		return "node"
	}
	return name
}

// roleOf maps the agent mode to its certificate role.
func roleOf(m agentv1.AgentMode) string {
	switch m {
	case agentv1.AgentMode_AGENT_MODE_SITE:
		return RoleSite
	case agentv1.AgentMode_AGENT_MODE_RAMDISK:
		return RoleRamdisk
	}
	return RoleNode
}
