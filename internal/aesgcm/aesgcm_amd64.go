package aesgcm

import (
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
	"errors"

	"github.com/gorun/gorun/internal/alias"

	"golang.org/x/sys/cpu"
)

// vector: the CPU and the OS support what aesgcm_amd64.s uses (the OS
// check for 512-bit state is part of x/sys/cpu's AVX-512 flags).
var vector = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL &&
	cpu.X86.HasAVX512VAES && cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ

// The field. GCM's GHASH multiplies in GF(2^128) = GF(2)[x]/(x^128 + x^7 +
// x^2 + x + 1), a block's first bit (the top bit of its first byte) being
// the coefficient of x^0. Read as one big-endian 128-bit integer A, bit
// 127-i of A is the coefficient of x^i, so A is the polynomial a written
// backwards: with y = 1/x, a = A(y) * y^-127, where y is a root of the
// reversed polynomial y^128 + y^127 + y^126 + y^121 + 1. Integer
// carry-less products are then products in y, and
//
//	mont(A, B) = A * B * y^-128  (mod the reversed polynomial)
//
// needs only two 64-bit folds by its low terms (aesgcm_amd64.s, REDUCE).
// With a = A y^-127 and h = H y^-127, a*h is represented by A*H*y^-127 =
// mont(A, H*y): so the assembly multiplies by K_k = rep(h^k) * y, the
// powers of the hash key each multiplied by y once, which Go computes here
// at setup with the specification's own multiplication (mulSpec).

// maxText is the most plaintext one nonce may seal: 2^32 - 2 blocks.
const maxText = (1<<32 - 2) * 16

var errOpen = errors.New("aesgcm: message authentication failed")

// vgcm is AES-128-GCM for aesgcm_amd64.s.
type vgcm struct {
	rk  [176]byte // the 11 round keys
	tab [256]byte // K_16, K_15, ..., K_1, each 16 bytes little-endian
}

func newVector(key []byte) cipher.AEAD {
	g := &vgcm{}
	expandKey((*[16]byte)(key), &g.rk)
	var zero, hb [16]byte
	encryptBlock(&g.rk, &hb, &zero)
	hh, hl := binary.BigEndian.Uint64(hb[:8]), binary.BigEndian.Uint64(hb[8:])
	ph, pl := hh, hl // h^k
	for k := 1; k <= 16; k++ {
		if k > 1 {
			ph, pl = mulSpec(ph, pl, hh, hl)
		}
		kh, kl := timesY(ph, pl)
		e := g.tab[(16-k)*16:]
		binary.LittleEndian.PutUint64(e[:8], kl)
		binary.LittleEndian.PutUint64(e[8:16], kh)
	}
	return g
}

// mulSpec is X*Y in GCM's field by SP 800-38D's Algorithm 1, on blocks
// given as their big-endian halves; constant time.
func mulSpec(xh, xl, yh, yl uint64) (zh, zl uint64) {
	vh, vl := yh, yl
	for i := range 128 {
		var bit uint64
		if i < 64 {
			bit = xh >> (63 - i) & 1
		} else {
			bit = xl >> (127 - i) & 1
		}
		zh ^= vh & -bit
		zl ^= vl & -bit
		lsb := vl & 1
		vl = vl>>1 | vh<<63
		vh = vh>>1 ^ 0xe1<<56&-lsb
	}
	return zh, zl
}

// timesY is A*y modulo the reversed polynomial: a shift left by one, and
// y^128 = y^127 + y^126 + y^121 + 1 folded back in.
func timesY(h, l uint64) (uint64, uint64) {
	carry := -(h >> 63)
	h = h<<1 | l>>63
	l <<= 1
	return h ^ 0xc2<<56&carry, l ^ 1&carry
}

func (g *vgcm) NonceSize() int { return 12 }
func (g *vgcm) Overhead() int  { return 16 }

