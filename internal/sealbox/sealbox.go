// Package sealbox seals a short secret to the holder of one P-256 key: an
// ephemeral ECDH key agreement, HKDF-SHA256 and AES-256-GCM. The control
// plane seals a deployed machine's node join token to the key of the
// ramdisk that writes it onto the disk, so the command row that carries it
// holds nothing a database reader or a gateway could use.
package sealbox

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
)

// version prefixes a sealed box.
const version = "sb1."

// Seal encrypts plaintext to the P-256 public key publicKeyDER (PKIX DER);
// info binds the box to its use (the same info must open it).
func Seal(publicKeyDER []byte, info string, plaintext []byte) (string, error) {
	pub, err := x509.ParsePKIXPublicKey(publicKeyDER)
	if err != nil {
		return "", fmt.Errorf("sealbox: public key: %w", err)
	}
	ep, ok := pub.(*ecdsa.PublicKey)
	if !ok {
		return "", fmt.Errorf("sealbox: public key is a %T, want ECDSA P-256", pub)
	}
	to, err := ep.ECDH()
	if err != nil {
		return "", fmt.Errorf("sealbox: public key: %w", err)
	}
	eph, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	shared, err := eph.ECDH(to)
	if err != nil {
		return "", err
	}
	aead, err := newAEAD(shared, eph.PublicKey().Bytes(), info)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	box := append(append(eph.PublicKey().Bytes(), nonce...), aead.Seal(nil, nonce, plaintext, []byte(info))...)
	return version + base64.RawURLEncoding.EncodeToString(box), nil
}

// Open decrypts a box sealed to key's public half.
func Open(key *ecdsa.PrivateKey, info, sealed string) ([]byte, error) {
	raw, ok := cutPrefix(sealed)
	if !ok {
		return nil, errors.New("sealbox: not a sealed box")
	}
	box, err := base64.RawURLEncoding.DecodeString(raw)
	if err != nil {
		return nil, fmt.Errorf("sealbox: %w", err)
	}
	const pubLen, nonceLen = 65, 12
	if len(box) < pubLen+nonceLen+16 {
		return nil, errors.New("sealbox: box too short")
	}
	priv, err := key.ECDH()
	if err != nil {
		return nil, fmt.Errorf("sealbox: private key: %w", err)
	}
	eph, err := ecdh.P256().NewPublicKey(box[:pubLen])
	if err != nil {
		return nil, fmt.Errorf("sealbox: ephemeral key: %w", err)
	}
	shared, err := priv.ECDH(eph)
	if err != nil {
		return nil, err
	}
	aead, err := newAEAD(shared, box[:pubLen], info)
	if err != nil {
		return nil, err
	}
	out, err := aead.Open(nil, box[pubLen:pubLen+nonceLen], box[pubLen+nonceLen:], []byte(info))
	if err != nil {
		return nil, errors.New("sealbox: the box does not open with this key")
	}
	return out, nil
}

func cutPrefix(s string) (string, bool) {
	if len(s) < len(version) || s[:len(version)] != version {
		return "", false
	}
	return s[len(version):], true
}

func newAEAD(shared, ephPub []byte, info string) (cipher.AEAD, error) {
	key, err := hkdf.Key(sha256.New, shared, ephPub, "bettercompute sealbox "+info, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
