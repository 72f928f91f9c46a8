package releases

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/images"
	"github.com/better-compute/better-compute/internal/release"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// MaxFileBytes bounds each file of a release: a bcd binary is ~100 MiB.
const MaxFileBytes int64 = 1 << 30

// Service serves the ReleaseService API.
type Service struct {
	env   *envelope.Envelope
	blobs *images.Blobs
	keys  []release.PublicKey
	log   *slog.Logger
	inUse InUse
}

// InUse answers, inside a delete's transaction, what still uses release
// version (an active rollout's id), or "" when nothing does.
type InUse func(ctx context.Context, q store.Querier, version string) (string, error)

// SetInUse sets the check a delete makes (the rollouts, wired by the app:
// the two packages do not import each other).
func (s *Service) SetInUse(fn InUse) *Service {
	s.inUse = fn
	return s
}

// NewService returns the release handlers; keys are the release public
// keys a manifest must be signed by.
func NewService(env *envelope.Envelope, blobs *images.Blobs, keys []release.PublicKey, log *slog.Logger) *Service {
	return &Service{env: env, blobs: blobs, keys: keys, log: cmp.Or(log, slog.Default())}
}

var _ apiv1connect.ReleaseServiceHandler = (*Service)(nil)

// Resource projects a release into the authorization model: the
// platform's, or, for a read by a tenant's principal, in the reader's
// tenant (every tenant reads releases).
func Resource(version, tenantID string) iam.Resource {
	return iam.Resource{Type: "Release", ID: version, TenantID: tenantID, Attrs: map[string]any{"version": version}}
}

// refusal turns a release.Error into an API error naming the manifest's
// field: RELEASE_UNTRUSTED for a key or signature, INVALID_ARGUMENT for the
// rest.
func refusal(err error) error {
	var re *release.Error
	if !errors.As(err, &re) {
		return err
	}
	field := re.Field
	if !strings.HasPrefix(field, "manifest") {
		field = "manifest." + field // the request field, then the envelope's
	}
	v := envelope.Violation{Field: field, Reason: re.Kind.Error() + ": " + re.Reason}
	if errors.Is(err, release.ErrUnknownKey) || errors.Is(err, release.ErrBadSignature) || errors.Is(err, release.ErrWrongPurpose) {
		return &envelope.Error{Code: envelope.CodeReleaseUntrusted, Message: fmt.Sprintf("%s %s", v.Field, v.Reason), Violations: []envelope.Violation{v}}
	}
	return envelope.Invalid(v)
}

// expected lists the files a manifest names, by name.
func expected(m release.Manifest) map[string]File {
	out := map[string]File{}
	for _, b := range m.Binaries {
		out[b.Name] = File{Version: m.Version, Name: b.Name, Platform: b.Platform, Kind: KindBinary, SHA256: b.SHA256, SizeBytes: b.Size}
		out[b.SBOM.Name] = File{Version: m.Version, Name: b.SBOM.Name, Platform: b.Platform, Kind: KindSBOM, SHA256: b.SBOM.SHA256, SizeBytes: b.SBOM.Size}
	}
	return out
}

// fileStream reads a Create's files after its header: a file message, then
// that file's chunks, until the next file message or the stream's end.
type fileStream struct {
	stream  *connect.ClientStream[apiv1.CreateReleaseRequest]
	pending string // the name of a file message read at the end of the last file
	buf     []byte
	done    bool
	err     error
}

// next returns the next file's name, or "" at the end of the stream.
func (f *fileStream) next() (string, error) {
	if f.pending != "" {
		name := f.pending
		f.pending = ""
		return name, nil
	}
	if f.err != nil {
		return "", f.err
	}
	if f.done || !f.stream.Receive() {
		f.done = true
		return "", f.stream.Err()
	}
	msg := f.stream.Msg()
	switch {
	case msg.GetFile() != nil:
		if msg.GetFile().GetName() == "" {
			return "", envelope.Invalid(envelope.Violation{Field: "file.name", Reason: "is required"})
		}
		return msg.GetFile().GetName(), nil
	case msg.GetHeader() != nil:
		return "", envelope.Invalid(envelope.Violation{Field: "header", Reason: "may only be the first message of a create"})
	default:
		return "", envelope.Invalid(envelope.Violation{Field: "chunk", Reason: "came before any file message: send a file message naming the file first"})
	}
}

