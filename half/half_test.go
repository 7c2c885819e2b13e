package half

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// refF16ToF64 decodes float16 bits from the definition (independent of
// F16ToF32). NaN is reported with ok=false.
func refF16ToF64(h uint16) (v float64, ok bool) {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e := int(h>>10) & 0x1f
	m := float64(h & 0x3ff)
	switch e {
	case 0x1f:
		if m != 0 {
			return math.NaN(), false
		}
		return math.Inf(int(sign)), true
	case 0:
		return sign * m * math.Ldexp(1, -24), true
	}
	return sign * (1 + m/1024) * math.Ldexp(1, e-15), true
}

// finiteHalves holds every non-negative finite float16 in increasing order,
// followed by +Inf standing in for the next value (65536) past the largest.
var finiteHalves = func() []float64 {
	var s []float64
	for h := 0; h < 0x7c00; h++ {
		v, _ := refF16ToF64(uint16(h))
		s = append(s, v)
	}
	return s
}()

// refF32ToF16 rounds to nearest, ties to even, by searching the table of all
// float16 values: an implementation unrelated to the bit tricks under test.
func refF32ToF16(f float32) uint16 {
	if f != f {
		b := math.Float32bits(f)
		return uint16(b>>16)&0x8000 | 0x7e00 | uint16(b>>13)&0x3ff
	}
	var sign uint16
	v := float64(f)
	if math.Signbit(v) {
		sign, v = 0x8000, -v
	}
	i := sort.SearchFloat64s(finiteHalves, v) // first >= v
	if i < len(finiteHalves) && finiteHalves[i] == v {
		return sign | uint16(i)
	}
	lo := i - 1
	loV := finiteHalves[lo]
	hiV := 65536.0 // the value an unbounded exponent would give after 65504
	if i < len(finiteHalves) {
		hiV = finiteHalves[i]
	}
	hiBits := uint16(i) // i == 0x7c00 is +Inf
	switch d1, d2 := v-loV, hiV-v; {
	case d1 < d2:
		return sign | uint16(lo)
	case d2 < d1:
		return sign | hiBits
	}
	if lo&1 == 0 {
		return sign | uint16(lo)
	}
	return sign | hiBits
}

// refF32ToBF16 rounds by comparing distances to the two neighbours in float64.
func refF32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40
	}
	if b&0x7fffffff == 0x7f800000 {
		return uint16(b >> 16)
	}
	lo := b &^ 0xffff
	hi := lo + 0x10000
	v := math.Abs(float64(f))
	lv := math.Abs(float64(math.Float32frombits(lo)))
	var hv float64
	if hi&0x7fffffff == 0x7f800000 {
		hv = math.Ldexp(1, 128) // the next value past the largest bfloat16
	} else {
		hv = math.Abs(float64(math.Float32frombits(hi)))
	}
	switch d1, d2 := v-lv, hv-v; {
	case d1 < d2:
		return uint16(lo >> 16)
	case d2 < d1:
		return uint16(hi >> 16)
	}
	if (lo>>16)&1 == 0 {
		return uint16(lo >> 16)
	}
	return uint16(hi >> 16)
}

func sameF32(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }

func TestAllHalvesDecodeAndRoundTrip(t *testing.T) {
	src := make([]uint16, 1<<16)
	for i := range src {
		src[i] = uint16(i)
	}
	vec := make([]float32, len(src))
	Float16ToFloat32(vec, src)
	back := make([]uint16, len(src))
	Float32ToFloat16(back, vec)
	for i, h := range src {
		f := F16ToF32(h)
		if !sameF32(f, vec[i]) {
			t.Fatalf("%#04x: scalar %#08x, slice %#08x", h, math.Float32bits(f), math.Float32bits(vec[i]))
		}
		ref, ok := refF16ToF64(h)
		if ok && float64(f) != ref || ok && math.Signbit(float64(f)) != math.Signbit(ref) {
			t.Fatalf("%#04x decodes to %v, want %v", h, f, ref)
		}
		want := h
		if !ok {
			want = h | 0x200 // NaN comes back quiet
			if f == f {
				t.Fatalf("%#04x: NaN decoded as %v", h, f)
			}
		}
		if got := F32ToF16(f); got != want {
			t.Fatalf("%#04x round-trips to %#04x (scalar)", h, got)
		}
		if back[i] != want {
			t.Fatalf("%#04x round-trips to %#04x (slice)", h, back[i])
		}
	}
}

