// Package cli is the better-compute operator command line: a cobra command
// tree that calls the API through the public SDK (package client) and prints
// the answers as a table, JSON or YAML.
//
// It owns the config file of named contexts (server, token, default tenant)
// and the precedence of where a setting comes from: flag, then environment,
// then the current context.
//
// The CLI must never log, print or echo a token: not the one it
// authenticates with, not one read from the config file, and not in error
// messages. The one exception is the secret of a newly created API key,
// which the server shows exactly once and the operator must see to store it.
// It holds no business logic: every decision (authorization, validation,
// confirmation) is the server's, the CLI only reports it.
package cli
