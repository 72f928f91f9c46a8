package images

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Kinds of image and their media types.
var mediaTypes = map[string]string{
	"raw":     "application/vnd.better-compute.image.raw",
	"qcow2":   "application/vnd.better-compute.image.qcow2",
	"kernel":  "application/vnd.better-compute.image.kernel",
	"initrd":  "application/vnd.better-compute.image.initrd",
	"ramdisk": "application/vnd.better-compute.image.ramdisk",
}

// KindRamdisk is the kind the platform alone may sign for use.
const KindRamdisk = "ramdisk"

// DefaultMaxImageBytes bounds a push when the config leaves it at 0.
const DefaultMaxImageBytes int64 = 64 << 30

// Service serves the ImageService API.
type Service struct {
	env      *envelope.Envelope
	blobs    *Blobs
	maxBytes int64
	log      *slog.Logger
}

// NewService returns the image handlers; maxBytes 0 takes
// DefaultMaxImageBytes.
func NewService(env *envelope.Envelope, blobs *Blobs, maxBytes int64, log *slog.Logger) *Service {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxImageBytes
	}
	if log == nil {
		log = slog.Default()
	}
	return &Service{env: env, blobs: blobs, maxBytes: maxBytes, log: log}
}

var _ apiv1connect.ImageServiceHandler = (*Service)(nil)

// Resource projects an image into the authorization model, in its owner.
func Resource(i Image) iam.Resource {
	return iam.Resource{Type: "Image", ID: i.ID, TenantID: i.TenantID,
		Attrs: map[string]any{"name": i.Name, "kind": i.Kind, "visibility": i.Visibility}}
}

// scope is the owner a request names: a tenant, or the platform.
type scope = tenancy.Scope

// imageRef is an image resolved for a draft or a read.
type imageRef struct {
	scope
	ref   string
	image Image
	found bool
	// own: the image belongs to the scope (not a public image of another).
	own bool
}

// lookupImage resolves ref in the scope: its own image by name or id; for
// reads (public true) also a public platform image by name, or any public
// image by id.
func lookupImage(ctx context.Context, q store.Querier, tenantRef, ref string, public bool) (imageRef, error) {
	r := imageRef{ref: ref}
	var err error
	if r.scope, err = tenancy.LookupScope(ctx, q, tenantRef); err != nil || !r.Found {
		return r, err
	}
	candidates := []func() (Image, error){func() (Image, error) { return ImageGet(ctx, q, r.ID(), ref) }}
	if public {
		candidates = append(candidates,
			func() (Image, error) {
				i, err := ImageGet(ctx, q, "", ref)
				if err == nil && i.Visibility != VisibilityPublic {
					return i, store.ErrNotFound
				}
				return i, err
			},
			func() (Image, error) { return ImageGetPublic(ctx, q, ref) })
	}
	for n, get := range candidates {
		i, err := get()
		switch {
		case errors.Is(err, store.ErrNotFound):
			continue
		case err != nil:
			return r, err
		}
		r.image, r.found, r.own = i, true, n == 0
		return r, nil
	}
	return r, nil
}

// resource is what the decision is about: the image in its owner; a public
// image of another owner in the reader's scope (reading the public catalog
// is a read in one's own tenant); a miss in the scope.
func (r imageRef) resource() iam.Resource {
	switch {
	case r.found && r.own:
		return Resource(r.image)
	case r.found:
		res := Resource(r.image)
		res.TenantID = r.ID()
		if r.Platform {
			res.TenantID = ""
		}
		return res
	case r.Found && !r.Platform:
		return iam.Resource{Type: "Image", ID: envelope.UnknownResourceID, TenantID: r.ID()}
	default:
		return iam.Resource{Type: "Image", ID: envelope.UnknownResourceID}
	}
}

func (r imageRef) notFound() error {
	if err := r.NotFound(); err != nil {
		return err
	}
	if !r.found {
		return envelope.NotFound("image", r.ref)
	}
	return nil
}

func validateImageRef(vs *envelope.Violations, tenant, image string) {
	tenancy.ValidateScope(vs, tenant)
	vs.Ref("image", image, IDPrefix)
}