// Read reads the current file's bytes; io.EOF at the next file message or
// the stream's end.
func (f *fileStream) Read(p []byte) (int, error) {
	for len(f.buf) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		if f.done || f.pending != "" {
			return 0, io.EOF
		}
		if !f.stream.Receive() {
			f.done = true
			if err := f.stream.Err(); err != nil {
				f.err = err
				return 0, err
			}
			return 0, io.EOF
		}
		msg := f.stream.Msg()
		switch {
		case msg.GetFile() != nil:
			f.pending = msg.GetFile().GetName()
			if f.pending == "" {
				f.err = envelope.Invalid(envelope.Violation{Field: "file.name", Reason: "is required"})
			}
		case msg.GetHeader() != nil:
			f.err = envelope.Invalid(envelope.Violation{Field: "header", Reason: "may only be the first message of a create"})
		default:
			f.buf = msg.GetChunk()
		}
	}
	n := copy(p, f.buf)
	f.buf = f.buf[n:]
	return n, nil
}

// Create publishes a release: the manifest is verified and decided on at
// once, then each file streams into a staging file, hashed as it arrives.
// Only when every file the manifest names arrived whole are the blobs
// placed and the rows committed; any refusal keeps nothing.
func (s *Service) Create(ctx context.Context, stream *connect.ClientStream[apiv1.CreateReleaseRequest]) (*connect.Response[apiv1.CreateReleaseResponse], error) {
	if !stream.Receive() {
		err := stream.Err()
		if err == nil {
			err = envelope.Invalid(envelope.Violation{Field: "header", Reason: "is required: the first message of a create"})
		}
		return nil, s.env.Fail(ctx, err)
	}
	hdr := stream.Msg().GetHeader()
	if hdr == nil {
		return nil, s.env.Fail(ctx, envelope.Invalid(envelope.Violation{Field: "header", Reason: "is required: the first message of a create"}))
	}
	req := connect.NewRequest(hdr)
	for k, v := range stream.RequestHeader() {
		req.Header()[k] = v
	}
	var (
		m     release.Manifest
		keyID string
		want  map[string]File
		taken bool
		// noKeys: this control plane trusts no release key.
		noKeys bool
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateReleaseResponse]{
		AuditRefusals: true,
		Validate: func() error {
			if hdr.GetManifest() == "" {
				return envelope.Invalid(envelope.Violation{Field: "manifest", Reason: "is required: the signed manifest.json `release sign` wrote"})
			}
			if len(s.keys) == 0 {
				// Refused after the decision (Submit): who may not publish
				// learns nothing of this control plane's configuration.
				noKeys = true
				return nil
			}
			man, key, err := release.Verify([]byte(hdr.GetManifest()), s.keys)
			if err != nil {
				return refusal(err)
			}
			m, keyID, want = man, key.ID, expected(man)
			var vs envelope.Violations
			for _, name := range slices.Sorted(maps.Keys(want)) {
				if want[name].SizeBytes > MaxFileBytes {
					vs.Add("manifest", "%s is %d bytes: a release file may be at most %d", name, want[name].SizeBytes, MaxFileBytes)
				}
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			if noKeys {
				return Resource("", ""), nil
			}
			// Read now so a published version is refused before its files
			// are sent; the primary key still decides a race.
			switch _, err := Get(ctx, q, m.Version); {
			case err == nil:
				taken = true
			case !errors.Is(err, ErrNotFound):
				return iam.Resource{}, err
			}
			return Resource(m.Version, ""), nil
		},
		Submit: func(ctx context.Context, write func(ctx context.Context, b *envelope.Batch) error) error {
			if noKeys {
				return envelope.Errorf(envelope.CodeFailedPrecondition,
					"this control plane trusts no release key: start it with --release-pubkey FILE (docs/releases.md)")
			}
			if taken {
				return alreadyPublished(m.Version)
			}
			staged, err := s.receive(ctx, stream, m.Version, want)
			defer func() {
				for _, st := range staged {
					st.Discard() // a placed file is gone from the uploads: a no-op
				}
			}()
			if err != nil {
				return err
			}
			return s.place(ctx, staged, write)
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateReleaseResponse, error) {
			r := Release{Version: m.Version, MinControlPlaneVersion: m.MinControlPlaneVersion, Manifest: []byte(hdr.GetManifest()),
				KeyID: keyID, CreatedBy: tx.Caller().Principal.ID, CreateTime: tx.Now()}
			for _, b := range m.Binaries {
				r.Platforms = append(r.Platforms, b.Platform)
			}
			files := sortedFiles(want)
			if err := ReleaseInsert(ctx, tx, &r, files); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, alreadyPublished(r.Version)
				}
				return nil, err
			}
			tx.SetResource(r.Version, "")
			tx.Emit(envelope.Event{Type: "release.published", ResourceType: "Release", ResourceID: r.Version,
				Data: map[string]any{"version": r.Version, "min_control_plane_version": r.MinControlPlaneVersion,
					"platforms": r.Platforms, "key_id": r.KeyID}})
			return &apiv1.CreateReleaseResponse{Release: Proto(r, files)}, nil
		},
	})
}

