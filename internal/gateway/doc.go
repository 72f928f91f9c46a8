// Package gateway is the control plane's side of the agent wire contract
// (bettercompute.agent.v1): a grpc-go server over TLS 1.3 mutual auth that
// admits nodes (Join), renews their certificates (Renew) and holds one
// Session stream per node for hellos, heartbeats, inventory, command
// delivery and command updates. It also runs the liveness and command
// sweeps as River jobs, and wakes a node's session when a command is
// written (in process, and across replicas with PostgreSQL LISTEN/NOTIFY).
//
// Fleet paths authenticate by node certificate and must never ask the
// authorizer (iam.Authorizer): the certificate is the authorization. The
// gateway must never let a node act for another node, write anything for a
// message it refuses, or keep state another replica cannot rebuild from the
// database.
package gateway
