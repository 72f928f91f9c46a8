package approval

import (
	"crypto/elliptic"
	"testing"

	"golang.org/x/crypto/ssh"
)

// The cost of one approval: signing the batch message (the CLI) and
// verifying it (the server, once at Approve and again at Run), per key
// type; and the root over a batch's leaves.

func benchSigners(b *testing.B) map[string]ssh.Signer {
	return map[string]ssh.Signer{"ed25519": edSigner(b), "ecdsa-p256": ecSigner(b, elliptic.P256())}
}

func BenchmarkApprovalSign(b *testing.B) {
	msg := BatchMessage("bc.example.com", "cbt_01J0000000000000000000000", [32]byte{1}, 3)
	for name, s := range benchSigners(b) {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := Sign(s, msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkApprovalVerify(b *testing.B) {
	msg := BatchMessage("bc.example.com", "cbt_01J0000000000000000000000", [32]byte{1}, 3)
	for name, s := range benchSigners(b) {
		sig, err := Sign(s, msg)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if err := Verify(s.PublicKey(), msg, sig); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRoot1000Leaves(b *testing.B) {
	leaves := make([]Leaf, 1000)
	for i := range leaves {
		leaves[i] = leafN(i % 26)
	}
	for b.Loop() {
		if _, err := Root(leaves); err != nil {
			b.Fatal(err)
		}
	}
}