func alreadyPublished(version string) error {
	return envelope.Errorf(envelope.CodeAlreadyExists, "release %s is already published: a version is published once (delete it first to publish it again)", version)
}

func sortedFiles(want map[string]File) []File {
	files := make([]File, 0, len(want))
	for _, f := range want {
		files = append(files, f)
	}
	slices.SortFunc(files, func(a, b File) int {
		return cmp.Or(strings.Compare(a.Platform, b.Platform), strings.Compare(a.Kind, b.Kind))
	})
	return files
}

// receive stages every file of the stream, each checked against the
// manifest's size and sha256 as it arrives. It returns what it staged,
// also on error, for the caller to discard.
func (s *Service) receive(ctx context.Context, stream *connect.ClientStream[apiv1.CreateReleaseRequest], version string, want map[string]File) (map[string]*images.Staged, error) {
	staged := map[string]*images.Staged{}
	fs := &fileStream{stream: stream}
	for {
		name, err := fs.next()
		if err != nil {
			return staged, ended(ctx, err, version)
		}
		if name == "" {
			break
		}
		at := "files[" + name + "]"
		w, ok := want[name]
		switch {
		case !ok:
			return staged, envelope.Invalid(envelope.Violation{Field: at,
				Reason: fmt.Sprintf("is not a file the manifest of %s names (it names %s)", version, strings.Join(slices.Sorted(maps.Keys(want)), ", "))})
		case staged[name] != nil:
			return staged, envelope.Invalid(envelope.Violation{Field: at, Reason: "was sent twice"})
		}
		st, err := s.blobs.Stage(fs, w.SHA256, w.SizeBytes)
		if err != nil {
			var apiErr *envelope.Error
			if errors.As(err, &apiErr) {
				return staged, apiErr
			}
			if ctx.Err() != nil || errors.Is(err, io.ErrUnexpectedEOF) || fs.err != nil {
				return staged, ended(ctx, err, version)
			}
			// Stage refuses bytes that disagree with the manifest; say
			// what arrived against what the signature pins.
			v := envelope.Violation{Field: at, Reason: fmt.Sprintf("%s; the signed manifest pins %d bytes with sha256 %s", err, w.SizeBytes, w.SHA256)}
			return staged, &envelope.Error{Code: envelope.CodeDigestMismatch,
				Message: fmt.Sprintf("release %s: %s %s; nothing was kept", version, v.Field, v.Reason), Violations: []envelope.Violation{v}}
		}
		staged[name] = st
	}
	var missing []string
	for name := range want {
		if staged[name] == nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return staged, envelope.Invalid(envelope.Violation{Field: "files",
			Reason: fmt.Sprintf("%s missing: the manifest of %s names it; nothing was kept", strings.Join(missing, ", "), version)})
	}
	return staged, nil
}

