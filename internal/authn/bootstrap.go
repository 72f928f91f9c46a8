package authn

import (
	"context"
	"errors"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// Bootstrap creates the platform's first administrator key when the
// database has no platform key yet, and returns its secret (created true).
// The key is of kind user: it belongs to the operator who installed the
// platform, the one human principal that exists before OIDC is set up.
// persist (may be nil) stores the secret where the operator will find it; it
// runs inside the transaction, so a key that could not be kept is never
// committed and the next start bootstraps again.
func Bootstrap(ctx context.Context, db *store.DB, rec envelope.Recorder, persist func(secret string) error) (secret string, created bool, err error) {
	err = db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		n, err := KeyCountPlatform(ctx, tx)
		if err != nil || n > 0 {
			return err
		}
		var hash string
		if secret, hash, err = NewSecret(); err != nil {
			return err
		}
		now := db.Clock().Now()
		k := ApiKey{
			ID: envelope.NewID("key", now), Name: "admin", Role: string(iam.RolePlatformAdmin), Kind: string(iam.KindUser),
			Prefix: secret[:prefixShown], SecretHash: hash, CreatedBy: "bootstrap", CreateTime: now,
		}
		if err := KeyInsert(ctx, tx, k); err != nil {
			return err
		}
		created = true
		if err := rec.InsertAudits(ctx, tx, []envelope.AuditEntry{{
			ID: envelope.NewID("aud", now), Time: now, PrincipalID: "bootstrap", PrincipalKind: "system",
			Action: "apiKeys.create", ResourceType: "ApiKey", ResourceID: k.ID, Decision: envelope.DecisionAllow, Result: "OK",
		}}); err != nil {
			return err
		}
		if err := rec.InsertEvents(ctx, tx, []envelope.Event{{
			Type: "platform.bootstrapped", ResourceType: "ApiKey", ResourceID: k.ID, Time: now, Data: map[string]any{"name": k.Name},
		}}); err != nil {
			return err
		}
		if persist != nil {
			return persist(secret)
		}
		return nil
	})
	if errors.Is(err, store.ErrUnique) {
		// Another replica bootstrapped the platform at the same moment.
		err = nil
	}
	if err != nil || !created {
		secret, created = "", false
	}
	return secret, created, err
}
