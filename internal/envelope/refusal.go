package envelope

import (
	"context"
	"fmt"
	"strings"
	"unicode"

	"github.com/better-compute/better-compute/internal/iam"
)

type requestedTenantKey struct{}

// WithRequestedTenant remembers the tenant a request names (its tenant
// field), so a refusal can echo it back: a caller refused on another
// tenant learns only the name it sent, never whether that tenant or
// anything in it exists.
func WithRequestedTenant(ctx context.Context, msg any) context.Context {
	if m, ok := msg.(interface{ GetTenant() string }); ok && m.GetTenant() != "" {
		return context.WithValue(ctx, requestedTenantKey{}, m.GetTenant())
	}
	return ctx
}

func requestedTenant(ctx context.Context) string {
	s, _ := ctx.Value(requestedTenantKey{}).(string)
	return s
}

// refusal is the PERMISSION_DENIED answer to a denied decision. It names
// who asked, for what, and the resource it was decided on ("key key_1
// (member of acme) may not projects.list on tenant sim"), so the caller can
// tell a wrong tenant or key from a missing permission. Resources outside
// the caller's tenant are described only by what the request named.
func (e *Envelope) refusal(ctx context.Context, caller Caller, action string, res iam.Resource) *Error {
	return Errorf(CodePermissionDenied, "%s may not %s on %s", e.describePrincipal(ctx, caller), action, e.describeResource(ctx, caller, res))
}

func (e *Envelope) describePrincipal(ctx context.Context, c Caller) string {
	p := c.Principal
	var who string
	switch {
	case c.AuthenticatedBy == "api-key" && c.CredentialID != "":
		who = "key " + c.CredentialID
		if p.Kind == iam.KindAgent {
			who = "agent key " + c.CredentialID
		}
	case p.Kind == iam.KindUser && p.Name != "":
		who = "user " + p.Name
	default:
		who = strings.TrimSpace(string(p.Kind) + " " + p.ID)
	}
	switch {
	case p.TenantID != "":
		return fmt.Sprintf("%s (%s of %s)", who, string(p.Role), e.tenantName(ctx, p.TenantID))
	case p.Role != "":
		return fmt.Sprintf("%s (%s)", who, string(p.Role))
	}
	return who
}

func (e *Envelope) describeResource(ctx context.Context, c Caller, res iam.Resource) string {
	// A platform administrator may know every tenant; anyone else is told
	// about their own tenant only.
	known := res.TenantID != "" && (res.TenantID == c.Principal.TenantID || c.Principal.Role == iam.RolePlatformAdmin)
	tenant := requestedTenant(ctx)
	if known {
		tenant = e.tenantName(ctx, res.TenantID)
	}
	draft := res.ID == "" || res.ID == iam.DraftID
	switch res.Type {
	case "Platform":
		return "the platform"
	case "Tenant":
		name, _ := res.Attrs["name"].(string)
		switch {
		case draft && name != "":
			return "a new tenant " + name
		case tenant != "":
			return "tenant " + tenant
		}
		return "a tenant that is not yours"
	}
	noun := words(res.Type)
	var what string
	switch {
	case draft:
		what = "a new " + noun
	case known && res.ID != "unknown":
		what = noun + " " + res.ID
	default:
		what = article(noun) + " " + noun
	}
	if tenant != "" {
		what += " in tenant " + tenant
	}
	return what
}

// tenantName names a tenant by its name, else its id.
func (e *Envelope) tenantName(ctx context.Context, id string) string {
	if e.cfg.TenantName != nil {
		if name, err := e.cfg.TenantName(ctx, id); err == nil && name != "" {
			return name
		}
	}
	return id
}

// words spells an entity type for people: "ApiKey" → "api key",
// "IPPool" → "IP pool" (a run of capitals is an acronym, kept whole).
func words(typ string) string {
	if typ == "" {
		return "resource"
	}
	rs := []rune(typ)
	var parts []string
	start := 0
	for i := 1; i <= len(rs); i++ {
		// A word ends before a capital that follows a lower-case letter,
		// or before the last capital of an acronym followed by lower case.
		if i == len(rs) || (unicode.IsUpper(rs[i]) && (unicode.IsLower(rs[i-1]) ||
			(i+1 < len(rs) && unicode.IsLower(rs[i+1]) && unicode.IsUpper(rs[i-1])))) {
			parts = append(parts, string(rs[start:i]))
			start = i
		}
	}
	for i, p := range parts {
		if len([]rune(p)) > 1 && strings.ToUpper(p) == p {
			continue // an acronym: IP, BMC, MIG
		}
		parts[i] = strings.ToLower(p)
	}
	return strings.Join(parts, " ")
}

// article is the indefinite article of noun, by its sound: "an agent",
// "an IP pool", "a user", "a BMC".
func article(noun string) string {
	first, _, _ := strings.Cut(noun, " ")
	switch {
	case first == "":
		return "a"
	case len(first) > 1 && strings.ToUpper(first) == first:
		// An acronym is spelled out: "an IP", "an MIG", "a BMC".
		if strings.ContainsRune("AEFHILMNORSX", rune(first[0])) {
			return "an"
		}
		return "a"
	case len(first) > 2 && first[0] == 'u' && !strings.ContainsRune("aeiou", rune(first[1])) && strings.ContainsRune("aeiou", rune(first[2])):
		return "a" // "a user", "a usage window"; but "an update"
	case strings.ContainsRune("aeiou", rune(first[0])):
		return "an"
	}
	return "a"
}