func TestAllBFloat16RoundTrip(t *testing.T) {
	src := make([]uint16, 1<<16)
	for i := range src {
		src[i] = uint16(i)
	}
	vec := make([]float32, len(src))
	BFloat16ToFloat32(vec, src)
	back := make([]uint16, len(src))
	Float32ToBFloat16(back, vec)
	for i, h := range src {
		if f := BF16ToF32(h); !sameF32(f, vec[i]) {
			t.Fatalf("%#04x: scalar %v slice %v", h, f, vec[i])
		}
		want := h
		if h&0x7f80 == 0x7f80 && h&0x7f != 0 {
			want |= 0x40
		}
		if back[i] != want || F32ToBF16(vec[i]) != want {
			t.Fatalf("%#04x round-trips to %#04x / %#04x", h, back[i], F32ToBF16(vec[i]))
		}
	}
}

func edgeFloats() []float32 {
	var s []float32
	bits := []uint32{
		0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7fbfffff, 0xff812345,
		0x7f7fffff, 0x00000001, 0x007fffff, 0x00800000,
	}
	for _, b := range bits {
		s = append(s, math.Float32frombits(b))
	}
	for _, v := range []float64{65504, 65505, 65519, 65519.99, 65520, 65521, 1e5, -65520, 1, -1, 0.1, 1.0 / 3,
		math.Ldexp(1, -14), math.Ldexp(1, -24), math.Ldexp(1, -25), math.Ldexp(1.5, -25), math.Ldexp(1, -26),
		math.Ldexp(3, -25), math.Ldexp(1023, -24), math.Ldexp(2047, -25), 2049, 2051, 4097} {
		s = append(s, float32(v), -float32(v))
	}
	// every halfway point between adjacent float16 values and its neighbours
	for h := uint16(0); h < 0x7bff; h += 7 {
		a, b := F16ToF32(h), F16ToF32(h+1)
		mid := float32((float64(a) + float64(b)) / 2)
		s = append(s, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9), -mid)
	}
	// bfloat16 halfway points
	for i := 0; i < 2000; i++ {
		b := uint32(i)*2147483 | 0x8000
		s = append(s, math.Float32frombits(b&^0x7fff), math.Float32frombits(b&^0x7fff|0x8000), math.Float32frombits(b|0x7fff))
	}
	return s
}

func randomFloats(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	s := make([]float32, n)
	for i := range s {
		switch i % 3 {
		case 0:
			s[i] = math.Float32frombits(r.Uint32()) // every class, NaN payloads included
		case 1:
			s[i] = float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(40)-28)))
		default:
			s[i] = float32(r.Float64()*131072 - 65536)
		}
	}
	return s
}

