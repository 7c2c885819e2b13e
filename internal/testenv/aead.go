package testenv

import (
	"bytes"
	"crypto/cipher"
	"encoding/hex"
	"testing"
)

// AEADRefusesTampering seals texts of each length in sizes under a and
// nonce and checks that a flipped bit anywhere in the ciphertext or the
// tag, other additional data, another nonce, or a record cut short fails
// to open, and that a failed open leaves no text in its output (the
// sealed records' AEADs, packages aesgcm and aegis).
func AEADRefusesTampering(t *testing.T, a cipher.AEAD, nonce []byte, sizes []int) {
	t.Helper()
	for _, n := range sizes {
		plain := make([]byte, n)
		for i := range plain {
			plain[i] = byte(i*7 + 1)
		}
		ad := []byte{byte(n), 1, 2, 3}
		sealed := a.Seal(nil, nonce, plain, ad)
		for bit := 0; bit < len(sealed)*8; bit += 1 + bit/64 {
			bad := append([]byte(nil), sealed...)
			bad[bit/8] ^= 1 << (bit % 8)
			out := make([]byte, 0, n)
			if _, err := a.Open(out, nonce, bad, ad); err == nil {
				t.Fatalf("%d bytes: bit %d flipped and the record opened", n, bit)
			}
			if n > 0 && !bytes.Equal(out[:n], make([]byte, n)) {
				t.Fatalf("%d bytes: a record that failed left text in its output", n)
			}
		}
		if _, err := a.Open(nil, nonce, sealed, []byte{byte(n), 1, 2, 4}); err == nil {
			t.Fatalf("%d bytes: opened with other additional data", n)
		}
		other := append([]byte(nil), nonce...)
		other[len(other)-1] ^= 1
		if _, err := a.Open(nil, other, sealed, ad); err == nil {
			t.Fatalf("%d bytes: opened under another nonce", n)
		}
		if _, err := a.Open(nil, nonce, sealed[:len(sealed)-1], ad); err == nil {
			t.Fatalf("%d bytes: opened cut short", n)
		}
		if got, err := a.Open(nil, nonce, sealed, ad); err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("%d bytes: the untouched record does not open to its text: %v", n, err)
		}
	}
}

// Unhex decodes the hex of a test vector, failing t on a typo.
func Unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// AEADVector is a known answer: under Key and Nonce, Plain with additional
// data AD seals to Cipher and then Tag (all hex).
type AEADVector struct{ Key, Nonce, Plain, AD, Cipher, Tag string }

// AEADKnownAnswers checks that the AEAD newAEAD makes under each vector's
// key seals its text to its ciphertext and tag and opens them back.
func AEADKnownAnswers(t *testing.T, newAEAD func(key []byte) (cipher.AEAD, error), vs []AEADVector) {
	t.Helper()
	for i, v := range vs {
		a, err := newAEAD(Unhex(t, v.Key))
		if err != nil {
			t.Fatal(err)
		}
		want := Unhex(t, v.Cipher+v.Tag)
		got := a.Seal(nil, Unhex(t, v.Nonce), Unhex(t, v.Plain), Unhex(t, v.AD))
		if !bytes.Equal(got, want) {
			t.Errorf("vector %d: sealed %x, want %x", i+1, got, want)
		}
		plain, err := a.Open(nil, Unhex(t, v.Nonce), want, Unhex(t, v.AD))
		if err != nil || !bytes.Equal(plain, Unhex(t, v.Plain)) {
			t.Errorf("vector %d: opened %x, %v; want %s", i+1, plain, err, v.Plain)
		}
	}
}

// Panics checks that each function of cases panics.
func Panics(t *testing.T, cases map[string]func()) {
	t.Helper()
	for name, f := range cases {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}
