package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/release"
)

// releasesCommand is the control plane's published releases; `release`
// (release.go) is the offline half that makes and checks them.
func (a *app) releasesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "releases", Short: "Publish, list and delete bcd releases in the control plane"}
	var manifestPath, confirmationID string
	create := &cobra.Command{
		Use:   "create --manifest DIR/manifest.json",
		Short: "Publish a signed release: its manifest and the binaries and SBOMs it names, read from the manifest's directory",
		Long: `Publish a release signed with release sign. The files the manifest names (each
platform's binary and its SBOM) are read from the manifest's directory: release
sign writes the SBOMs there; copy the binaries beside them. The control plane
checks the signature against its release public keys (--release-pubkey) and
each file's size and sha256 against the manifest, and keeps nothing unless all
of it holds. Platform administrators only.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if manifestPath == "" {
				return invalidArg("manifest", "required: pass --manifest DIR/manifest.json (release sign writes it)")
			}
			text, err := os.ReadFile(manifestPath)
			if err != nil {
				return invalidArg("manifest", err.Error())
			}
			names, err := releaseFileNames(text)
			if err != nil {
				return invalidArg("manifest", err.Error())
			}
			dir := filepath.Dir(manifestPath)
			for _, n := range names {
				if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
					return invalidArg("manifest", fmt.Sprintf("the manifest names %s, which is not beside it in %s: copy it there", n, dir))
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var res *apiv1.CreateReleaseResponse
			err = a.retry(cmd.Context(), func() error {
				var files []client.ReleaseFile
				for _, n := range names {
					f, err := os.Open(filepath.Join(dir, n))
					if err != nil {
						return err
					}
					defer f.Close()
					files = append(files, client.ReleaseFile{Name: n, Content: f})
				}
				res, err = c.CreateRelease(cmd.Context(), string(text), files, m.idempotencyKey)
				return err
			})
			if err != nil {
				return err
			}
			return a.printReleases(cmd, res, res.GetRelease())
		},
	}
	create.Flags().StringVar(&manifestPath, "manifest", "", "the signed manifest.json release sign wrote; the files it names are read from its directory")

	get := &cobra.Command{
		Use:   "get VERSION",
		Short: "Show a published release and its files",
		Args:  positional("VERSION"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			resp, err := c.Releases.Get(cmd.Context(), connect.NewRequest(&apiv1.GetReleaseRequest{Version: argv[0]}))
			if err != nil {
				return err
			}
			r := resp.Msg.GetRelease()
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				fmt.Fprintf(w, "release %s (min control plane %s) signed by %s, published %s by %s\n",
					r.GetVersion(), r.GetMinControlPlaneVersion(), r.GetKeyId(), ts(r.GetCreateTime()), r.GetCreatedBy())
				row(w, "PLATFORM", "KIND", "NAME", "SIZE", "SHA256")
				for _, f := range r.GetFiles() {
					row(w, f.GetPlatform(), f.GetKind(), f.GetName(), fmt.Sprint(f.GetSizeBytes()), f.GetSha256())
				}
			})
		},
	}

	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List published releases",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Release, string, error) {
				resp, err := c.Releases.List(ctx, connect.NewRequest(&apiv1.ListReleasesRequest{PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetReleases(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printReleases(cmd, &apiv1.ListReleasesResponse{Releases: all}, all...)
		},
	}
	addLimitFlag(list, &limit)

	del := &cobra.Command{
		Use:   "delete VERSION",
		Short: "Delete a published release; /downloads stops serving it",
		Args:  positional("VERSION"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			resp, err := c.Releases.Delete(cmd.Context(), request(&apiv1.DeleteReleaseRequest{Version: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "deleted release %s\n", argv[0]) })
		},
	}
	for _, c := range []*cobra.Command{create, del} {
		addConfirmationFlag(c, &confirmationID)
	}
	cmd.AddCommand(create, get, list, del)
	return cmd
}

// releaseFileNames reads the names of the files a manifest names. It does
// not verify the signature (the control plane does, with its keys): it only
// learns what to send.
func releaseFileNames(text []byte) ([]string, error) {
	var e release.Envelope
	if err := json.Unmarshal(text, &e); err != nil {
		return nil, fmt.Errorf("not a signed release manifest: %w", err)
	}
	var m release.Manifest
	if err := json.NewDecoder(bytes.NewReader(e.Manifest)).Decode(&m); err != nil {
		return nil, fmt.Errorf("not a signed release manifest: its manifest: %w", err)
	}
	if len(m.Binaries) == 0 {
		return nil, fmt.Errorf("not a signed release manifest: it names no binary")
	}
	var names []string
	for _, b := range m.Binaries {
		for _, n := range []string{b.Name, b.SBOM.Name} {
			// The directory is the manifest's: a name must not leave it.
			if n == "" || n != filepath.Base(n) || strings.HasPrefix(n, ".") {
				return nil, fmt.Errorf("names the file %q, which is not a file name", n)
			}
			names = append(names, n)
		}
	}
	return names, nil
}

func (a *app) printReleases(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Release) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "VERSION", "MIN CONTROL PLANE", "PLATFORMS", "KEY", "CREATED")
		for _, r := range items {
			row(w, r.GetVersion(), r.GetMinControlPlaneVersion(), strings.Join(r.GetPlatforms(), ","), r.GetKeyId(), ts(r.GetCreateTime()))
		}
	})
}
