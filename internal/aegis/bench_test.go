package aegis

import (
	"crypto/cipher"
	"fmt"
	"testing"

	"github.com/gorun/gorun/internal/aesgcm"
)

// BenchmarkAEAD: sealing one record in place and opening one into another
// buffer, AES-128-GCM (package aesgcm: its vector code where the CPU has
// VAES on AVX-512, else crypto/cipher's) and AEGIS-128X4 side by side
// (docs/performance.md, "AEGIS on the lanes"). 96 KiB is the ring's slice
// across hosts, 256 KiB a sealed record's most.
//
//	go test -run '^$' -bench AEAD -count 5 ./internal/aegis
func BenchmarkAEAD(b *testing.B) {
	if !Available() {
		b.Skip("this CPU has no VAES on AVX-512")
	}
	key := make([]byte, 16)
	impls := []struct {
		name string
		new  func([]byte) (cipher.AEAD, error)
	}{{"aes-gcm", aesgcm.New}, {"aegis-128x4", New}}
	for _, size := range []int{1 << 10, 16 << 10, 96 << 10, 256 << 10} {
		for _, op := range []string{"seal", "open"} {
			for _, im := range impls {
				b.Run(fmt.Sprintf("%s/%dKiB/%s", op, size>>10, im.name), func(b *testing.B) {
					a, err := im.new(key)
					if err != nil {
						b.Fatal(err)
					}
					nonce := make([]byte, a.NonceSize())
					ad := []byte{1, 2, 3, 4}
					buf := make([]byte, size, size+16)
					out := make([]byte, size)
					sealed := a.Seal(nil, nonce, buf, ad)
					b.SetBytes(int64(size))
					for b.Loop() {
						if op == "seal" {
							a.Seal(buf[:0], nonce, buf, ad)
						} else if _, err := a.Open(out[:0], nonce, sealed, ad); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
