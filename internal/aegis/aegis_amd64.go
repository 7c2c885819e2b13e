package aegis

import "golang.org/x/sys/cpu"

// vector: AVX-512 (whose flag in x/sys/cpu includes the OS's support for
// 512-bit registers) and VAES on it.
var vector = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VAES

// start sets s, which holds the state before initialisation, to the
// state after it: ten updates with m, each after xoring ctx into S3 and S7.
//
//go:noescape
func start(s *state, m *[rate]byte, ctx *[16 * lanes]byte)

// finish runs finalisation's seven updates, lens (the bit lengths of the
// additional data and the text) xor S2 in every lane as both halves, and
// writes the tag: S0 xor .. xor S6 folded over the lanes.
//
//go:noescape
func finish(s *state, tag *[TagSize]byte, lens *[16]byte)

// update absorbs one 128-byte block m (M0, then M1) into s.
//
//go:noescape
func update(s *state, m *[rate]byte)

// keystream writes the 128 bytes that encrypt the next block, without
// updating s.
//
//go:noescape
func keystream(s *state, z *[rate]byte)

// encBlocks encrypts blocks 128-byte blocks from src to dst, which may be
// src, updating s with each.
//
//go:noescape
func encBlocks(s *state, dst, src *byte, blocks int)

// decBlocks decrypts blocks 128-byte blocks from src to dst, which may be
// src, updating s with each.
//
//go:noescape
func decBlocks(s *state, dst, src *byte, blocks int)
