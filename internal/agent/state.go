package agent

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protojson"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// Files in the state directory. Every file is 0600 and the directory 0700:
// the key never leaves it.
const (
	keyFile      = "node.key"
	newKeyFile   = "node.key.new"
	csrFile      = "join.csr"
	certFile     = "node.crt"
	trustFile    = "trust.pem"
	nodeFile     = "node.json"
	commandsFile = "commands.json"
)

// maxLog is how many applied commands are remembered for redelivery.
const maxLog = 512

type nodeState struct {
	NodeID      string `json:"node_id"`
	TrustDomain string `json:"trust_domain,omitempty"`
}

// commandRecord is one applied command and the final update it produced.
type commandRecord struct {
	Seq      uint64          `json:"seq"`
	ID       string          `json:"id"`
	Kind     string          `json:"kind"`
	Update   json.RawMessage `json:"update"`
	Reported bool            `json:"reported"`
}

type inFlight struct {
	Seq  uint64 `json:"seq"`
	ID   string `json:"id"`
	Kind string `json:"kind"`
}

// commandState is what makes commands apply at most once across restarts.
type commandState struct {
	LastAppliedSeq uint64    `json:"last_applied_seq"`
	InFlight       *inFlight `json:"in_flight,omitempty"`
	// Execs are the process.exec and instance commands running (they
	// run beside the one in flight).
	Execs []inFlight      `json:"execs,omitempty"`
	Log   []commandRecord `json:"log"`
	// InventoryDigest is the last snapshot digest sent to the gateway.
	InventoryDigest string `json:"inventory_digest,omitempty"`
}

func (s *commandState) find(seq uint64, id string) *commandRecord {
	for i := len(s.Log) - 1; i >= 0; i-- {
		if s.Log[i].Seq == seq || (id != "" && s.Log[i].ID == id) {
			return &s.Log[i]
		}
	}
	return nil
}

func (s *commandState) add(r commandRecord) {
	s.Log = append(s.Log, r)
	if len(s.Log) > maxLog {
		s.Log = append([]commandRecord(nil), s.Log[len(s.Log)-maxLog:]...)
	}
	s.LastAppliedSeq = max(s.LastAppliedSeq, r.Seq)
}

func marshalUpdate(u *agentv1.CommandUpdate) json.RawMessage {
	b, err := protojson.Marshal(u)
	if err != nil {
		panic(fmt.Sprintf("marshal command update: %v", err)) // cannot fail for a valid message
	}
	return b
}

func unmarshalUpdate(b json.RawMessage) (*agentv1.CommandUpdate, error) {
	u := &agentv1.CommandUpdate{}
	if err := protojson.Unmarshal(b, u); err != nil {
		return nil, fmt.Errorf("decode stored command update: %w", err)
	}
	return u, nil
}

type stateDir string

func (d stateDir) path(name string) string { return filepath.Join(string(d), name) }

func (d stateDir) ensure() error {
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	if err := os.Chmod(string(d), 0o700); err != nil {
		return fmt.Errorf("chmod state dir: %w", err)
	}
	return nil
}

// write replaces name atomically with mode 0600.
func (d stateDir) write(name string, data []byte) error {
	tmp, err := os.CreateTemp(string(d), "."+name+".tmp-")
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), d.path(name)); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

func (d stateDir) read(name string) ([]byte, error) {
	return os.ReadFile(d.path(name))
}

func (d stateDir) readJSON(name string, v any) (bool, error) {
	b, err := d.read(name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", name, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("parse %s: %w", name, err)
	}
	return true, nil
}

func (d stateDir) writeJSON(name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", name, err)
	}
	return d.write(name, b)
}

func encodeKey(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func decodeKey(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "EC PRIVATE KEY" {
		return nil, errors.New("node key: no EC PRIVATE KEY block")
	}
	k, err := x509.ParseECPrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("node key: %w", err)
	}
	return k, nil
}

func encodeChain(chain [][]byte) []byte {
	var out []byte
	for _, der := range chain {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	return out
}

// loadCredentials reads the node key and certificate chain. A crash in the
// middle of a renewal leaves the new key in node.key.new next to the new
// certificate; that pair is completed here.
func (d stateDir) loadCredentials() (*tls.Certificate, error) {
	certPEM, err := d.read(certFile)
	if err != nil {
		return nil, fmt.Errorf("read node certificate: %w", err)
	}
	keyPEM, err := d.read(keyFile)
	if err != nil {
		return nil, fmt.Errorf("read node key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		newPEM, nerr := d.read(newKeyFile)
		if nerr != nil {
			return nil, fmt.Errorf("node key and certificate: %w", err)
		}
		pair, nerr = tls.X509KeyPair(certPEM, newPEM)
		if nerr != nil {
			return nil, fmt.Errorf("node key and certificate: %w", err)
		}
		if err := os.Rename(d.path(newKeyFile), d.path(keyFile)); err != nil {
			return nil, fmt.Errorf("finish interrupted renewal: %w", err)
		}
	}
	return &pair, nil
}

func (d stateDir) remove(name string) error {
	if err := os.Remove(d.path(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return nil
}

func (d stateDir) rename(from, to string) error {
	if err := os.Rename(d.path(from), d.path(to)); err != nil {
		return fmt.Errorf("rename %s: %w", from, err)
	}
	return nil
}
