// Package cloudiid is the cloud instance-identity attestor. A cloud's
// metadata service, reachable only from inside an instance, serves an
// instance-identity document (JSON: instance id, account, region, …) and
// the provider's signature over its exact bytes, AWS-style
// (/latest/dynamic/instance-identity/document and …/signature, RSA
// PKCS #1 v1.5 with SHA-256, base64). Like Azure's attested document, it
// takes a nonce (?nonce=) that it copies into the document, so a document
// answers one join challenge only.
//
// It proves the node runs as that instance of that account; it must never
// accept a document whose signature does not verify with a certificate the
// operator registered, or whose nonce is not the challenge's.
package cloudiid

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/better-compute/better-compute/internal/attestor"
)

// The metadata service's paths, as AWS names them.
const (
	DocumentPath  = "/latest/dynamic/instance-identity/document"
	SignaturePath = "/latest/dynamic/instance-identity/signature"
)

// Limits on what is read and parsed.
const (
	MaxDocumentBytes  = 8 << 10
	MaxSignatureBytes = 2 << 10
)

// Document is the instance-identity document: AWS's field names, plus the
// nonce the request asked for.
type Document struct {
	InstanceID       string `json:"instanceId"`
	AccountID        string `json:"accountId"`
	Region           string `json:"region"`
	AvailabilityZone string `json:"availabilityZone,omitempty"`
	InstanceType     string `json:"instanceType,omitempty"`
	ImageID          string `json:"imageId,omitempty"`
	PrivateIP        string `json:"privateIp,omitempty"`
	PendingTime      string `json:"pendingTime,omitempty"`
	Version          string `json:"version,omitempty"`
	// Nonce is the base64url (unpadded) join binding digest.
	Nonce string `json:"nonce"`
}

// Nonce is the document nonce for a join: the binding digest, base64url.
func Nonce(digest []byte) string { return base64.RawURLEncoding.EncodeToString(digest) }

// Fetch asks the metadata service at baseURL for the document (with nonce)
// and its signature.
func Fetch(ctx context.Context, client *http.Client, baseURL, nonce string) (doc, sig []byte, err error) {
	base := strings.TrimRight(baseURL, "/")
	doc, err = get(ctx, client, base+DocumentPath+"?nonce="+url.QueryEscape(nonce), MaxDocumentBytes)
	if err != nil {
		return nil, nil, err
	}
	sig, err = get(ctx, client, base+SignaturePath+"?nonce="+url.QueryEscape(nonce), MaxSignatureBytes)
	if err != nil {
		return nil, nil, err
	}
	return doc, bytes.TrimSpace(sig), nil
}

func get(ctx context.Context, client *http.Client, u string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("cloudiid: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cloudiid: metadata service: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("cloudiid: metadata service: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("cloudiid: metadata service answered %s for %s", resp.Status, req.URL.Path)
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("cloudiid: metadata answer for %s is longer than %d bytes", req.URL.Path, limit)
	}
	return body, nil
}

// Trust is one registered provider certificate and the account it admits.
type Trust struct {
	Certificate *x509.Certificate
	AccountID   string
	// Region, when set, is the only region admitted.
	Region string
}

// Result is what a verified document says.
type Result struct {
	Document Document
	// Trust is the anchor whose certificate verified the signature.
	Trust int
	// Subject names the instance: "cloud:<account>/<region>/<instance>".
	Subject string
}

// Verify checks sig (base64) over doc with the trusts' certificates, then
// that the document is for a trusted account (and region) and carries
// wantNonce. The certificates are keys the operator pinned: their validity
// period is not checked, as the provider's published certificates are
// long-lived self-signed ones.
func Verify(doc, sig []byte, trusts []Trust, wantNonce string) (Result, error) {
	switch {
	case len(doc) == 0 || len(doc) > MaxDocumentBytes:
		return Result{}, fmt.Errorf("%w: cloud: document must be 1-%d bytes", attestor.ErrEvidence, MaxDocumentBytes)
	case len(sig) == 0 || len(sig) > MaxSignatureBytes:
		return Result{}, fmt.Errorf("%w: cloud: signature must be 1-%d bytes", attestor.ErrEvidence, MaxSignatureBytes)
	case len(trusts) == 0:
		return Result{}, fmt.Errorf("%w: cloud: the tenant registered no cloud provider certificate", attestor.ErrEvidence)
	}
	raw, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(sig)))
	if err != nil {
		return Result{}, fmt.Errorf("%w: cloud: signature is not base64: %w", attestor.ErrEvidence, err)
	}
	digest := sha256.Sum256(doc)
	var d Document
	if err := json.Unmarshal(doc, &d); err != nil {
		return Result{}, fmt.Errorf("%w: cloud: document: %w", attestor.ErrEvidence, err)
	}
	matched := -1
	for i, t := range trusts {
		if !verifySig(t.Certificate.PublicKey, digest[:], raw) {
			continue
		}
		matched = i
		if t.AccountID == d.AccountID && (t.Region == "" || t.Region == d.Region) {
			break
		}
	}
	switch {
	case matched < 0:
		return Result{}, fmt.Errorf("%w: cloud: the document's signature does not verify with a registered provider certificate", attestor.ErrEvidence)
	case trusts[matched].AccountID != d.AccountID:
		return Result{}, fmt.Errorf("%w: cloud: account %q is not a registered account", attestor.ErrEvidence, d.AccountID)
	case trusts[matched].Region != "" && trusts[matched].Region != d.Region:
		return Result{}, fmt.Errorf("%w: cloud: region %q is not the registered region %q", attestor.ErrEvidence, d.Region, trusts[matched].Region)
	case d.InstanceID == "":
		return Result{}, fmt.Errorf("%w: cloud: the document has no instanceId", attestor.ErrEvidence)
	case d.Nonce != wantNonce:
		return Result{}, fmt.Errorf("%w: cloud: the document's nonce is not this join's challenge", attestor.ErrEvidence)
	}
	return Result{Document: d, Trust: matched, Subject: "cloud:" + d.AccountID + "/" + d.Region + "/" + d.InstanceID}, nil
}

func verifySig(pub any, digest, sig []byte) bool {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return rsa.VerifyPKCS1v15(k, crypto.SHA256, digest, sig) == nil
	case *ecdsa.PublicKey:
		return ecdsa.VerifyASN1(k, digest, sig)
	}
	return false
}