// ended explains a stream that stopped short.
func ended(ctx context.Context, err error, version string) error {
	var apiErr *envelope.Error
	if errors.As(err, &apiErr) {
		return apiErr
	}
	if ctx.Err() != nil || errors.Is(err, io.ErrUnexpectedEOF) {
		return envelope.Errorf(envelope.CodeInvalidArgument, "release %s: the upload ended early; nothing was kept", version)
	}
	return err
}

// place moves the staged files into the blob store and commits, under
// every digest's lock (taken in digest order), so a concurrent delete never
// removes a blob this release is about to name. A failed commit takes back
// the blobs it placed that nothing else names.
func (s *Service) place(ctx context.Context, staged map[string]*images.Staged, write func(ctx context.Context, b *envelope.Batch) error) error {
	var shas []string
	for _, st := range staged {
		shas = append(shas, st.SHA)
	}
	slices.Sort(shas)
	shas = slices.Compact(shas)
	for _, sha := range shas {
		unlock := s.blobs.Lock(sha)
		defer unlock()
	}
	var created []string
	for _, st := range staged {
		made, err := s.blobs.Place(st)
		if err != nil {
			s.collect(context.WithoutCancel(ctx), created)
			return err
		}
		if made {
			created = append(created, st.SHA)
		}
	}
	err := s.env.CommitAlone(ctx, write)
	if err != nil {
		s.collect(context.WithoutCancel(ctx), created)
	}
	return err
}

// collect removes the blobs no release file nor image names any more. The
// caller holds their digests' locks.
func (s *Service) collect(ctx context.Context, shas []string) {
	for _, sha := range shas {
		var used bool
		err := s.env.DB().Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			used, err = s.blobs.Referenced(ctx, tx, sha)
			return err
		})
		if err == nil && !used {
			err = s.blobs.Remove(sha)
		}
		if err != nil {
			// A blob left behind is disk, not a fault: an operator collects it.
			s.log.WarnContext(ctx, "release blob not collected", "sha256", sha, "err", err)
		}
	}
}

// readScope is the reader's scope: reads are decided in the caller's
// tenant, or the platform.
func readScope(ctx context.Context, q store.Querier) (tenancy.Scope, error) {
	return tenancy.LookupScope(ctx, q, "")
}

// Get reads a published release.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetReleaseRequest]) (*connect.Response[apiv1.GetReleaseResponse], error) {
	version := req.Msg.GetVersion()
	if !release.ValidVersion(version) {
		return nil, s.env.Fail(ctx, envelope.Invalid(envelope.Violation{Field: "version",
			Reason: fmt.Sprintf("%q is not a semantic version such as v1.4.0", version)}))
	}
	var (
		sc    tenancy.Scope
		r     Release
		files []File
		found bool
	)
	if err := s.env.Resolve(ctx, "release", func(ctx context.Context, q store.Querier) (err error) {
		if sc, err = readScope(ctx, q); err != nil {
			return err
		}
		r, err = Get(ctx, q, version)
		switch {
		case errors.Is(err, ErrNotFound):
			return nil
		case err != nil:
			return err
		}
		found = true
		files, err = FileList(ctx, q, version)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, Resource(version, sc.ID())); err != nil {
		return nil, err
	}
	if !found {
		return nil, s.env.Fail(ctx, envelope.NotFound("release", version))
	}
	return connect.NewResponse(&apiv1.GetReleaseResponse{Release: Proto(r, files)}), nil
}

