package aesgcm

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

func std(t testing.TB, key []byte) cipher.AEAD {
	t.Helper()
	b, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// vec is New's vector code, or a skip saying why this machine has none.
func vec(t testing.TB, key []byte) cipher.AEAD {
	t.Helper()
	if !vector {
		t.Skip("this CPU lacks AVX-512 VAES/VPCLMULQDQ (New uses crypto/cipher): the vector code is not tested here")
	}
	return newVector(key)
}

// TestKnownAnswers: test cases 1 to 4 of McGrew and Viega's GCM
// specification (AES-128), through New (vector or not).
func TestKnownAnswers(t *testing.T) {
	testenv.AEADKnownAnswers(t, New, []testenv.AEADVector{
		{
			Key:   "00000000000000000000000000000000",
			Nonce: "000000000000000000000000",
			Tag:   "58e2fccefa7e3061367f1d57a4e7455a",
		},
		{
			Key:    "00000000000000000000000000000000",
			Nonce:  "000000000000000000000000",
			Plain:  "00000000000000000000000000000000",
			Cipher: "0388dace60b6a392f328c2b971b2fe78",
			Tag:    "ab6e47d42cec13bdf53a67b21257bddf",
		},
		{
			Key:    "feffe9928665731c6d6a8f9467308308",
			Nonce:  "cafebabefacedbaddecaf888",
			Plain:  "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255",
			Cipher: "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091473f5985",
			Tag:    "4d5c2af327cd64a62cf35abd2ba6fab4",
		},
		{
			Key:    "feffe9928665731c6d6a8f9467308308",
			Nonce:  "cafebabefacedbaddecaf888",
			Plain:  "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
			AD:     "feedfacedeadbeeffeedfacedeadbeefabaddad2",
			Cipher: "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091",
			Tag:    "5bc94fbc3221a5db94fae95ae7121a47",
		},
	})
}

// TestAgainstCryptoCipher: the vector code seals to crypto/cipher's bytes
// and opens them, for every length to 1100 bytes and some large ones, with
// additional data of 0 to 70 bytes, into fresh slices, after a prefix
// (append) and in place.
func TestAgainstCryptoCipher(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	lengths := []int{4096, 4096 + 255, 96 << 10, 256<<10 + 24, 1<<20 + 1}
	for n := 0; n <= 1100; n++ {
		lengths = append(lengths, n)
	}
	for i, n := range lengths {
		key, nonce := make([]byte, 16), make([]byte, 12)
		fill(r, key)
		fill(r, nonce)
		ad := make([]byte, i%71)
		fill(r, ad)
		plain := make([]byte, n)
		fill(r, plain)
		s, v := std(t, key), vec(t, key)
		want := s.Seal(nil, nonce, plain, ad)
		if got := v.Seal(nil, nonce, plain, ad); !bytes.Equal(got, want) {
			t.Fatalf("len %d, ad %d: sealed differently from crypto/cipher (first difference at byte %d)", n, len(ad), diffAt(got, want))
		}
		prefix := []byte("prefix")
		if got := v.Seal(append([]byte(nil), prefix...), nonce, plain, ad); !bytes.Equal(got, append(prefix, want...)) {
			t.Fatalf("len %d: sealed after a prefix differently", n)
		}
		inPlace := make([]byte, n, n+16)
		copy(inPlace, plain)
		if got := v.Seal(inPlace[:0], nonce, inPlace, ad); !bytes.Equal(got, want) {
			t.Fatalf("len %d: sealed in place differently", n)
		}
		got, err := v.Open(nil, nonce, want, ad)
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("len %d: opening crypto/cipher's record: %v (first difference at byte %d)", n, err, diffAt(got, plain))
		}
		box := append([]byte(nil), want...)
		if got, err := v.Open(box[:0], nonce, box, ad); err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("len %d: opening in place: %v", n, err)
		}
	}
}

// TestTampered: a flipped bit anywhere in the ciphertext, the tag or the
// additional data, another nonce, or a record cut short fails to open,
// and what was opened is cleared.
func TestTampered(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	key, nonce := make([]byte, 16), make([]byte, 12)
	fill(r, key)
	fill(r, nonce)
	testenv.AEADRefusesTampering(t, vec(t, key), nonce, []int{0, 1, 16, 255, 256, 700, 4096})
}

// TestAllOnesNonce: the counter block's first 12 bytes stay the nonce in
// every lane when they are all ones (only the last 4 bytes count; a 16
// KiB record's 1024 blocks are far from their 32-bit wrap, which no
// record of 256 KiB reaches).
func TestAllOnesNonce(t *testing.T) {
	key := make([]byte, 16)
	v, s := vec(t, key), std(t, key)
	nonce := make([]byte, 12)
	for i := range nonce {
		nonce[i] = 0xff
	}
	plain := make([]byte, 16<<10)
	if got, want := v.Seal(nil, nonce, plain, nil), s.Seal(nil, nonce, plain, nil); !bytes.Equal(got, want) {
		t.Fatalf("all-ones nonce: first difference at byte %d", diffAt(got, want))
	}
}

// TestBadUse: a wrong key size is an error; a wrong nonce size and an
// overlap that is not exact panic, as crypto/cipher's do.
func TestBadUse(t *testing.T) {
	if _, err := New(make([]byte, 32)); err == nil {
		t.Fatal("a 32-byte key was taken")
	}
	v := vec(t, make([]byte, 16))
	testenv.Panics(t, map[string]func(){
		"nonce": func() { v.Seal(nil, make([]byte, 8), nil, nil) },
		"overlap": func() {
			b := make([]byte, 100)
			v.Seal(b[1:1], make([]byte, 12), b[:50], nil)
		},
	})
}

// FuzzAgainstCryptoCipher: any key, nonce, data and additional data seal
// as crypto/cipher seals them, and open again.
func FuzzAgainstCryptoCipher(f *testing.F) {
	f.Add(make([]byte, 16), make([]byte, 12), []byte("hello"), []byte{})
	f.Add([]byte("0123456789abcdef"), []byte("nonce-nonce!"), bytes.Repeat([]byte{7}, 300), []byte("ad"))
	f.Fuzz(func(t *testing.T, key, nonce, plain, ad []byte) {
		if len(key) != 16 || len(nonce) != 12 {
			return
		}
		want := std(t, key).Seal(nil, nonce, plain, ad)
		v := vec(t, key)
		got := v.Seal(nil, nonce, plain, ad)
		if !bytes.Equal(got, want) {
			t.Fatalf("sealed differently (first difference at byte %d)", diffAt(got, want))
		}
		if back, err := v.Open(nil, nonce, got, ad); err != nil || !bytes.Equal(back, plain) {
			t.Fatalf("did not open: %v", err)
		}
	})
}

func fill(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func diffAt(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
