package metal

import (
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// scope is the owner a request names: a tenant, or the platform (the
// operator's own sites and machines).
type scope = tenancy.Scope

func validateScope(vs *envelope.Violations, tenant string) {
	if tenant != "" {
		vs.Ref("tenant", tenant, "tnt")
	}
}