func TestFloat32ToFloat16AgainstReference(t *testing.T) {
	in := append(edgeFloats(), randomFloats(300000, 7)...)
	vec := make([]uint16, len(in))
	Float32ToFloat16(vec, in)
	for i, f := range in {
		want := refF32ToF16(f)
		if got := F32ToF16(f); got != want {
			t.Fatalf("F32ToF16(%v = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
		if vec[i] != want {
			t.Fatalf("Float32ToFloat16 [%d] (%v = %#08x) = %#04x, want %#04x (vectorized: %v)", i, f, math.Float32bits(f), vec[i], want, Vectorized())
		}
	}
}

func TestFloat32ToBFloat16AgainstReference(t *testing.T) {
	in := append(edgeFloats(), randomFloats(300000, 9)...)
	vec := make([]uint16, len(in))
	Float32ToBFloat16(vec, in)
	for i, f := range in {
		want := refF32ToBF16(f)
		if got := F32ToBF16(f); got != want {
			t.Fatalf("F32ToBF16(%v = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
		if vec[i] != want {
			t.Fatalf("Float32ToBFloat16 [%d] (%#08x) = %#04x, want %#04x", i, math.Float32bits(f), vec[i], want)
		}
	}
}

// The vector kernels and the pure Go loops agree on a stride through all
// 2^32 float32 bit patterns, for every tail length.
func TestVectorMatchesPureGo(t *testing.T) {
	if len(Vectorized()) == 0 {
		t.Log("no vector path on this CPU: slice functions are the pure Go loops")
	}
	const stride = 509 // ~8.4M patterns
	n := (1 << 32) / stride
	in := make([]float32, 0, n)
	for b := uint64(0); b < 1<<32; b += stride {
		in = append(in, math.Float32frombits(uint32(b)))
	}
	a, g := make([]uint16, len(in)), make([]uint16, len(in))
	Float32ToFloat16(a, in)
	f32ToF16Go(g, in)
	for i := range a {
		if a[i] != g[i] {
			t.Fatalf("f16 %#08x: vector %#04x, go %#04x", math.Float32bits(in[i]), a[i], g[i])
		}
	}
	Float32ToBFloat16(a, in)
	f32ToBF16Go(g, in)
	for i := range a {
		if a[i] != g[i] {
			t.Fatalf("bf16 %#08x: vector %#04x, go %#04x", math.Float32bits(in[i]), a[i], g[i])
		}
	}
	// tails: every length 0..70 at every misalignment 0..3
	src := randomFloats(80, 3)
	for off := 0; off < 4; off++ {
		for l := 0; l+off <= 74; l++ {
			s := src[off : off+l]
			d1, d2 := make([]uint16, l+1), make([]uint16, l+1)
			d1[l], d2[l] = 0xabcd, 0xabcd
			Float32ToFloat16(d1, s)
			f32ToF16Go(d2, s)
			if string(u16bytes(d1)) != string(u16bytes(d2)) || d1[l] != 0xabcd {
				t.Fatalf("f16 len %d off %d: %x vs %x", l, off, d1, d2)
			}
			Float32ToBFloat16(d1, s)
			f32ToBF16Go(d2, s)
			if string(u16bytes(d1)) != string(u16bytes(d2)) || d1[l] != 0xabcd {
				t.Fatalf("bf16 len %d off %d", l, off)
			}
			h := d1[:l]
			f1, f2 := make([]float32, l+1), make([]float32, l+1)
			Float16ToFloat32(f1, h)
			f16ToF32Go(f2, h)
			BFloat16ToFloat32(f1[:l], h)
			bf16ToF32Go(f2[:l], h)
			for i := range f1 {
				if !sameF32(f1[i], f2[i]) {
					t.Fatalf("decode len %d: %v vs %v", l, f1, f2)
				}
			}
		}
	}
}

func u16bytes(s []uint16) []byte {
	b := make([]byte, 2*len(s))
	for i, v := range s {
		b[2*i], b[2*i+1] = byte(v), byte(v>>8)
	}
	return b
}

func TestShortDestinationPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	Float32ToFloat16(make([]uint16, 3), make([]float32, 4))
}

const benchN = 1 << 16

func benchConv(b *testing.B, f func()) {
	b.SetBytes(4 * benchN)
	for b.Loop() {
		f()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchN, "ns/elem")
}

func BenchmarkF32ToF16(b *testing.B) {
	src, dst := randomFloats(benchN, 1), make([]uint16, benchN)
	b.Run("vector", func(b *testing.B) { benchConv(b, func() { Float32ToFloat16(dst, src) }) })
	b.Run("go", func(b *testing.B) { benchConv(b, func() { f32ToF16Go(dst, src) }) })
}

func BenchmarkF16ToF32(b *testing.B) {
	src, dst := make([]uint16, benchN), make([]float32, benchN)
	Float32ToFloat16(src, randomFloats(benchN, 2))
	b.Run("vector", func(b *testing.B) { benchConv(b, func() { Float16ToFloat32(dst, src) }) })
	b.Run("go", func(b *testing.B) { benchConv(b, func() { f16ToF32Go(dst, src) }) })
}

func BenchmarkF32ToBF16(b *testing.B) {
	src, dst := randomFloats(benchN, 1), make([]uint16, benchN)
	b.Run("vector", func(b *testing.B) { benchConv(b, func() { Float32ToBFloat16(dst, src) }) })
	b.Run("go", func(b *testing.B) { benchConv(b, func() { f32ToBF16Go(dst, src) }) })
}

func BenchmarkBF16ToF32(b *testing.B) {
	src, dst := make([]uint16, benchN), make([]float32, benchN)
	Float32ToBFloat16(src, randomFloats(benchN, 2))
	b.Run("vector", func(b *testing.B) { benchConv(b, func() { BFloat16ToFloat32(dst, src) }) })
	b.Run("go", func(b *testing.B) { benchConv(b, func() { bf16ToF32Go(dst, src) }) })
}
