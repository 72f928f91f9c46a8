package releases

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/better-compute/better-compute/internal/downloads"
	"github.com/better-compute/better-compute/internal/images"
	"github.com/better-compute/better-compute/internal/store"
)

// Downloads serves published releases' files to /downloads
// (downloads.Published): the signed manifest from the row, the binaries
// and SBOMs from the blob store.
type Downloads struct {
	DB    *store.DB
	Blobs *images.Blobs
}

var _ downloads.Published = Downloads{}

// Open implements downloads.Published.
func (d Downloads) Open(ctx context.Context, version, file string) (*downloads.Content, bool, error) {
	var (
		r     Release
		files []File
	)
	err := d.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		if r, err = Get(ctx, tx, version); err != nil {
			return err
		}
		files, err = FileList(ctx, tx, version)
		return err
	})
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	if file == "manifest.json" {
		return &downloads.Content{ReadSeeker: bytes.NewReader(r.Manifest), ModTime: r.CreateTime}, true, nil
	}
	platform, suffix, _ := strings.Cut(file, ".")
	kind := KindBinary
	if suffix == "sbom.json" {
		kind = KindSBOM
	}
	for _, f := range files {
		if f.Platform != platform || f.Kind != kind {
			continue
		}
		if suffix == "sha256" {
			// The form the install script and sha256sum -c read.
			return &downloads.Content{ReadSeeker: strings.NewReader(fmt.Sprintf("%s  bcd\n", f.SHA256)), ModTime: r.CreateTime}, true, nil
		}
		blob, err := d.Blobs.Open(f.SHA256)
		if err != nil {
			return nil, true, err
		}
		return &downloads.Content{ReadSeeker: blob, ModTime: r.CreateTime, Close: blob.Close}, true, nil
	}
	return nil, true, nil
}
