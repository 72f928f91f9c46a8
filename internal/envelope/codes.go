package envelope

import (
	"maps"

	"connectrpc.com/connect"
)

// Codes returns every machine code with the Connect code it travels as.
// docs/api.md's error table is tested against it, so a new code cannot
// ship undocumented.
func Codes() map[Code]connect.Code { return maps.Clone(connectCodes) }
