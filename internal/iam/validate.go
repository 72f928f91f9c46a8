package iam

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"
	"github.com/cedar-policy/cedar-go/x/exp/ast"
)

// Validate checks a tenant policy document before it is stored: it must
// parse, and every entity type, action and annotation it names must exist in
// the shipped schema. A policy naming a type that does not exist would never
// match, which is how a forbid silently stops protecting anything.
//
// It is a reference check, not a full type check: resource attributes are
// whatever the API projects, and the schema does not enumerate them.
func (c *Cedar) Validate(id, text string) error {
	list, err := cedar.NewPolicyListFromBytes(id, []byte(text))
	if err != nil {
		return parseError(err)
	}
	if len(list) == 0 {
		return &ValidationError{Field: "text", Reason: errNoPolicies.Error()}
	}
	for _, p := range list {
		if err := checkReferences(c.model, p); err != nil {
			var ve *ValidationError
			if errors.As(err, &ve) {
				return ve
			}
			return &ValidationError{Field: "text", Reason: err.Error()}
		}
	}
	return nil
}

// checkReferences walks one policy's scope, conditions and annotations.
func checkReferences(m *model, p *cedar.Policy) error {
	field := "text"
	if line := p.Position().Line; line > 0 {
		field = "text:line " + strconv.Itoa(line)
	}
	fail := func(format string, args ...any) error {
		return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	for k, v := range p.Annotations() {
		switch k {
		case annotationID, annotationDescription:
		case annotationConfirm:
			if v != "human" {
				return fail("@confirm must be \"human\", got %q", v)
			}
			if p.Effect() != cedar.Forbid {
				return fail("@confirm only applies to forbid policies")
			}
		default:
			return fail("unknown annotation @%s", k)
		}
	}

	a := (*ast.Policy)(p.AST())
	var errs []error
	checkType := func(t types.EntityType) {
		if t == actionType {
			errs = append(errs, fail("%s is not an entity type for principals or resources", t))
		} else if !m.knownEntityType(t) {
			errs = append(errs, fail("unknown entity type %s", t))
		}
	}
	checkUID := func(uid types.EntityUID) {
		if uid.Type == actionType {
			if !m.knownAction(uid) {
				errs = append(errs, fail("unknown action %q", uid.ID))
			}
			return
		}
		checkType(uid.Type)
	}
	checkScope := func(s ast.IsScopeNode) {
		switch s := s.(type) {
		case ast.ScopeTypeEq:
			checkUID(s.Entity)
		case ast.ScopeTypeIn:
			checkUID(s.Entity)
		case ast.ScopeTypeInSet:
			for _, e := range s.Entities {
				checkUID(e)
			}
		case ast.ScopeTypeIs:
			checkType(s.Type)
		case ast.ScopeTypeIsIn:
			checkType(s.Type)
			checkUID(s.Entity)
		}
	}
	checkScope(a.Principal)
	checkScope(a.Resource)
	// The action scope only ever holds actions; a non-action there never matches.
	switch s := a.Action.(type) {
	case ast.ScopeTypeEq:
		checkAction(m, s.Entity, &errs, fail)
	case ast.ScopeTypeIn:
		checkAction(m, s.Entity, &errs, fail)
	case ast.ScopeTypeInSet:
		for _, e := range s.Entities {
			checkAction(m, e, &errs, fail)
		}
	}
	for _, cond := range a.Conditions {
		ast.Inspect(ast.NewNode(cond.Body), func(n ast.IsNode) bool {
			switch n := n.(type) {
			case ast.NodeValue:
				checkValue(n.Value, checkUID)
			case ast.NodeTypeIs:
				checkType(n.EntityType)
			case ast.NodeTypeIsIn:
				checkType(n.EntityType)
			}
			return true
		})
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

func checkAction(m *model, uid types.EntityUID, errs *[]error, fail func(string, ...any) error) {
	if uid.Type != actionType || !m.knownAction(uid) {
		*errs = append(*errs, fail("unknown action %s", uid))
	}
}

// checkValue finds entity references inside literal values, including sets
// and records the parser folded into constants.
func checkValue(v types.Value, checkUID func(types.EntityUID)) {
	switch v := v.(type) {
	case types.EntityUID:
		checkUID(v)
	case types.Set:
		for e := range v.All() {
			checkValue(e, checkUID)
		}
	case types.Record:
		for _, e := range v.All() {
			checkValue(e, checkUID)
		}
	}
}

// parseLine pulls the line out of cedar-go's "file:line:col" parse errors.
var parseLine = regexp.MustCompile(`:(\d+):\d+`)

func parseError(err error) *ValidationError {
	msg := strings.TrimPrefix(err.Error(), "parser error: ")
	if m := parseLine.FindStringSubmatch(msg); m != nil {
		return &ValidationError{Field: "text:line " + m[1], Reason: msg}
	}
	return &ValidationError{Field: "text", Reason: msg}
}
