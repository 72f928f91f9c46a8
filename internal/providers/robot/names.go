package robot

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
)

// Robot has no labels: a server's name is the only thing this provider
// can write on it, so the name carries the claim.
//
//	bc-<tag>-<instance>    claimed and installed: the instance's server
//	bcp-<tag>-<instance>   claimed, its install not finished yet
//	""                     unclaimed, free to claim
//
// <tag> stands for the control plane (ManagedLabel's value): the id itself
// when it is 1–12 letters and digits, else "h" and 10 hex digits of its
// SHA-256, so two deployments on one account keep apart and the instance
// id after the second "-" parses back unambiguously. Any other name is an
// operator's, and the provider never touches that server.
const (
	finalPrefix       = "bc-"
	provisionalPrefix = "bcp-"
	// maxNameLen keeps a claim name within a DNS label: Robot documents no
	// limit, and an operator's tools tend to use the name as a hostname.
	maxNameLen = 63
)

var (
	plainTagRE   = regexp.MustCompile(`^[A-Za-z0-9]{1,12}$`)
	instanceIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
)

func controlPlaneTag(id string) string {
	if plainTagRE.MatchString(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "h" + hex.EncodeToString(sum[:])[:10]
}

// names are one control plane's claim names.
type names struct{ tag string }

func (n names) final(instanceID string) string {
	return finalPrefix + n.tag + "-" + instanceID
}

func (n names) provisional(instanceID string) string {
	return provisionalPrefix + n.tag + "-" + instanceID
}

// parse finds the instance a server name claims for this control plane;
// ok is false for a name that is not this control plane's claim.
func (n names) parse(name string) (instanceID string, installed, ok bool) {
	if id, found := strings.CutPrefix(name, finalPrefix+n.tag+"-"); found && id != "" {
		return id, true, true
	}
	if id, found := strings.CutPrefix(name, provisionalPrefix+n.tag+"-"); found && id != "" {
		return id, false, true
	}
	return "", false, false
}

// validInstanceID: the id fits a claim name and never spans two.
func (n names) validInstanceID(id string) bool {
	return instanceIDRE.MatchString(id) && len(n.provisional(id)) <= maxNameLen
}

// hostnameRE is a hostname's one label.
var hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// hostname is the installed system's hostname: the request's name where it
// is one, else one made of the instance id.
func hostname(name, instanceID string) string {
	if h := strings.ToLower(name); hostnameRE.MatchString(h) {
		return h
	}
	h := strings.Trim(strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, instanceID), "-")
	if len(h) > 63 {
		h = strings.Trim(h[:63], "-")
	}
	if h == "" {
		h = "bc-server"
	}
	return h
}