// chunkReader reads a push's chunks after its header.
type chunkReader struct {
	stream *connect.ClientStream[apiv1.PushImageRequest]
	buf    []byte
	err    error
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		if !c.stream.Receive() {
			c.err = c.stream.Err()
			if c.err == nil {
				c.err = io.EOF
			}
			return 0, c.err
		}
		if c.stream.Msg().GetHeader() != nil {
			c.err = envelope.Invalid(envelope.Violation{Field: "header", Reason: "may only be the first message of a push"})
			return 0, c.err
		}
		c.buf = c.stream.Msg().GetChunk()
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

// Push stores an image: the header is decided on at once, then the content
// streams into a staging file, hashed as it arrives; only bytes whose size
// and sha256 match the header are placed and recorded.
func (s *Service) Push(ctx context.Context, stream *connect.ClientStream[apiv1.PushImageRequest]) (*connect.Response[apiv1.PushImageResponse], error) {
	if !stream.Receive() {
		err := stream.Err()
		if err == nil {
			err = envelope.Invalid(envelope.Violation{Field: "header", Reason: "is required: the first message of a push"})
		}
		return nil, s.env.Fail(ctx, err)
	}
	hdr := stream.Msg().GetHeader()
	if hdr == nil {
		return nil, s.env.Fail(ctx, envelope.Invalid(envelope.Violation{Field: "header", Reason: "is required: the first message of a push"}))
	}
	req := connect.NewRequest(hdr)
	for k, v := range stream.RequestHeader() {
		req.Header()[k] = v
	}
	var (
		sc    scope
		dedup bool
		taken bool
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.PushImageResponse]{
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, hdr.GetTenant())
			vs.Name("name", hdr.GetName())
			if _, ok := mediaTypes[hdr.GetKind()]; !ok {
				vs.Add("kind", "must be one of raw, qcow2, kernel, initrd, ramdisk, got %q", hdr.GetKind())
			}
			if !imagesig.ValidDigest(hdr.GetSha256()) {
				vs.Add("sha256", "must be 64 lower-case hex digits")
			}
			if n := hdr.GetSizeBytes(); n <= 0 || n > s.maxBytes {
				vs.Add("size_bytes", "must be between 1 and %d", s.maxBytes)
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if sc, err = tenancy.LookupScope(ctx, q, hdr.GetTenant()); err != nil || !sc.Found {
				return iam.Resource{Type: "Image", ID: iam.DraftID}, err
			}
			// Read now so a taken name is refused before gigabytes are sent;
			// the unique index still decides a race.
			switch _, err := ImageGet(ctx, q, sc.ID(), hdr.GetName()); {
			case err == nil:
				taken = true
			case !errors.Is(err, store.ErrNotFound):
				return iam.Resource{}, err
			}
			return iam.Resource{Type: "Image", ID: iam.DraftID, TenantID: sc.ID(),
				Attrs: map[string]any{"name": hdr.GetName(), "kind": hdr.GetKind(), "visibility": VisibilityPrivate}}, nil
		},
		Submit: func(ctx context.Context, write func(ctx context.Context, b *envelope.Batch) error) error {
			if err := sc.NotFound(); err != nil {
				return err
			}
			if taken {
				return envelope.Errorf(envelope.CodeAlreadyExists, "image %q already exists in %s", hdr.GetName(), sc.Name())
			}
			staged, err := s.blobs.Stage(&chunkReader{stream: stream}, hdr.GetSha256(), hdr.GetSizeBytes())
			if err != nil {
				var mm *errDigestMismatch
				if errors.As(err, &mm) {
					return envelope.Errorf(envelope.CodeDigestMismatch, "image %q: %s, but the header says %d bytes with sha256 %s; nothing was kept",
						hdr.GetName(), mm.Error(), hdr.GetSizeBytes(), hdr.GetSha256())
				}
				var apiErr *envelope.Error
				if errors.As(err, &apiErr) {
					return apiErr
				}
				if ctx.Err() != nil || errors.Is(err, io.ErrUnexpectedEOF) {
					return envelope.Errorf(envelope.CodeInvalidArgument, "image %q: the upload ended early; nothing was kept", hdr.GetName())
				}
				return err
			}
			unlock := s.blobs.Lock(staged.SHA)
			defer unlock()
			created, err := s.blobs.Place(staged)
			if err != nil {
				return err
			}
			dedup = !created
			err = s.env.CommitAlone(ctx, write)
			if err != nil && created {
				s.collect(context.WithoutCancel(ctx), staged.SHA)
			}
			return err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.PushImageResponse, error) {
			now := tx.Now()
			i := Image{ID: envelope.NewID(IDPrefix, now), TenantID: sc.ID(), Name: hdr.GetName(), Kind: hdr.GetKind(),
				SHA256: hdr.GetSha256(), SizeBytes: hdr.GetSizeBytes(), Visibility: VisibilityPrivate,
				CreatedBy: tx.Caller().Principal.ID, CreateTime: now}
			if err := ImageInsert(ctx, tx, &i); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "image %q already exists in %s", i.Name, sc.Name())
				}
				return nil, err
			}
			tx.SetResource(i.ID, "")
			tx.Emit(envelope.Event{Type: "image.pushed", TenantID: i.TenantID, ResourceType: "Image", ResourceID: i.ID,
				Data: map[string]any{"name": i.Name, "kind": i.Kind, "sha256": i.SHA256, "size_bytes": i.SizeBytes}})
			p, err := s.proto(ctx, tx, i)
			if err != nil {
				return nil, err
			}
			return &apiv1.PushImageResponse{Image: p, Deduplicated: dedup}, nil
		},
	})
}

