package iam

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/cedar-policy/cedar-go/types"
)

// principalTypes maps principal kinds to Cedar entity types. Nodes are absent
// on purpose: they have no API permissions.
var principalTypes = map[PrincipalKind]types.EntityType{
	KindUser:    entityType("User"),
	KindService: entityType("Service"),
	KindAgent:   entityType("Agent"),
}

// projection is a request turned into Cedar entities.
type projection struct {
	principal types.EntityUID
	resource  types.EntityUID
	entities  entityChain
}

func tenantUID(id string) types.EntityUID { return types.NewEntityUID(tenantType, types.String(id)) }

// resourceTenant is the tenant a resource belongs to. A Tenant resource
// belongs to itself, whichever of ID or TenantID the caller filled in.
func resourceTenant(r Resource) string {
	if r.Type == "Tenant" {
		return cmp.Or(r.ID, r.TenantID)
	}
	return r.TenantID
}

// project builds the entity graph for one request: the resource with its
// parent chain (resource → project → tenant → platform) and the principal in
// its tenant (or the platform). Policies then express tenancy with `in`.
func (m *model) project(req Request) (projection, error) {
	pt, ok := principalTypes[req.Principal.Kind]
	if !ok {
		return projection{}, fmt.Errorf("principal kind %q has no api permissions", req.Principal.Kind)
	}
	ents := types.EntityMap{platformUID: {UID: platformUID}}
	// addTenant adds the tenant entity a child hangs off and returns the
	// child's parent: the tenant, or the platform when there is none.
	addTenant := func(id string) types.EntityUID {
		if id == "" {
			return platformUID
		}
		uid := tenantUID(id)
		ents[uid] = types.Entity{UID: uid, Parents: types.NewEntityUIDSet(platformUID)}
		return uid
	}

	pAttrs := types.RecordMap{
		"role": types.String(req.Principal.Role),
		"kind": types.String(req.Principal.Kind),
	}
	pParent := addTenant(req.Principal.TenantID)
	if req.Principal.TenantID != "" {
		pAttrs["tenant"] = pParent
	}
	pUID := types.NewEntityUID(pt, types.String(req.Principal.ID))
	ents[pUID] = types.Entity{UID: pUID, Parents: types.NewEntityUIDSet(pParent), Attributes: types.NewRecord(pAttrs)}

	r := req.Resource
	rt := entityType(r.Type)
	if r.Type == "" || strings.Contains(r.Type, ":") || !m.knownEntityType(rt) {
		return projection{}, fmt.Errorf("unknown resource type %q", r.Type)
	}
	attrs, err := toRecord(r.Attrs)
	if err != nil {
		return projection{}, fmt.Errorf("resource attrs: %w", err)
	}
	var rUID types.EntityUID
	var parents types.EntityUIDSet
	switch r.Type {
	case "Platform":
		rUID = platformUID
	case "Tenant":
		rUID = tenantUID(cmp.Or(r.ID, r.TenantID, DraftID))
		parents = types.NewEntityUIDSet(platformUID)
	case "Project":
		rUID = types.NewEntityUID(projectType, types.String(cmp.Or(r.ID, r.ProjectID, DraftID)))
		parents = types.NewEntityUIDSet(addTenant(r.TenantID))
	default:
		rUID = types.NewEntityUID(rt, types.String(cmp.Or(r.ID, DraftID)))
		parent := addTenant(r.TenantID)
		if r.ProjectID != "" {
			proj := types.NewEntityUID(projectType, types.String(r.ProjectID))
			ents[proj] = types.Entity{UID: proj, Parents: types.NewEntityUIDSet(parent)}
			parent = proj
		}
		parents = types.NewEntityUIDSet(parent)
	}
	// Set last: when the resource is the principal's own tenant this
	// replaces the bare tenant entity with the same parents plus attributes.
	ents[rUID] = types.Entity{UID: rUID, Parents: parents, Attributes: attrs}
	return projection{principal: pUID, resource: rUID, entities: entityChain{ents, m.actionEntities}}, nil
}

// requestContext converts the envelope's context, defaulting confirmed to
// false so policies can read it without a `has` guard.
func requestContext(in map[string]any, confirmed *bool) (types.Record, error) {
	rm := types.RecordMap{ContextConfirmed: types.False}
	for k, v := range in {
		cv, err := toValue(v)
		if err != nil {
			return types.Record{}, fmt.Errorf("context %q: %w", k, err)
		}
		rm[types.String(k)] = cv
	}
	if _, ok := rm[ContextConfirmed].(types.Boolean); !ok {
		return types.Record{}, fmt.Errorf("context %q must be a bool", ContextConfirmed)
	}
	if confirmed != nil {
		rm[ContextConfirmed] = types.Boolean(*confirmed)
	}
	return types.NewRecord(rm), nil
}

func toRecord(m map[string]any) (types.Record, error) {
	rm := make(types.RecordMap, len(m))
	for k, v := range m {
		cv, err := toValue(v)
		if err != nil {
			return types.Record{}, fmt.Errorf("%q: %w", k, err)
		}
		rm[types.String(k)] = cv
	}
	return types.NewRecord(rm), nil
}

func toValue(v any) (types.Value, error) {
	switch v := v.(type) {
	case string:
		return types.String(v), nil
	case bool:
		return types.Boolean(v), nil
	case int:
		return types.Long(v), nil
	case int32:
		return types.Long(v), nil
	case int64:
		return types.Long(v), nil
	case []string:
		vs := make([]types.Value, len(v))
		for i, s := range v {
			vs[i] = types.String(s)
		}
		return types.NewSet(vs...), nil
	case []any:
		vs := make([]types.Value, len(v))
		for i, e := range v {
			cv, err := toValue(e)
			if err != nil {
				return nil, err
			}
			vs[i] = cv
		}
		return types.NewSet(vs...), nil
	case map[string]any:
		return toRecord(v)
	case types.Value:
		return v, nil
	default:
		return nil, fmt.Errorf("unsupported attribute type %T", v)
	}
}

// sortedIDs turns diagnostic reasons into stable, readable strings.
func sortedIDs(rs []types.DiagnosticReason) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, string(r.PolicyID))
	}
	slices.Sort(out)
	return out
}
