//go:build !unix

package sqlite

import "context"

// lockFile has no cross-process lock off unix; store.Migrate still checks
// each version again inside its BEGIN IMMEDIATE transaction.
func lockFile(context.Context, string) (func(), error) { return func() {}, nil }

func holdFile(string) (func(), error) { return func() {}, nil }