// collect removes a blob no image (nor another module's row) names any more. It takes the digest's
// lock unless the caller holds it (locked).
func (s *Service) collect(ctx context.Context, sha string) {
	var used bool
	err := s.env.DB().Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		used, err = s.blobs.Referenced(ctx, tx, sha)
		return err
	})
	if err == nil && !used {
		err = s.blobs.Remove(sha)
	}
	if err != nil {
		// A blob left behind is disk, not a fault: the next delete of the
		// digest, or an operator, collects it.
		s.log.WarnContext(ctx, "image blob not collected", "sha256", sha, "err", err)
	}
}

// Get reads an image: the scope's own, a public platform image by name, or
// any public image by id.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetImageRequest]) (*connect.Response[apiv1.GetImageResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateImageRef(&vs, msg.GetTenant(), msg.GetImage())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		r imageRef
		p *apiv1.Image
	)
	if err := s.env.Resolve(ctx, "image", func(ctx context.Context, q store.Querier) (err error) {
		r, err = lookupImage(ctx, q, msg.GetTenant(), msg.GetImage(), true)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return nil, err
	}
	if err := r.notFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.Resolve(ctx, "image", func(ctx context.Context, q store.Querier) (err error) {
		p, err = s.proto(ctx, q, r.image)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetImageResponse{Image: p}), nil
}

// PullChunkBytes is the size of the chunks Pull sends.
const PullChunkBytes = 256 << 10

// Pull streams an image's content after the image itself.
func (s *Service) Pull(ctx context.Context, req *connect.Request[apiv1.PullImageRequest], stream *connect.ServerStream[apiv1.PullImageResponse]) error {
	msg := req.Msg
	var vs envelope.Violations
	validateImageRef(&vs, msg.GetTenant(), msg.GetImage())
	if msg.GetOffset() < 0 {
		vs.Add("offset", "must not be negative")
	}
	if err := vs.Err(); err != nil {
		return s.env.Fail(ctx, err)
	}
	var (
		r imageRef
		p *apiv1.Image
	)
	if err := s.env.Resolve(ctx, "image", func(ctx context.Context, q store.Querier) (err error) {
		r, err = lookupImage(ctx, q, msg.GetTenant(), msg.GetImage(), true)
		return err
	}); err != nil {
		return s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return err
	}
	if err := r.notFound(); err != nil {
		return s.env.Fail(ctx, err)
	}
	if msg.GetOffset() > r.image.SizeBytes {
		return s.env.Fail(ctx, envelope.Invalid(envelope.Violation{Field: "offset", Reason: "is past the image's end"}))
	}
	if err := s.env.Resolve(ctx, "image", func(ctx context.Context, q store.Querier) (err error) {
		p, err = s.proto(ctx, q, r.image)
		return err
	}); err != nil {
		return s.env.Fail(ctx, err)
	}
	f, err := s.blobs.Open(r.image.SHA256)
	if err != nil {
		return s.env.Fail(ctx, err)
	}
	defer f.Close()
	if err := stream.Send(&apiv1.PullImageResponse{Part: &apiv1.PullImageResponse_Image{Image: p}}); err != nil {
		return err
	}
	buf := make([]byte, PullChunkBytes)
	rd := io.NewSectionReader(f, msg.GetOffset(), r.image.SizeBytes-msg.GetOffset())
	for {
		n, err := io.ReadFull(rd, buf)
		if n > 0 {
			if serr := stream.Send(&apiv1.PullImageResponse{Part: &apiv1.PullImageResponse_Chunk{Chunk: buf[:n]}}); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return s.env.Fail(ctx, err)
		}
	}
}

// List lists the scope's images and every public image.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListImagesRequest]) (*connect.Response[apiv1.ListImagesResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), msg.GetTenant())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var sc scope
	if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		sc, err = tenancy.LookupScope(ctx, q, msg.GetTenant())
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
	out := &apiv1.ListImagesResponse{}
	if err := s.env.Resolve(ctx, "images", func(ctx context.Context, q store.Querier) error {
		imgs, err := ImageList(ctx, q, sc.ID(), after, limit+1)
		if err != nil {
			return err
		}
		for n, i := range imgs {
			if n == limit {
				out.NextPageToken = envelope.EncodePageToken(imgs[n-1].ID, msg.GetTenant())
				break
			}
			p, err := s.proto(ctx, q, i)
			if err != nil {
				return err
			}
			out.Images = append(out.Images, p)
		}
		return nil
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(out), nil
}

// Sign verifies a signature over the image's payload by a key on the
// owner's or the platform's allowlist, and attaches it.
func (s *Service) Sign(ctx context.Context, req *connect.Request[apiv1.SignImageRequest]) (*connect.Response[apiv1.SignImageResponse], error) {
	msg := req.Msg
	var r imageRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.SignImageResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateImageRef(&vs, msg.GetTenant(), msg.GetImage())
			if !imagesig.ValidDigest(msg.GetKeyFingerprint()) {
				vs.Add("key_fingerprint", "must be the key's sha256: 64 lower-case hex digits")
			}
			if n := len(msg.GetSignature()); n == 0 || n > 512 {
				vs.Add("signature", "must be 1 to 512 bytes, got %d", n)
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupImage(ctx, q, msg.GetTenant(), msg.GetImage(), false)
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.SignImageResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			owners := allowlists(r.image.TenantID)
			keys, err := SignerKeysByFingerprint(ctx, tx, owners, []string{msg.GetKeyFingerprint()})
			if err != nil {
				return nil, err
			}
			if len(keys) == 0 {
				return nil, envelope.Errorf(envelope.CodeUnknownSigner,
					"key %s is on neither %s's nor the platform's signer allowlist: add it with signer-keys add", msg.GetKeyFingerprint(), ownerName(r))
			}
			pub, err := imagesig.ParsePublicKeyDER(keys[0].PublicKey)
			if err != nil {
				return nil, err
			}
			if pub.Verify(imagesig.Payload(r.image.Name, r.image.Kind, r.image.SHA256), msg.GetSignature()) != nil {
				return nil, envelope.Invalid(envelope.Violation{Field: "signature",
					Reason: "does not verify under key " + keys[0].Name + " over the image's payload (docs/images.md)"})
			}
			if err := SignatureUpsert(ctx, tx, &Signature{ImageID: r.image.ID, KeyFingerprint: pub.Fingerprint, Algorithm: pub.Algorithm,
				Signature: msg.GetSignature(), CreatedBy: tx.Caller().Principal.ID, CreateTime: tx.Now()}); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "image.signed", TenantID: r.image.TenantID, ResourceType: "Image", ResourceID: r.image.ID,
				Data: map[string]any{"name": r.image.Name, "key": keys[0].Name, "fingerprint": pub.Fingerprint, "platform": keys[0].TenantID == ""}})
			p, err := s.proto(ctx, tx, r.image)
			if err != nil {
				return nil, err
			}
			return &apiv1.SignImageResponse{Image: p}, nil
		},
	})
}

