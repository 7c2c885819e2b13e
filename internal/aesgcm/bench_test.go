package aesgcm

import (
	"crypto/cipher"
	"fmt"
	"testing"
)

// BenchmarkAEAD: sealing one record in place and opening one into another
// buffer, crypto/cipher's GCM and the vector code side by side
// (docs/performance.md, "AES-GCM four blocks at a time"). 96 KiB is the
// ring's slice across hosts.
//
//	go test -run '^$' -bench AEAD -count 5 ./internal/aesgcm
func BenchmarkAEAD(b *testing.B) {
	key := make([]byte, 16)
	impls := []struct {
		name string
		new  func(testing.TB, []byte) cipher.AEAD
	}{{"crypto-cipher", std}, {"vaes-avx512", vec}}
	for _, size := range []int{1 << 10, 16 << 10, 96 << 10} {
		for _, op := range []string{"seal", "open"} {
			for _, im := range impls {
				b.Run(fmt.Sprintf("%s/%dKiB/%s", op, size>>10, im.name), func(b *testing.B) {
					a := im.new(b, key)
					nonce := make([]byte, 12)
					ad := []byte{1, 2, 3, 4}
					buf := make([]byte, size, size+16)
					sealed := a.Seal(nil, nonce, buf, ad)
					b.SetBytes(int64(size))
					for b.Loop() {
						if op == "seal" {
							a.Seal(buf[:0], nonce, buf, ad)
						} else if _, err := a.Open(buf[:0], nonce, sealed, ad); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
