// Package alias holds the buffer rules an AEAD's Seal and Open follow
// (those of crypto/cipher): dst may be the input exactly, in place, but
// must not overlap it any other way, and the output is appended to dst.
package alias

import "unsafe"

// Output is where Seal or Open of in writes n bytes: dst extended by n
// (ret, the whole, and out, the new bytes). It panics, as crypto/cipher's
// AEADs do, when out overlaps in other than exactly.
func Output(dst, in []byte, n int) (ret, out []byte) {
	ret, out = sliceForAppend(dst, n)
	if inexactOverlap(out, in) {
		panic("alias: invalid buffer overlap (Seal or Open into a buffer that overlaps its input other than exactly)")
	}
	return ret, out
}

// sliceForAppend extends in by n bytes, returning the whole slice and the
// n new bytes (reallocating when in lacks the capacity).
func sliceForAppend(in []byte, n int) (head, tail []byte) {
	if total := len(in) + n; cap(in) >= total {
		head = in[:total]
	} else {
		head = make([]byte, total)
		copy(head, in)
	}
	return head, head[len(in):]
}

// inexactOverlap reports whether x and y share memory but do not start at
// the same byte (in-place use starts both at the same byte).
func inexactOverlap(x, y []byte) bool {
	if len(x) == 0 || len(y) == 0 || &x[0] == &y[0] {
		return false
	}
	x0, x1 := uintptr(unsafe.Pointer(&x[0])), uintptr(unsafe.Pointer(&x[len(x)-1]))
	y0, y1 := uintptr(unsafe.Pointer(&y[0])), uintptr(unsafe.Pointer(&y[len(y)-1]))
	return x0 <= y1 && y0 <= x1
}