func ownerName(r imageRef) string {
	if r.image.TenantID == "" {
		return "the platform"
	}
	return "tenant " + r.Tenant.Name
}

// allowlists are the allowlists whose keys count for an owner's images:
// the owner's and the platform's.
func allowlists(tenantID string) []string {
	if tenantID == "" {
		return []string{""}
	}
	return []string{tenantID, ""}
}

// Promote makes a platform-signed image public.
func (s *Service) Promote(ctx context.Context, req *connect.Request[apiv1.PromoteImageRequest]) (*connect.Response[apiv1.PromoteImageResponse], error) {
	msg := req.Msg
	var r imageRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.PromoteImageResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateImageRef(&vs, msg.GetTenant(), msg.GetImage())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupImage(ctx, q, msg.GetTenant(), msg.GetImage(), false)
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.PromoteImageResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			t, err := evaluate(ctx, tx, r.image)
			if err != nil {
				return nil, err
			}
			if !t.platform {
				return nil, envelope.Errorf(envelope.CodeImageUntrusted,
					"image %q is not platform-signed: only an image a platform signer key signed can be public", r.image.Name)
			}
			changed, err := ImageSetVisibility(ctx, tx, r.image.ID, VisibilityPublic)
			if err != nil {
				return nil, err
			}
			r.image.Visibility = VisibilityPublic
			if changed {
				tx.Emit(envelope.Event{Type: "image.promoted", TenantID: r.image.TenantID, ResourceType: "Image", ResourceID: r.image.ID,
					Data: map[string]any{"name": r.image.Name}})
			}
			p, err := s.proto(ctx, tx, r.image)
			if err != nil {
				return nil, err
			}
			return &apiv1.PromoteImageResponse{Image: p}, nil
		},
	})
}

