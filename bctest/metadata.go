package bctest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// MetadataService emulates a cloud's instance metadata service as AWS
// serves instance identity: GET /latest/dynamic/instance-identity/document
// answers the instance's JSON document and …/signature the base64 RSA
// PKCS #1 v1.5 SHA-256 signature over those exact bytes, by the region's
// key, whose self-signed certificate the provider publishes. A ?nonce=
// query (as Azure's attested document takes) is copied into the document.
type MetadataService struct {
	// URL is the service's base URL, bcd's --attest-cloud-metadata-url.
	URL string
	// CertificatePEM is the provider's public certificate: what an
	// operator registers for the tenant's cloud account.
	CertificatePEM []byte
	// Identity is the document the service serves (without the nonce).
	Identity InstanceIdentity
	key      *rsa.PrivateKey
}

// InstanceIdentity are the document's fields (AWS's names).
type InstanceIdentity struct {
	InstanceID       string `json:"instanceId"`
	AccountID        string `json:"accountId"`
	Region           string `json:"region"`
	AvailabilityZone string `json:"availabilityZone"`
	InstanceType     string `json:"instanceType"`
	ImageID          string `json:"imageId"`
	PrivateIP        string `json:"privateIp"`
	PendingTime      string `json:"pendingTime"`
	Version          string `json:"version"`
	Nonce            string `json:"nonce,omitempty"`
}

// NewMetadataService starts the emulator for one instance until the test
// ends; its provider key is new, so two services are two providers.
func NewMetadataService(t testing.TB, id InstanceIdentity) *MetadataService {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Instance Identity " + id.Region, Organization: []string{"Emulated Cloud"}},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	if id.Version == "" {
		id.Version = "2017-09-30"
	}
	m := &MetadataService{Identity: id, key: key, CertificatePEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	m.URL = srv.URL
	return m
}

// Document is the document served for nonce, byte for byte.
func (m *MetadataService) Document(nonce string) []byte {
	id := m.Identity
	id.Nonce = nonce
	b, _ := json.MarshalIndent(id, "", "  ")
	return b
}

// Sign signs doc with the provider key, base64.
func (m *MetadataService) Sign(doc []byte) []byte {
	sum := sha256.Sum256(doc)
	sig, _ := rsa.SignPKCS1v15(rand.Reader, m.key, crypto.SHA256, sum[:])
	return []byte(base64.StdEncoding.EncodeToString(sig))
}

func (m *MetadataService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	doc := m.Document(r.URL.Query().Get("nonce"))
	switch r.URL.Path {
	case "/latest/dynamic/instance-identity/document":
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(doc)
	case "/latest/dynamic/instance-identity/signature":
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(m.Sign(doc))
	default:
		http.NotFound(w, r)
	}
}
