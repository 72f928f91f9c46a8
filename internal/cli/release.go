package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/internal/release"
)

// Files release keygen and release sign write.
const (
	releaseKeyFile      = "release.key"
	releasePubFile      = "release.pub"
	releaseManifestFile = "manifest.json"
)

// releaseCommand is the offline half of signed releases (docs/releases.md):
// nothing here reaches a server.
func (a *app) releaseCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release",
		Short: "Make a release key, sign a bcd release manifest with SBOMs, verify one (offline)",
		Long: `Signed bcd releases, offline: keygen makes the release key (its own key,
never the command-signing root), sign writes a signed manifest of the
per-platform bcd binaries with a CycloneDX SBOM of each, and verify checks
a manifest, and binaries against it, with the release public key.`,
	}
	cmd.AddCommand(newReleaseKeygenCommand(), newReleaseSignCommand(), newReleaseVerifyCommand())
	return cmd
}

func newReleaseKeygenCommand() *cobra.Command {
	var out, alg string
	cmd := &cobra.Command{
		Use:   "keygen --out DIR [--algorithm ed25519|ecdsa-p256]",
		Short: "Make a release key: DIR/release.key (0600) and DIR/release.pub",
		Long: `Make a release signing key. The private key goes to DIR/release.key
(PEM "` + release.PrivateKeyPEMType + `", mode 0600): keep it offline, apart
from the command-signing root. The public key goes to DIR/release.pub, for
whoever verifies releases. Neither file may exist already.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return invalidArg("out", "required: pass --out DIR for the key files")
			}
			key, priv, err := release.GenerateKey(alg)
			if err != nil {
				return invalidArg("algorithm", err.Error())
			}
			defer clear(priv)
			if err := os.MkdirAll(out, 0o700); err != nil {
				return err
			}
			keyPath, pubPath := filepath.Join(out, releaseKeyFile), filepath.Join(out, releasePubFile)
			if err := writeNew(pubPath, key.Public.PEM(), 0o644); err != nil {
				return err
			}
			if err := writeNew(keyPath, priv, 0o600); err != nil {
				_ = os.Remove(pubPath)
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "release key: %s (mode 0600; keep it offline, apart from the command-signing root)\n", keyPath)
			fmt.Fprintf(w, "public key: %s\n", pubPath)
			fmt.Fprintf(w, "key id: %s\n", key.Public.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory for release.key and release.pub (neither may exist)")
	cmd.Flags().StringVar(&alg, "algorithm", release.AlgEd25519, "ed25519 or ecdsa-p256")
	return cmd
}

// writeNew writes a file that must not exist yet, and leaves nothing behind
// when it fails.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return err
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// parseBinaryFlags reads --binary PLATFORM=PATH values.
func parseBinaryFlags(values []string) ([]release.Input, error) {
	var in []release.Input
	for _, v := range values {
		platform, path, ok := strings.Cut(v, "=")
		if !ok || platform == "" || path == "" {
			return nil, invalidArg("binary", fmt.Sprintf("%q: want PLATFORM=PATH (platforms: %s)", v, strings.Join(release.Platforms, ", ")))
		}
		if slices.ContainsFunc(in, func(i release.Input) bool { return i.Platform == platform }) {
			return nil, invalidArg("binary", fmt.Sprintf("%s is given twice", platform))
		}
		in = append(in, release.Input{Platform: platform, Path: path})
	}
	return in, nil
}

// releaseFlag maps a refusal about what a flag gave to that flag.
func releaseFlag(err error) error {
	var re *release.Error
	if !errors.As(err, &re) {
		return err
	}
	field := re.Field
	switch {
	case field == "min_control_plane_version":
		field = "min-control-plane"
	case strings.HasPrefix(field, "binaries[") || strings.HasPrefix(field, "binary["):
		field = "binary"
	}
	return invalidArg(field, re.Kind.Error()+": "+re.Reason)
}

func newReleaseSignCommand() *cobra.Command {
	var (
		keyFile, version, minCP, out string
		binaries                     []string
	)
	cmd := &cobra.Command{
		Use:   "sign --key KEY --version V --min-control-plane V --binary PLATFORM=PATH... --out DIR",
		Short: "Sign a release manifest of bcd binaries, with a CycloneDX SBOM of each",
		Long: `Sign a release: for each --binary (platforms ` + strings.Join(release.Platforms, ", ") + `) read its
Go build information, check it was built for that platform, and write its
SBOM (CycloneDX 1.5 JSON) to DIR/<binary>.sbom.json; then write
DIR/manifest.json, the manifest of the binaries' and SBOMs' sha256 and size
signed with the release key. The binaries are not copied. Versions are
semantic versions with their v (v1.4.0). Files already in DIR are never
overwritten.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case keyFile == "":
				return invalidArg("key", "required: pass --key with the release key file (release keygen makes one)")
			case out == "":
				return invalidArg("out", "required: pass --out DIR for manifest.json and the SBOMs")
			}
			inputs, err := parseBinaryFlags(binaries)
			if err != nil {
				return err
			}
			text, err := os.ReadFile(keyFile)
			if err != nil {
				return err
			}
			key, err := release.ParsePrivateKeyPEM(text)
			clear(text)
			if err != nil {
				return releaseFlag(err)
			}
			m, sboms, err := release.Assemble(version, minCP, time.Now(), inputs)
			if err != nil {
				return releaseFlag(err)
			}
			env, err := release.Sign(m, key)
			if err != nil {
				return releaseFlag(err)
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			var written []string
			undo := func() {
				for _, p := range written {
					_ = os.Remove(p)
				}
			}
			// The SBOMs first and the manifest last: a manifest on disk
			// means everything it names is beside it.
			for _, s := range sboms {
				p := filepath.Join(out, s.Name)
				if err := writeNew(p, s.Data, 0o644); err != nil {
					undo()
					return err
				}
				written = append(written, p)
			}
			manifestPath := filepath.Join(out, releaseManifestFile)
			if err := writeNew(manifestPath, env, 0o644); err != nil {
				undo()
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "release %s (min control plane %s) signed by %s\n", m.Version, m.MinControlPlaneVersion, key.Public.ID)
			for _, b := range m.Binaries {
				fmt.Fprintf(w, "%s\t%s\tsha256 %s\t%d bytes\tsbom %s\n", b.Platform, b.Name, b.SHA256, b.Size, filepath.Join(out, b.SBOM.Name))
			}
			fmt.Fprintf(w, "manifest: %s\n", manifestPath)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&keyFile, "key", "", "release private key file (release keygen)")
	f.StringVar(&version, "version", "", "the release's version (v1.4.0)")
	f.StringVar(&minCP, "min-control-plane", "", "the oldest control plane version the binaries work with (v1.3.0)")
	f.StringArrayVar(&binaries, "binary", nil, "PLATFORM=PATH of a bcd binary (repeat per platform)")
	f.StringVar(&out, "out", "", "directory for manifest.json and the SBOMs")
	return cmd
}

