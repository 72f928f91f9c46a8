// Package mcp serves Better Compute to AI agents over the Model Context
// Protocol (github.com/modelcontextprotocol/go-sdk): tools for pools,
// capacity, GPU reservations, nodes and usage, and resources for pools and
// reservations, over stdio (`better-compute mcp`, a desktop agent's
// subprocess) and streamable HTTP at /mcp on the API listener.
//
// Every tool and resource is a client of the public API: each call goes
// through the API's envelope as the caller's principal (its one
// authorization decision, its audit row, its confirmations), over the
// network for stdio and in process for HTTP. The package must never read
// or write the database, decide access, or hold a credential beyond the
// call that carries it.
package mcp