// Delete deletes an image nothing uses; its blob goes when no other image
// names the same bytes.
func (s *Service) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteImageRequest]) (*connect.Response[apiv1.DeleteImageResponse], error) {
	msg := req.Msg
	var r imageRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteImageResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateImageRef(&vs, msg.GetTenant(), msg.GetImage())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupImage(ctx, q, msg.GetTenant(), msg.GetImage(), false)
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteImageResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			ref, err := RefFirst(ctx, tx, r.image.ID)
			switch {
			case err == nil:
				return nil, envelope.Errorf(envelope.CodeImageInUse, "image %q is in use by %s %s; release it first", r.image.Name, ref.Kind, ref.RefID)
			case !errors.Is(err, store.ErrNotFound):
				return nil, err
			}
			ok, err := ImageDelete(ctx, tx, r.image.ID)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, envelope.NotFound("image", msg.GetImage())
			}
			sha := r.image.SHA256
			tx.AfterCommit(func() {
				unlock := s.blobs.Lock(sha)
				defer unlock()
				s.collect(context.WithoutCancel(ctx), sha)
			})
			tx.Emit(envelope.Event{Type: "image.deleted", TenantID: r.image.TenantID, ResourceType: "Image", ResourceID: r.image.ID,
				Data: map[string]any{"name": r.image.Name, "sha256": sha}})
			return &apiv1.DeleteImageResponse{}, nil
		},
	})
}

// proto converts an image for the API, with its signatures and trust.
func (s *Service) proto(ctx context.Context, q store.Querier, i Image) (*apiv1.Image, error) {
	t, err := evaluate(ctx, q, i)
	if err != nil {
		return nil, err
	}
	p := &apiv1.Image{Id: i.ID, TenantId: i.TenantID, Name: i.Name, Kind: i.Kind, MediaType: mediaTypes[i.Kind], Sha256: i.SHA256,
		SizeBytes: i.SizeBytes, Visibility: i.Visibility, CreatedBy: i.CreatedBy, CreateTime: timestamppb.New(i.CreateTime),
		Trusted: t.trusted, PlatformSigned: t.platform}
	for _, sig := range t.sigs {
		ps := &apiv1.ImageSignature{KeyFingerprint: sig.KeyFingerprint, Algorithm: sig.Algorithm, Signature: sig.Signature,
			CreatedBy: sig.CreatedBy, CreateTime: timestamppb.New(sig.CreateTime)}
		if k, ok := t.keys[sig.KeyFingerprint]; ok {
			ps.KeyName = k.Name
			ps.Signer = k.TenantID
			if k.TenantID == "" {
				ps.Signer = "platform"
			}
		}
		p.Signatures = append(p.Signatures, ps)
	}
	return p, nil
}