func newReleaseVerifyCommand() *cobra.Command {
	var (
		manifestFile string
		pubFiles     []string
		binaries     []string
	)
	cmd := &cobra.Command{
		Use:   "verify --manifest FILE --pubkey PUB... [--binary PLATFORM=PATH...]",
		Short: "Check a release manifest's signature, and binaries and SBOMs against it (offline)",
		Long: `Verify a release offline: the manifest's signature under one of the
release public keys given (--pubkey, repeatable, for a key rotation), its
format, and the sha256 and size of each --binary, and of each SBOM found
beside the manifest. It exits 1 with the reason, naming the field, when
anything does not hold.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case manifestFile == "":
				return invalidArg("manifest", "required: pass --manifest FILE (manifest.json)")
			case len(pubFiles) == 0:
				return invalidArg("pubkey", "required: pass --pubkey with a release public key file (release.pub)")
			}
			inputs, err := parseBinaryFlags(binaries)
			if err != nil {
				return err
			}
			var trusted []release.PublicKey
			for _, p := range pubFiles {
				text, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				k, err := release.ParsePublicKeyPEM(text)
				if err != nil {
					var re *release.Error
					if errors.As(err, &re) {
						return invalidArg("pubkey", p+" "+re.Kind.Error()+": "+re.Reason)
					}
					return err
				}
				trusted = append(trusted, k)
			}
			env, err := os.ReadFile(manifestFile)
			if err != nil {
				return err
			}
			m, by, err := release.Verify(env, trusted)
			if err != nil {
				return fmt.Errorf("%s is refused: %w", manifestFile, err)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "release %s (min control plane %s, created %s) signed by %s\n", m.Version, m.MinControlPlaneVersion, stamp(m.CreatedAt), by.ID)
			for _, in := range inputs {
				b, ok := m.Binary(in.Platform)
				if !ok {
					return invalidArg("binary", fmt.Sprintf("the release has no %s binary", in.Platform))
				}
				if err := checkFile(in.Path, func(r io.Reader) error { return release.CheckBinary(r, b) }); err != nil {
					return fmt.Errorf("%s is refused: %w", in.Path, err)
				}
				fmt.Fprintf(w, "%s\t%s\tok: sha256 %s, %d bytes\n", b.Platform, in.Path, b.SHA256, b.Size)
			}
			for _, b := range m.Binaries {
				p := filepath.Join(filepath.Dir(manifestFile), b.SBOM.Name)
				err := checkFile(p, func(r io.Reader) error { return release.CheckSBOM(r, b) })
				switch {
				case errors.Is(err, os.ErrNotExist):
					fmt.Fprintf(w, "%s\t%s\tnot beside the manifest: not checked\n", b.Platform, b.SBOM.Name)
				case err != nil:
					return fmt.Errorf("%s is refused: %w", p, err)
				default:
					fmt.Fprintf(w, "%s\t%s\tok: sha256 %s, %d bytes\n", b.Platform, p, b.SBOM.SHA256, b.SBOM.Size)
				}
			}
			if len(inputs) == 0 {
				fmt.Fprintln(w, "no --binary given: the signature and format are verified, no binary was checked")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&manifestFile, "manifest", "", "the signed manifest (manifest.json)")
	f.StringArrayVar(&pubFiles, "pubkey", nil, "release public key file (release.pub); repeat to trust several")
	f.StringArrayVar(&binaries, "binary", nil, "PLATFORM=PATH of a binary to check against the manifest (repeatable)")
	return cmd
}

func checkFile(path string, check func(io.Reader) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return check(f)
}
