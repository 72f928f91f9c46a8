package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/audit"
	"github.com/better-compute/better-compute/internal/store"
)

// TestAuditProveAndVerify: the CLI end to end against a real control
// plane: the key, a saved checkpoint, a proof saved and verified offline
// with no server, a consistency proof from the saved checkpoint, forged
// and tampered inputs refused, and the full check catching an edited row.
func TestAuditProveAndVerify(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	dir := t.TempDir()
	env := map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: cp.URL, envToken: cp.AdminKey, "HOME": dir}
	cli := func(env map[string]string, argv ...string) (int, string, string) {
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}
	ok := func(argv ...string) string {
		t.Helper()
		code, out, errs := cli(env, argv...)
		require.Equal(t, 0, code, "%v: %s", argv, errs)
		return out
	}
	fails := func(env map[string]string, argv ...string) string {
		t.Helper()
		code, _, errs := cli(env, argv...)
		require.NotZero(t, code, "%v", argv)
		return errs
	}
	ctx := t.Context()
	ok("tenants", "create", "acme")
	_, err := cp.App.AuditLog.CheckpointNow(ctx)
	require.NoError(t, err)

	key := strings.TrimSpace(ok("audit", "key"))
	require.True(t, strings.HasPrefix(key, "better-compute.local/audit+"), key)
	cpFile := filepath.Join(dir, "checkpoint")
	out := ok("audit", "checkpoint", "--key", key, "--out", cpFile)
	require.Contains(t, out, "verified with "+key)
	saved, err := os.ReadFile(cpFile)
	require.NoError(t, err)
	first, err := audit.OpenCheckpoint(saved, key)
	require.NoError(t, err)
	require.Contains(t, ok("audit", "checkpoint"), "the server's own key", "unpinned, it says whose key it used")

	var list struct {
		Entries []struct{ ID, Action string }
	}
	require.NoError(t, json.Unmarshal([]byte(ok("audit", "list", "-o", "json")), &list))
	entry := list.Entries[0].ID
	proofFile := filepath.Join(dir, "proof.json")
	out = ok("audit", "prove", entry, "--key", key, "--out", proofFile)
	require.Contains(t, out, entry)
	require.Contains(t, out, "included in the checkpoint of size")

	// Offline: no server is reachable, and none is needed.
	noServer := map[string]string{envConfig: filepath.Join(dir, "none.yaml"), envServer: "http://127.0.0.1:1", "HOME": dir}
	code, out, errs := cli(noServer, "audit", "verify", "--proof", proofFile, "--key", key)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "included in the checkpoint of size")
	require.Contains(t, fails(noServer, "audit", "verify", "--proof", proofFile), "key")

	// A checkpoint under another key of the same name is refused, and so
	// is the genuine bundle under a forged key.
	_, forgedKey, err := audit.NewLogKey("better-compute.local/audit")
	require.NoError(t, err)
	require.Contains(t, fails(noServer, "audit", "verify", "--proof", proofFile, "--key", forgedKey), "not signed by the trusted log key")
	// A bundle whose entry was altered does not verify.
	var b audit.Bundle
	raw, err := os.ReadFile(proofFile)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &b))
	b.Leaf = bytes.Replace(b.Leaf, []byte("allow"), []byte("deny!"), 1)
	raw, err = json.Marshal(b)
	require.NoError(t, err)
	altered := filepath.Join(dir, "altered.json")
	require.NoError(t, os.WriteFile(altered, raw, 0o600))
	require.Contains(t, fails(noServer, "audit", "verify", "--proof", altered, "--key", key), "proof does not verify")

	// The log grows; the saved checkpoint is consistent with the latest.
	ok("tenants", "create", "globex")
	second, err := cp.App.AuditLog.CheckpointNow(ctx)
	require.NoError(t, err)
	require.Greater(t, second.Size, first.Size)
	consFile := filepath.Join(dir, "consistency.json")
	out = ok("audit", "verify", "--from", cpFile, "--key", key, "--out", consFile)
	require.Contains(t, out, "extends the one of size")
	code, out, errs = cli(noServer, "audit", "verify", "--proof", consFile, "--key", key)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "no entry changed, removed or reordered")

	require.Contains(t, ok("audit", "verify", "--full"), "clean")
	require.Contains(t, fails(env, "audit", "verify"), "exactly one of --from, --proof and --full")

	// A database attacker (owner rights: it drops the append-only guard)
	// edits a row: the full check and the entry's own proof both catch it.
	require.NoError(t, cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		drop := `DROP FUNCTION audit_append_only() CASCADE`
		if tx.Dialect() == store.SQLite {
			drop = `DROP TRIGGER audit_log_no_update`
		}
		if _, err := tx.Exec(ctx, drop); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE audit_log SET principal_id = 'someone-else' WHERE id = $1`, entry)
		return err
	}))
	require.Contains(t, fails(env, "audit", "verify", "--full"), "does not verify")
	code, out, _ = cli(env, "audit", "verify", "--full")
	require.NotZero(t, code)
	require.Contains(t, out, "edited or reordered")
	require.Contains(t, fails(env, "audit", "prove", entry, "--key", key), "proof does not verify")
}
