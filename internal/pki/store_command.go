package pki

// SQL over the command-signing tables (cmdsign.go).

import (
	"context"
	"errors"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

func commandCAList(ctx context.Context, q store.Querier) ([]commandCARow, error) {
	rows, err := q.Query(ctx, `SELECT version, root_der, root_key_sealed, ca_der, ca_key_sealed, seal, create_time, retire_time, activate_time
		FROM pki_command_cas ORDER BY version`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []commandCARow
	for rows.Next() {
		var r commandCARow
		if err := rows.Scan(&r.Version, &r.RootDER, &r.RootKeySealed, &r.CADER, &r.CAKeySealed, &r.Seal, &r.CreateTime, &r.RetireTime, &r.ActivateTime); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func commandCAInsert(ctx context.Context, tx store.Tx, r commandCARow) error {
	var rootKey any // a nil []byte must bind as NULL on both drivers
	if r.RootKeySealed != nil {
		rootKey = r.RootKeySealed
	}
	var activate any
	if r.ActivateTime != nil {
		activate = *r.ActivateTime
	}
	_, err := tx.Exec(ctx, `INSERT INTO pki_command_cas (version, root_der, root_key_sealed, ca_der, ca_key_sealed, seal, create_time, activate_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, r.Version, r.RootDER, rootKey, r.CADER, r.CAKeySealed, r.Seal, r.CreateTime, activate)
	return err
}

// commandCAActivate activates every published generation up to version.
func commandCAActivate(ctx context.Context, tx store.Tx, version int64, now time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE pki_command_cas SET activate_time = $2 WHERE version <= $1 AND activate_time IS NULL`, version, now)
	return err
}

// commandCARetire retires every generation up to version.
func commandCARetire(ctx context.Context, tx store.Tx, version int64, now time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE pki_command_cas SET retire_time = $2 WHERE version <= $1 AND retire_time IS NULL`, version, now)
	return err
}

// commandSignersOlder lists live worker certificates of generations older
// than active whose replica holds none of active or later: a replica that
// has not seen the activation yet and may still sign with the old key.
func commandSignersOlder(ctx context.Context, q store.Querier, active int64) ([]OldSigner, error) {
	rows, err := q.Query(ctx, `SELECT s.serial, s.replica, s.version, s.not_after FROM pki_command_signers s
		WHERE s.version < $1 AND s.not_after > compute_now()
		AND NOT EXISTS (SELECT 1 FROM pki_command_signers n WHERE n.replica = s.replica AND n.version >= $1)
		ORDER BY s.replica, s.serial`, active)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []OldSigner
	for rows.Next() {
		var o OldSigner
		if err := rows.Scan(&o.Serial, &o.Replica, &o.Version, &o.NotAfter); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

func commandCAKeysUpdate(ctx context.Context, tx store.Tx, version int64, rootKey, caKey, seal []byte) error {
	var rootArg any // NULL stays NULL on both drivers
	if rootKey != nil {
		rootArg = rootKey
	}
	_, err := tx.Exec(ctx, `UPDATE pki_command_cas SET root_key_sealed = $2, ca_key_sealed = $3, seal = $4 WHERE version = $1`,
		version, rootArg, caKey, seal)
	return err
}

func commandSignerGet(ctx context.Context, q store.Querier, serial string) (version int64, der []byte, err error) {
	err = q.QueryRow(ctx, `SELECT version, cert_der FROM pki_command_signers WHERE serial = $1`, serial).Scan(&version, &der)
	return version, der, err
}

func commandSignerExists(ctx context.Context, q store.Querier, serial string) (bool, error) {
	var one int
	err := q.QueryRow(ctx, `SELECT 1 FROM pki_command_signers WHERE serial = $1`, serial).Scan(&one)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

func commandSignerInsert(ctx context.Context, tx store.Tx, serial string, version int64, der []byte, replica string, notAfter, now time.Time) error {
	_, err := tx.Exec(ctx, `INSERT INTO pki_command_signers (serial, version, cert_der, replica, not_after, issue_time)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (serial) DO NOTHING`, serial, version, der, replica, notAfter, now)
	return err
}
