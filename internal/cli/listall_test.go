package cli

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/envelope"
)

// listAll asks for pages no larger than the API accepts: --limit 1200 is
// three pages of 500, 500 and 200, never one page_size the API refuses.
func TestListAllPagesWithinTheAPICap(t *testing.T) {
	const total = 2000
	var sizes []int32
	page := func(_ context.Context, token string, size int32) ([]int, string, error) {
		if size < 0 || size > envelope.MaxPageSize {
			return nil, "", fmt.Errorf("page_size: must be between 0 and %d, got %d", envelope.MaxPageSize, size)
		}
		sizes = append(sizes, size)
		start := 0
		if token != "" {
			_, err := fmt.Sscan(token, &start)
			require.NoError(t, err)
		}
		n := int(size)
		if n == 0 {
			n = envelope.DefaultPageSize
		}
		end := min(start+n, total)
		items := make([]int, 0, end-start)
		for i := start; i < end; i++ {
			items = append(items, i)
		}
		next := ""
		if end < total {
			next = fmt.Sprint(end)
		}
		return items, next, nil
	}

	got, err := listAll(t.Context(), 1200, page)
	require.NoError(t, err)
	require.Len(t, got, 1200)
	require.Equal(t, 1199, got[1199])
	require.Equal(t, []int32{500, 500, 200}, sizes)

	sizes = nil
	got, err = listAll(t.Context(), 0, page) // no limit: the server's default pages, all of them
	require.NoError(t, err)
	require.Len(t, got, total)
	require.Len(t, sizes, total/envelope.DefaultPageSize)
}