func (g *vgcm) Seal(dst, nonce, plaintext, ad []byte) []byte {
	if len(nonce) != 12 {
		panic("aesgcm: incorrect nonce length given to GCM")
	}
	if uint64(len(plaintext)) > maxText {
		panic("aesgcm: message too large for GCM")
	}
	ret, out := alias.Output(dst, plaintext, len(plaintext)+16)
	var y [16]byte
	j0, ctr := counters(nonce)
	g.ghash(&y, ad)
	n := len(plaintext) &^ 255
	sealBlocks(&g.rk, &g.tab, &y, &ctr, out[:n], plaintext[:n])
	if rest := plaintext[n:]; len(rest) > 0 {
		g.xorKeystream(out[n:], rest, &ctr)
		g.ghash(&y, out[n:len(plaintext)])
	}
	g.tag((*[16]byte)(out[len(plaintext):]), &y, &j0, len(ad), len(plaintext))
	return ret
}

func (g *vgcm) Open(dst, nonce, ciphertext, ad []byte) ([]byte, error) {
	if len(nonce) != 12 {
		panic("aesgcm: incorrect nonce length given to GCM")
	}
	if len(ciphertext) < 16 || uint64(len(ciphertext)) > maxText+16 {
		return nil, errOpen
	}
	ct, tag := ciphertext[:len(ciphertext)-16], ciphertext[len(ciphertext)-16:]
	ret, out := alias.Output(dst, ciphertext, len(ct))
	var y, want [16]byte
	j0, ctr := counters(nonce)
	g.ghash(&y, ad)
	n := len(ct) &^ 255
	openBlocks(&g.rk, &g.tab, &y, &ctr, out[:n], ct[:n])
	if rest := ct[n:]; len(rest) > 0 {
		g.ghash(&y, rest) // before out, which may be rest, is written
		g.xorKeystream(out[n:], rest, &ctr)
	}
	g.tag(&want, &y, &j0, len(ad), len(ct))
	if subtle.ConstantTimeCompare(want[:], tag) != 1 {
		clear(out)
		return nil, errOpen
	}
	return ret, nil
}

// counters returns GCM's J0 for a 12-byte nonce and the text's first
// counter block, J0 + 1.
func counters(nonce []byte) (j0, ctr [16]byte) {
	copy(j0[:], nonce)
	j0[15] = 1
	ctr = j0
	ctr[15] = 2
	return j0, ctr
}

// xorKeystream sets dst to src (under 256 bytes) xor the keystream from
// the counter block ctr, which it advances.
func (g *vgcm) xorKeystream(dst, src []byte, ctr *[16]byte) {
	var ks [256]byte
	ctrBlocks(&g.rk, ctr, ks[:(len(src)+15)&^15])
	subtle.XORBytes(dst, src, ks[:len(src)])
}

// ghash advances the GHASH state y over data, its last block padded with
// zeros.
func (g *vgcm) ghash(y *[16]byte, data []byte) {
	n := len(data) &^ 15
	ghashBlocks(&g.tab, y, data[:n])
	if n < len(data) {
		var b [16]byte
		copy(b[:], data[n:])
		ghashBlocks(&g.tab, y, b[:])
	}
}

// tag finishes GHASH with the lengths block and writes E(J0) xor it.
func (g *vgcm) tag(dst, y, j0 *[16]byte, adLen, textLen int) {
	var lens, ek [16]byte
	binary.BigEndian.PutUint64(lens[:8], uint64(adLen)*8)
	binary.BigEndian.PutUint64(lens[8:], uint64(textLen)*8)
	ghashBlocks(&g.tab, y, lens[:])
	encryptBlock(&g.rk, &ek, j0)
	// y holds the hash as a little-endian integer: its bytes reversed are
	// the GCM block.
	for i := range 16 {
		dst[i] = ek[i] ^ y[15-i]
	}
}

//go:noescape
func sealBlocks(rk *[176]byte, tab *[256]byte, y, ctr *[16]byte, dst, src []byte)

//go:noescape
func openBlocks(rk *[176]byte, tab *[256]byte, y, ctr *[16]byte, dst, src []byte)

//go:noescape
func ghashBlocks(tab *[256]byte, y *[16]byte, src []byte)

//go:noescape
func ctrBlocks(rk *[176]byte, ctr *[16]byte, dst []byte)

//go:noescape
func encryptBlock(rk *[176]byte, dst, src *[16]byte)

//go:noescape
func expandKey(key *[16]byte, rk *[176]byte)
