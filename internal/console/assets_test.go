package console

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// htmxSHA256 pins the vendored htmx build (assets/VENDORED.md).
const htmxSHA256 = "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"

// TestVendoredHTMXIsPinned: the htmx the console serves is the file whose
// checksum VENDORED.md records, and its licence ships beside it.
func TestVendoredHTMXIsPinned(t *testing.T) {
	t.Parallel()
	b, err := fs.ReadFile(assetsFS, "assets/"+htmxFile)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	require.Equal(t, htmxSHA256, hex.EncodeToString(sum[:]))
	doc, err := fs.ReadFile(assetsFS, "assets/VENDORED.md")
	require.NoError(t, err)
	require.Contains(t, string(doc), htmxFile)
	require.Contains(t, string(doc), htmxSHA256)
	lic, err := fs.ReadFile(assetsFS, "assets/htmx.LICENSE")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(lic), "Zero-Clause BSD"))
}
