package envelope

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/internal/store"
)

var errIdempotencyRace = errors.New("idempotency key committed concurrently")

func checkIdempotencyKey(key string, m Method) error {
	if !m.Create {
		return Invalid(Violation{Field: HeaderIdempotencyKey, Reason: "is honoured on create methods only"})
	}
	if len(key) > 128 {
		return Invalid(Violation{Field: HeaderIdempotencyKey, Reason: "must be at most 128 bytes"})
	}
	for _, r := range key {
		if r < 0x21 || r > 0x7e {
			return Invalid(Violation{Field: HeaderIdempotencyKey, Reason: "must be printable ASCII without spaces"})
		}
	}
	return nil
}

// replay returns the stored result of an earlier request with the same key
// by the same principal. A key reused for a different request is refused.
func replay[Res any](ctx context.Context, e *Envelope, caller Caller, key, procedure, reqHash string) (*Res, bool, error) {
	var (
		gotProc, gotHash string
		body             []byte
	)
	err := e.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return idempotencyGet(ctx, tx, caller.Principal.ID, key).Scan(&gotProc, &gotHash, &body)
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, FromStore(err, "idempotency key")
	case gotProc != procedure || gotHash != reqHash:
		return nil, false, Errorf(CodeIdempotencyKeyReused, "Idempotency-Key %q was used for a different request", key)
	}
	res := new(Res)
	msg, ok := any(res).(proto.Message)
	if !ok {
		return nil, false, fmt.Errorf("envelope: response %T is not a proto message", res)
	}
	if err := proto.Unmarshal(body, msg); err != nil {
		return nil, false, &Error{Code: CodeInternal, Message: "internal error", Err: err}
	}
	return res, true, nil
}

// idemRecord is a create's result kept for replay under its key.
type idemRecord struct {
	principalID, key, procedure, reqHash string
	body                                 []byte
	expire                               time.Time
}
