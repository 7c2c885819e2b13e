package aegis

import (
	"bytes"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

// The reference: the draft's pseudocode in plain Go, for any degree,
// over an AES round computed from the field's definition (no tables, no
// AES-NI), so the assembly is checked against something that shares no
// code with it. It is checked itself against the draft's test vectors.

// gmul multiplies in GF(2^8) modulo x^8 + x^4 + x^3 + x + 1.
func gmul(a, b byte) byte {
	var p byte
	for b != 0 {
		if b&1 != 0 {
			p ^= a
		}
		hi := a & 0x80
		a <<= 1
		if hi != 0 {
			a ^= 0x1b
		}
		b >>= 1
	}
	return p
}

// sboxTable is AES's S-box, computed once from its definition.
var sboxTable = func() (t [256]byte) {
	for x := range 256 {
		t[x] = sboxOf(byte(x))
	}
	return t
}()

func sbox(x byte) byte { return sboxTable[x] }

// sboxOf is the inverse in GF(2^8) (0 to 0), then the affine map.
func sboxOf(x byte) byte {
	inv := byte(0)
	for y := 1; y < 256; y++ {
		if gmul(x, byte(y)) == 1 {
			inv = byte(y)
		}
	}
	r := inv
	for i := 1; i <= 4; i++ {
		r ^= inv<<i | inv>>(8-i)
	}
	return r ^ 0x63
}

// aesRound is one AES encryption round of x (SubBytes, ShiftRows,
// MixColumns) xor the round key k; byte r+4c is row r, column c.
func aesRound(x, k [16]byte) [16]byte {
	var t, out [16]byte
	for r := range 4 {
		for c := range 4 {
			t[r+4*c] = sbox(x[r+4*((c+r)%4)])
		}
	}
	for c := range 4 {
		a := t[4*c : 4*c+4]
		for r := range 4 {
			out[r+4*c] = gmul(2, a[r]) ^ gmul(3, a[(r+1)%4]) ^ a[(r+2)%4] ^ a[(r+3)%4] ^ k[r+4*c]
		}
	}
	return out
}

type refState struct {
	d int
	s [8][][16]byte // s[i][lane]
}

func xor16(a, b [16]byte) (r [16]byte) {
	subtle.XORBytes(r[:], a[:], b[:])
	return r
}

// update absorbs m: its first 16d bytes are M0, lane by lane, the next M1.
func (r *refState) update(m []byte) {
	var n [8][][16]byte
	for i := range n {
		n[i] = make([][16]byte, r.d)
	}
	for l := range r.d {
		m0, m1 := [16]byte(m[16*l:]), [16]byte(m[16*(r.d+l):])
		s := func(i int) [16]byte { return r.s[i][l] }
		n[0][l] = aesRound(s(7), xor16(s(0), m0))
		for i := 1; i < 8; i++ {
			if i == 4 {
				n[4][l] = aesRound(s(3), xor16(s(4), m1))
			} else {
				n[i][l] = aesRound(s(i-1), s(i))
			}
		}
	}
	r.s = n
}

func (r *refState) keystream() []byte {
	z := make([]byte, 32*r.d)
	for l := range r.d {
		s := func(i int) [16]byte { return r.s[i][l] }
		var a, b [16]byte
		for j := range 16 {
			a[j] = s(1)[j] ^ s(6)[j] ^ s(2)[j]&s(3)[j]
			b[j] = s(2)[j] ^ s(5)[j] ^ s(6)[j]&s(7)[j]
		}
		copy(z[16*l:], a[:])
		copy(z[16*(r.d+l):], b[:])
	}
	return z
}

func newRef(d int, key, nonce []byte) *refState {
	k, n := [16]byte(key), [16]byte(nonce)
	r := &refState{d: d}
	for i := range r.s {
		r.s[i] = make([][16]byte, d)
	}
	for l := range d {
		for i, v := range [8][16]byte{xor16(k, n), c1, c0, c1, xor16(k, n), xor16(k, c0), xor16(k, c1), xor16(k, c0)} {
			r.s[i][l] = v
		}
	}
	m := append(bytes.Repeat(nonce, d), bytes.Repeat(key, d)...)
	for range 10 {
		for l := range d {
			ctx := [16]byte{byte(l), byte(d - 1)}
			r.s[3][l] = xor16(r.s[3][l], ctx)
			r.s[7][l] = xor16(r.s[7][l], ctx)
		}
		r.update(m)
	}
	return r
}

func pad(b []byte, n int) []byte {
	return append(append([]byte{}, b...), make([]byte, (n-len(b)%n)%n)...)
}

// refSeal returns the ciphertext and the 128-bit tag.
func refSeal(d int, key, nonce, msg, ad []byte) (ct, tag []byte) {
	r := newRef(d, key, nonce)
	rt := 32 * d
	p := pad(ad, rt)
	for i := 0; i < len(p); i += rt {
		r.update(p[i : i+rt])
	}
	p = pad(msg, rt)
	for i := 0; i < len(p); i += rt {
		z := r.keystream()
		c := make([]byte, rt)
		subtle.XORBytes(c, p[i:i+rt], z)
		ct = append(ct, c...)
		r.update(p[i : i+rt])
	}
	var u [16]byte
	binary.LittleEndian.PutUint64(u[:8], uint64(len(ad))*8)
	binary.LittleEndian.PutUint64(u[8:], uint64(len(msg))*8)
	var t []byte
	for l := range d {
		v := xor16(r.s[2][l], u)
		t = append(t, v[:]...)
	}
	t = append(t, t...)
	for range 7 {
		r.update(t)
	}
	var g [16]byte
	for l := range d {
		for i := range 7 {
			g = xor16(g, r.s[i][l])
		}
	}
	return ct[:len(msg)], g[:]
}

// The draft's AEGIS-128X4 and AEGIS-128X2 test vectors
// (draft-irtf-cfrg-aegis-aead, appendices "AEGIS-128X4" and
// "AEGIS-128X2"; the same in its repository's
// test-vectors/aegis-128x{4,2}-test-vectors.json). The package is X4; the
// reference is checked on both, so a mistake that happens to vanish at
// one degree shows at the other.
var vectors = []testenv.AEADVector{
	{
		Key:    "000102030405060708090a0b0c0d0e0f",
		Nonce:  "101112131415161718191a1b1c1d1e1f",
		AD:     "",
		Plain:  "",
		Cipher: "",
		Tag:    "5bef762d0947c00455b97bb3af30dfa3",
	},
	{
		Key:    "000102030405060708090a0b0c0d0e0f",
		Nonce:  "101112131415161718191a1b1c1d1e1f",
		AD:     "0102030401020304",
		Plain:  "040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607",
		Cipher: "e836118562f4479c9d35c17356a833114c21f9aa39e4dda5e5c87f4152a00fce9a7c38f832eafe8b1c12f8a7cf12a81a1ad8a9c24ba9dedfbdaa586ffea67ddc801ea97d9ab4a872f42d0e352e2713dacd609f9442c17517c5a29daf3e2a3fac4ff6b1380c4e46df7b086af6ce6bc1ed594b8dd64aed2a7e",
		Tag:    "0e56ab94e2e85db80f9d54010caabfb4",
	},
}

var vectorsX2 = []testenv.AEADVector{
	{
		Key:    "000102030405060708090a0b0c0d0e0f",
		Nonce:  "101112131415161718191a1b1c1d1e1f",
		AD:     "",
		Plain:  "",
		Cipher: "",
		Tag:    "63117dc57756e402819a82e13eca8379",
	},
	{
		Key:    "000102030405060708090a0b0c0d0e0f",
		Nonce:  "101112131415161718191a1b1c1d1e1f",
		AD:     "0102030401020304",
		Plain:  "040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607040506070405060704050607",
		Cipher: "5795544301997f93621b278809d6331b3bfa6f18e90db12c4aa35965b5e98c5fc6fb4e54bcb6111842c20637252eff747cb3a8f85b37de80919a589fe0f24872bc926360696739e05520647e390989e1eb5fd42f99678a0276a498f8c454761c9d6aacb647ad56be62b29c22cd4b5761b38f43d5a5ee062f",
		Tag:    "1aebc200804f405cab637f2adebb6d77",
	},
}

// The draft's state after initialisation for the first vector's key and
// nonce, V[i,0] .. V[i,3] for i = 0..7, and the same for X2.
var initState = [8]string{
	"924eb07635003a37e6c6575ba8ce1929c8b6a5d91475445e936d48e794be0ce2fcd37d050e24084befe3bbb219d647602e9f58cfb893a8800220242c373a8b18",
	"1a1f60c4fab64e5471dc72edfcf6fe6bc1e525ebea2d6375a9edd045dce9638197a3e25abd228a44d4a14a6d3fe9185cc2d4cf7f4287a98744645674265d4ca8",
	"7bb50c534f6ec4780530ff1cce8a16e87b08d57557da0b5ef7b5f7d98b0ba1896bfcac34ddb68404821a4d665303cb0fd95626f6dfad1aed7467622c38529932",
	"af339fd2d50ee45fc47665c647cf6586d0669b39d140f0e118a4a511efe2f95a7a94330f35c194fadda2a87e42cdeccc233b640d1f4d56e2757e72c1a9d8ecb1",
	"9f93737d699ba05c11e94f2b201bef5e61caf387cf7cfd3f8300ac7680ccfd765825a671ecef03b7a9c98a601ae3211587a1fe4d558161a8f4c38731f3223032",
	"7a5aca78d636c05bbc702b2980196ab6915d868408495d07eb527789f282c575d0947bfbc1d3309cdffc9be1503aea628834ea57a15b9fbdc0245464a4b8cbef",
	"e46f4cf71a95ac45b6f0823e3aba1a868c4ecef682fc44a8eba911b3fc7d99f9a4fb61e2c928a2ca760b8772f2ea5f2e3d34ea89da73caa3016c280500a155a3",
	"85075f0080e9d618e7eb40f57c32d9f7d2ab2b320c6e93b155a3787cb83e52810b3af0250ae36831a1b072e499929bcb5cce4d00329d69f1aae36aa541347512",
}

var initStateX2 = [8]string{
	"a4fc1ad9a72942fb88bd2cabbba6509a80a40e392fc71084209b6c3319bdc6cc",
	"380f435cf801763b1f0c2a2f7212052d73796607b59b1b650ee91c152af1f18a",
	"6ee1de433ea877fa33bc0782abff2dcbb9fab2ab496e16d1facaffd5453cbf14",
	"85f94b0d4263bfa86fdf45a603d8b6ac90356c8cadbaa2c969001da02e3feca0",
	"09bd69ad3730174bcd2ce9a27cd1357ee610b45125796a4fcf1708cef5c4f718",
	"fcdeb0cf0a87bf442fc82383ddb0f6d661ad32a4694d6f3cca313a2d3f4687aa",
	"571c207988659e2cdfbdaae77f4f37e332e6094e217573bf91fb28c145a3efa8",
	"ca549badf8faa58222412478598651cf3407279a54ce76d2e2e8a90ec5d108eb",
}

// TestReference holds the reference to the draft's vectors at degrees 4
// and 2; it runs on every machine.
func TestReference(t *testing.T) {
	for _, c := range []struct {
		d    int
		init [8]string
		vs   []testenv.AEADVector
	}{{4, initState, vectors}, {2, initStateX2, vectorsX2}} {
		v := c.vs[0]
		r := newRef(c.d, testenv.Unhex(t, v.Key), testenv.Unhex(t, v.Nonce))
		for i, want := range c.init {
			var got []byte
			for l := range c.d {
				got = append(got, r.s[i][l][:]...)
			}
			if hex.EncodeToString(got) != want {
				t.Fatalf("X%d: reference state S%d after initialisation %x, the draft's %s", c.d, i, got, want)
			}
		}
		for i, v := range c.vs {
			ct, tag := refSeal(c.d, testenv.Unhex(t, v.Key), testenv.Unhex(t, v.Nonce), testenv.Unhex(t, v.Plain), testenv.Unhex(t, v.AD))
			if hex.EncodeToString(ct) != v.Cipher || hex.EncodeToString(tag) != v.Tag {
				t.Errorf("X%d vector %d: reference gives %x tag %x, the draft %s tag %s", c.d, i+1, ct, tag, v.Cipher, v.Tag)
			}
		}
	}
}

func need(t *testing.T) {
	t.Helper()
	if !Available() {
		t.Skip("this CPU has no VAES on AVX-512: the assembly cannot run here (TestReference still checks the reference)")
	}
}

func TestVectors(t *testing.T) {
	need(t)
	v := vectors[0]
	a, err := New(testenv.Unhex(t, v.Key))
	if err != nil {
		t.Fatal(err)
	}
	var s state
	a.(*aead).begin(&s, testenv.Unhex(t, v.Nonce), nil)
	for i, want := range initState {
		if hex.EncodeToString(s[i][:]) != want {
			t.Fatalf("state S%d after initialisation %x, the draft's %s", i, s[i], want)
		}
	}
	testenv.AEADKnownAnswers(t, New, vectors)
}

// TestAgainstReference: random keys, nonces, additional data and text of
// every length up to a few blocks and some long ones, in place and into
// another buffer, sealed as the reference seals and opened back.
func TestAgainstReference(t *testing.T) {
	need(t)
	rng := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	lengths := []int{}
	for n := 0; n <= 200; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 1000, 4096, 65536+17, 256<<10)
	for _, n := range lengths {
		key, nonce := fill(16), fill(16)
		ad := fill(rng.IntN(140))
		msg := fill(n)
		a, err := New(key)
		if err != nil {
			t.Fatal(err)
		}
		ct, tag := refSeal(lanes, key, nonce, msg, ad)
		want := append(ct, tag...)
		if got := a.Seal(nil, nonce, msg, ad); !bytes.Equal(got, want) {
			t.Fatalf("%d bytes, %d of additional data: sealed differs from the reference", n, len(ad))
		}
		buf := make([]byte, n, n+TagSize)
		copy(buf, msg)
		if got := a.Seal(buf[:0], nonce, buf, ad); !bytes.Equal(got, want) {
			t.Fatalf("%d bytes sealed in place differ from the reference", n)
		}
		pre := []byte("prefix")
		got, err := a.Open(pre, nonce, want, ad)
		if err != nil || !bytes.Equal(got, append([]byte("prefix"), msg...)) {
			t.Fatalf("%d bytes: opened into another buffer wrong (%v)", n, err)
		}
		in := append([]byte{}, want...)
		got, err = a.Open(in[:0], nonce, in, ad)
		if err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("%d bytes: opened in place wrong (%v)", n, err)
		}
	}
}

// TestTamper: any changed bit of the ciphertext, the tag or the
// additional data, another nonce or a record cut short fails to open, and
// the output is left zero.
func TestTamper(t *testing.T) {
	need(t)
	a, err := New(bytes.Repeat([]byte{7}, 16))
	if err != nil {
		t.Fatal(err)
	}
	testenv.AEADRefusesTampering(t, a, bytes.Repeat([]byte{9}, 16), []int{0, 1, 63, 64, 65, 127, 128, 129, 300, 4096})
}

func TestNewRefusesBadKey(t *testing.T) {
	need(t)
	if _, err := New(make([]byte, 15)); err == nil {
		t.Fatal("a 15-byte key was taken")
	}
}

// TestBadUse: a wrong nonce size and an overlap that is not exact panic,
// as crypto/cipher's AEADs do.
func TestBadUse(t *testing.T) {
	need(t)
	a, err := New(make([]byte, 16))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Panics(t, map[string]func(){
		"nonce": func() { a.Seal(nil, make([]byte, 12), nil, nil) },
		"overlap": func() {
			b := make([]byte, 300)
			a.Seal(b[1:1], make([]byte, 16), b[:200], nil)
		},
	})
}
