package envelope

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
		return tx.QueryRow(ctx, `SELECT procedure, request_hash, response FROM idempotency_keys
			WHERE principal_id = $1 AND key = $2 AND expire_time > compute_now()`,
			caller.Principal.ID, key).Scan(&gotProc, &gotHash, &body)
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

// idempotencyInsert stores results for replay; a key another request stored
// first fails with errIdempotencyRace.
func idempotencyInsert(ctx context.Context, tx store.Tx, recs []idemRecord) error {
	if len(recs) == 0 {
		return nil
	}
	// An expired row for the same key may still be there until the pruner
	// runs; it no longer counts.
	rows := make([][]any, len(recs))
	var where strings.Builder
	args := make([]any, 0, 2*len(recs))
	for i, r := range recs {
		rows[i] = []any{r.principalID, r.key, r.procedure, r.reqHash, r.body, store.Raw("compute_now()"), r.expire}
		if i > 0 {
			where.WriteString(" OR ")
		}
		fmt.Fprintf(&where, "(principal_id = $%d AND key = $%d)", 2*i+1, 2*i+2)
		args = append(args, r.principalID, r.key)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM idempotency_keys WHERE expire_time <= compute_now() AND (`+where.String()+`)`, args...); err != nil {
		return err
	}
	err := store.InsertRows(ctx, tx, `INSERT INTO idempotency_keys (principal_id, key, procedure, request_hash, response, create_time, expire_time)`, "", rows)
	if errors.Is(err, store.ErrUnique) {
		return errIdempotencyRace
	}
	return err
}

// PruneIdempotencyKeys deletes expired keys; a periodic job calls it.
func PruneIdempotencyKeys(ctx context.Context, db *store.DB) (int64, error) {
	var n int64
	err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		n, err = tx.Exec(ctx, `DELETE FROM idempotency_keys WHERE expire_time <= compute_now()`)
		return err
	})
	return n, err
}
