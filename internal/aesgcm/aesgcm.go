// Package aesgcm is AES-128-GCM (NIST SP 800-38D: 12-byte nonces, 16-byte
// tags) for the mesh's sealed records. On x86-64 CPUs with VAES and
// VPCLMULQDQ on 512-bit registers (Intel Ice Lake and later, AMD Zen 4 and
// later) it encrypts and hashes four blocks per instruction, two to three
// times the rate of crypto/cipher's GCM, which works a block per instruction
// (docs/performance.md, "AES-GCM four blocks at a time"); elsewhere New
// returns crypto/cipher's GCM. Both give the same bytes: the tests hold the
// vector code to crypto/cipher on random keys, nonces and lengths.
package aesgcm

import (
	"crypto/aes"
	"crypto/cipher"
	"fmt"
)

// New returns AES-128-GCM under key, which must be 16 bytes.
func New(key []byte) (cipher.AEAD, error) {
	if len(key) != 16 {
		return nil, fmt.Errorf("aesgcm: key of %d bytes, want 16", len(key))
	}
	if vector {
		return newVector(key), nil
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// Vector reports whether New returns the vector code on this machine (else
// crypto/cipher's GCM); --version lists it as vaes.
func Vector() bool { return vector }
