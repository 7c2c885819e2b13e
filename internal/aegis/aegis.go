// Package aegis is AEGIS-128X4 (draft-irtf-cfrg-aegis-aead, "The AEGIS
// Family of Authenticated Encryption Algorithms"): an AEAD built on the AES
// round function with a 128-bit key, a 128-bit nonce and a 128-bit tag. It
// runs four AEGIS-128L states side by side, one in each 128-bit lane of a
// 512-bit register, so on x86-64 CPUs with VAES on AVX-512 (Intel Ice
// Lake and later, AMD Zen 4 and later) eight AES-round instructions and
// six logic instructions move 128 bytes, where AES-GCM four blocks per
// instruction spends twenty (AES-128's ten rounds on two registers of four
// blocks) and the GHASH of eight blocks; here that is three times the rate
// of package aesgcm's vector code (docs/performance.md, "AEGIS on the
// lanes").
//
// There is no portable version: Available says whether this CPU has it,
// and the mesh uses it only where both ends of a lane do (rank/sealed.go).
// The tests hold the assembly to the draft's test vectors and to a plain
// Go rendering of the draft's pseudocode on random keys, nonces and
// lengths.
package aegis

import (
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gorun/gorun/internal/alias"
)

const (
	// KeySize, NonceSize and TagSize are AEGIS-128X4's, in bytes.
	KeySize   = 16
	NonceSize = 16
	TagSize   = 16

	// rate is what one update absorbs: two 64-byte halves, M0 and M1,
	// each one 16-byte block per lane.
	rate = 128

	// lanes is the degree, the draft's D.
	lanes = 4
)

// state is S0..S7, each 64 bytes: lane 0's block, then lane 1's, 2's and
// 3's (the draft's V[i,0] .. V[i,3]), as one 512-bit register holds them.
type state [8][64]byte

// The draft's constants C0 and C1 (Fibonacci numbers mod 256).
var (
	c0 = [16]byte{0x00, 0x01, 0x01, 0x02, 0x03, 0x05, 0x08, 0x0d, 0x15, 0x22, 0x37, 0x59, 0x90, 0xe9, 0x79, 0x62}
	c1 = [16]byte{0xdb, 0x3d, 0x18, 0x55, 0x6d, 0xc2, 0x2f, 0xf1, 0x20, 0x11, 0x31, 0x42, 0x73, 0xb5, 0x28, 0xdd}
)

var errOpen = errors.New("aegis: message authentication failed")

// Available reports whether New works on this CPU: x86-64 with AVX-512
// and VAES, and an OS that keeps 512-bit registers.
func Available() bool { return vector }

// New returns AEGIS-128X4 under key, which must be 16 bytes, or an error
// where the CPU lacks it (Available).
func New(key []byte) (cipher.AEAD, error) {
	if !vector {
		return nil, errors.New("aegis: this CPU has no VAES on AVX-512")
	}
	if len(key) != KeySize {
		return nil, fmt.Errorf("aegis: key of %d bytes, want %d", len(key), KeySize)
	}
	a := &aead{}
	copy(a.key[:], key)
	// What initialisation takes from the key alone, once: S1, S2, S3 and
	// S5, S6, S7 in every lane (S0 and S4 are key xor nonce), and the
	// key as M1.
	var kc0, kc1 [16]byte
	subtle.XORBytes(kc0[:], key, c0[:])
	subtle.XORBytes(kc1[:], key, c1[:])
	for l := 0; l < 16*lanes; l += 16 {
		for i, b := range [8]*[16]byte{1: &c1, 2: &c0, 3: &c1, 5: &kc0, 6: &kc1, 7: &kc0} {
			if b != nil {
				copy(a.init[i][l:], b[:])
			}
		}
		copy(a.m[rate/2+l:], key)
	}
	return a, nil
}

type aead struct {
	key  [KeySize]byte
	init state      // the state before initialisation but for S0 and S4
	m    [rate]byte // initialisation's message but for M0 (the nonce)
}

// laneContexts are xored into S3 and S7 before each update of
// initialisation: each lane's index, then the degree less one.
var laneContexts = func() (ctx [16 * lanes]byte) {
	for l := range lanes {
		ctx[16*l], ctx[16*l+1] = byte(l), lanes-1
	}
	return ctx
}()

func (a *aead) NonceSize() int { return NonceSize }
func (a *aead) Overhead() int  { return TagSize }

// begin initialises s under the key and nonce and absorbs the additional
// data, its last block padded with zeros.
func (a *aead) begin(s *state, nonce, ad []byte) {
	if len(nonce) != NonceSize {
		panic("aegis: incorrect nonce length")
	}
	*s = a.init
	m := a.m // M0 = the nonce in each lane, M1 = the key in each
	for l := 0; l < 16*lanes; l += 16 {
		subtle.XORBytes(s[0][l:l+16], a.key[:], nonce)
		copy(s[4][l:], s[0][l:l+16])
		copy(m[l:], nonce)
	}
	start(s, &m, &laneContexts)
	for len(ad) >= rate {
		update(s, (*[rate]byte)(ad))
		ad = ad[rate:]
	}
	if len(ad) > 0 {
		var b [rate]byte
		copy(b[:], ad)
		update(s, &b)
	}
}

// finalize writes the tag for adLen bytes of additional data and textLen
// of text.
func (s *state) finalize(tag *[TagSize]byte, adLen, textLen int) {
	var u [16]byte
	binary.LittleEndian.PutUint64(u[:8], uint64(adLen)*8)
	binary.LittleEndian.PutUint64(u[8:], uint64(textLen)*8)
	finish(s, tag, &u)
}

func (a *aead) Seal(dst, nonce, plaintext, ad []byte) []byte {
	ret, out := alias.Output(dst, plaintext, len(plaintext)+TagSize)
	var s state
	a.begin(&s, nonce, ad)
	n := len(plaintext) &^ (rate - 1)
	if n > 0 {
		encBlocks(&s, &out[0], &plaintext[0], n/rate)
	}
	if rest := plaintext[n:]; len(rest) > 0 {
		var b [rate]byte // the last block padded with zeros
		copy(b[:], rest)
		encBlocks(&s, &b[0], &b[0], 1)
		copy(out[n:], b[:len(rest)])
	}
	s.finalize((*[TagSize]byte)(out[len(plaintext):]), len(ad), len(plaintext))
	return ret
}

func (a *aead) Open(dst, nonce, ciphertext, ad []byte) ([]byte, error) {
	if len(ciphertext) < TagSize {
		return nil, errOpen
	}
	ct, tag := ciphertext[:len(ciphertext)-TagSize], ciphertext[len(ciphertext)-TagSize:]
	ret, out := alias.Output(dst, ciphertext, len(ct))
	var s state
	a.begin(&s, nonce, ad)
	n := len(ct) &^ (rate - 1)
	if n > 0 {
		decBlocks(&s, &out[0], &ct[0], n/rate)
	}
	if rest := ct[n:]; len(rest) > 0 {
		// The last block: its keystream's first bytes give the text,
		// and the text padded with zeros (not the keystream's tail)
		// goes into the state.
		var b, z [rate]byte
		keystream(&s, &z)
		subtle.XORBytes(b[:], rest, z[:])
		copy(out[n:], b[:len(rest)])
		update(&s, &b)
	}
	var want [TagSize]byte
	s.finalize(&want, len(ad), len(ct))
	if subtle.ConstantTimeCompare(want[:], tag) != 1 {
		clear(out)
		return nil, errOpen
	}
	return ret, nil
}
