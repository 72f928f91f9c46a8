// Package fleet owns the fleet's tables (nodes, join tokens, join requests,
// commands, inventory) and the API side of them: the NodeService,
// CommandService, JoinTokenService, JoinRequestService and InventoryService
// handlers, and the store functions the gateway shares to drive nodes from
// their sessions.
//
// It must never decide access itself (every API call goes through the
// envelope), never store a join token (only its row; the sealed token is
// shown once), and never reach the PKI or a node's session directly: it
// calls the CertRevoker, TokenSealer and CommandNotifier ports the app wires.
package fleet
