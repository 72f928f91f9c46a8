package iam

import (
	"embed"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/cedar-policy/cedar-go/types"
	"github.com/cedar-policy/cedar-go/x/exp/schema"
	"github.com/cedar-policy/cedar-go/x/exp/schema/resolved"
)

// The schema and default policies ship inside the binary so that every
// control plane replica decides the same way without reading files at run
// time.
var (
	//go:embed schema.cedarschema
	schemaText []byte
	//go:embed policies/*.cedar
	defaultPolicyFS embed.FS
)

// namespace prefixes every entity type and action in the shipped schema.
const namespace = "BC"

var (
	platformType = entityType("Platform")
	tenantType   = entityType("Tenant")
	projectType  = entityType("Project")
	actionType   = entityType("Action")
	platformUID  = types.NewEntityUID(platformType, PlatformID)
)

func entityType(name string) types.EntityType {
	return types.EntityType(namespace + "::" + name)
}

// model is the parsed schema, indexed for the lookups a request needs. It is
// parsed once per process: the schema is embedded and cannot change.
type model struct {
	schema *resolved.Schema
	// actions holds the requestable actions (those with appliesTo), by name.
	actions map[string]resolved.Action
	// actionNames is Actions(), sorted.
	actionNames []string
	// actionEntities carries action-group membership into every
	// evaluation; without it `action in BC::Action::"read"` never matches.
	actionEntities types.EntityMap
}

var loadModel = sync.OnceValues(func() (*model, error) {
	var s schema.Schema
	s.SetFilename("schema.cedarschema")
	if err := s.UnmarshalCedar(schemaText); err != nil {
		return nil, fmt.Errorf("parse embedded schema: %w", err)
	}
	rs, err := s.Resolve()
	if err != nil {
		return nil, fmt.Errorf("resolve embedded schema: %w", err)
	}
	m := &model{schema: rs, actions: map[string]resolved.Action{}, actionEntities: types.EntityMap{}}
	for uid, a := range rs.Actions {
		m.actionEntities[uid] = a.Entity
		// Groups have no appliesTo; only leaves are ever requested.
		if a.AppliesTo == nil {
			continue
		}
		m.actions[string(uid.ID)] = a
	}
	m.actionNames = slices.Sorted(maps.Keys(m.actions))
	return m, nil
})

// mustModel is for callers that cannot return an error. The schema is
// embedded and parsed by every test run, so a failure here is a build defect.
func mustModel() *model {
	m, err := loadModel()
	if err != nil {
		panic("iam: " + err.Error())
	}
	return m
}

// Actions returns every action in the shipped schema, sorted.
func Actions() []string {
	return slices.Clone(mustModel().actionNames)
}

func (m *model) knownEntityType(t types.EntityType) bool {
	_, ok := m.schema.Entities[t]
	return ok
}

// knownAction reports whether uid names an action or action group.
func (m *model) knownAction(uid types.EntityUID) bool {
	_, ok := m.schema.Actions[uid]
	return ok
}

func (m *model) appliesToResource(a resolved.Action, t types.EntityType) bool {
	return slices.Contains(a.AppliesTo.Resources, t)
}

// defaultPolicyFiles returns the embedded default policy documents by path.
func defaultPolicyFiles() (map[string][]byte, error) {
	out := map[string][]byte{}
	err := fs.WalkDir(defaultPolicyFS, "policies", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".cedar") {
			return nil
		}
		b, err := defaultPolicyFS.ReadFile(path)
		if err != nil {
			return err
		}
		out[path] = b
		return nil
	})
	return out, err
}

func actionUID(name string) types.EntityUID {
	return types.NewEntityUID(actionType, types.String(name))
}

// entityChain looks entities up in several maps, so the shared action
// entities need not be copied into every request's map.
type entityChain []types.EntityMap

func (ec entityChain) Get(uid types.EntityUID) (types.Entity, bool) {
	for _, m := range ec {
		if e, ok := m[uid]; ok {
			return e, true
		}
	}
	return types.Entity{}, false
}
