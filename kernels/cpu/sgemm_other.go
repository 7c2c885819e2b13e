//go:build !amd64 || purego

package cpu

// Without the amd64 assembly only the pure Go kernel and packing exist;
// these stubs are never called (hasPackAVX512 stays false).

func packCopyAVX512(dst, src *float32, kc, ld int, alpha float32, lm1, lm2, sm1, sm2 int) {
	panic("sgemm: AVX-512 packing is not available")
}

func packTransAVX512(dst, src *float32, offs *[16]int, kc, w int, alpha float32, rowMask, storeMask int) {
	panic("sgemm: AVX-512 packing is not available")
}