// List lists published releases by version text.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListReleasesRequest]) (*connect.Response[apiv1.ListReleasesResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), "releases")
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var sc tenancy.Scope
	if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		sc, err = readScope(ctx, q)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, sc.Resource()); err != nil {
		return nil, err
	}
	if err := sc.NotFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	limit := envelope.PageSize(msg.GetPageSize())
	out := &apiv1.ListReleasesResponse{}
	if err := s.env.Resolve(ctx, "releases", func(ctx context.Context, q store.Querier) error {
		rs, err := ReleaseList(ctx, q, after, limit+1)
		if err != nil {
			return err
		}
		for n, r := range rs {
			if n == limit {
				out.NextPageToken = envelope.EncodePageToken(rs[n-1].Version, "releases")
				break
			}
			files, err := FileList(ctx, q, r.Version)
			if err != nil {
				return err
			}
			out.Releases = append(out.Releases, Proto(r, files))
		}
		return nil
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(out), nil
}

// Delete removes a published release; its blobs go when no other release
// file nor image names the same bytes. Whether a rollout still uses the
// release is the rollout module's to check (it owns that table).
func (s *Service) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteReleaseRequest]) (*connect.Response[apiv1.DeleteReleaseResponse], error) {
	version := req.Msg.GetVersion()
	var (
		r     Release
		found bool
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteReleaseResponse]{
		Validate: func() error {
			if !release.ValidVersion(version) {
				return envelope.Invalid(envelope.Violation{Field: "version", Reason: fmt.Sprintf("%q is not a semantic version such as v1.4.0", version)})
			}
			return nil
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			switch r, err = Get(ctx, q, version); {
			case err == nil:
				found = true
			case !errors.Is(err, ErrNotFound):
				return iam.Resource{}, err
			}
			return Resource(version, ""), nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteReleaseResponse, error) {
			if !found {
				return nil, envelope.NotFound("release", version)
			}
			// The row lock orders this delete against a rollout create,
			// which reads the release FOR SHARE in its own transaction:
			// whichever commits second sees the other.
			if _, err := Get(ctx, tx, version, store.ForUpdate(tx)); errors.Is(err, ErrNotFound) {
				return nil, envelope.NotFound("release", version)
			} else if err != nil {
				return nil, err
			}
			if s.inUse != nil {
				id, err := s.inUse(ctx, tx, version)
				if err != nil {
					return nil, err
				}
				if id != "" {
					return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
						"release %s is used by rollout %s, which is still active: abort it or let it end before deleting the release", version, id)
				}
			}
			files, err := FileList(ctx, tx, version)
			if err != nil {
				return nil, err
			}
			ok, err := ReleaseDelete(ctx, tx, version)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, envelope.NotFound("release", version)
			}
			var shas []string
			for _, f := range files {
				shas = append(shas, f.SHA256)
			}
			slices.Sort(shas)
			shas = slices.Compact(shas)
			tx.AfterCommit(func() {
				for _, sha := range shas {
					unlock := s.blobs.Lock(sha)
					s.collect(context.WithoutCancel(ctx), []string{sha})
					unlock()
				}
			})
			tx.Emit(envelope.Event{Type: "release.deleted", ResourceType: "Release", ResourceID: version,
				Data: map[string]any{"version": version, "key_id": r.KeyID}})
			return &apiv1.DeleteReleaseResponse{}, nil
		},
	})
}

// Proto converts a release for the API.
func Proto(r Release, files []File) *apiv1.Release {
	p := &apiv1.Release{Version: r.Version, MinControlPlaneVersion: r.MinControlPlaneVersion, Manifest: string(r.Manifest),
		Platforms: r.Platforms, KeyId: r.KeyID, CreatedBy: r.CreatedBy, CreateTime: timestamppb.New(r.CreateTime)}
	for _, f := range files {
		p.Files = append(p.Files, &apiv1.ReleaseFile{Name: f.Name, Platform: f.Platform, Kind: f.Kind, Sha256: f.SHA256, SizeBytes: f.SizeBytes})
	}
	return p
}
