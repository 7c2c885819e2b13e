package plan

import (
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
)

// A small model's shapes in the order a model registers them, and its
// buckets in the order they leave (the last parameters first):
//
//	[1000 64]  64,000 > 2 x 1,064 x 4 = 8,512: compressed, P 16,000 B, Q 1,024 B
//	[64]       a vector: 256 B uncompressed
//	[64 64]    4,096 > 1,024: P 1,024 B, Q 1,024 B
//	[64 256]   16,384 > 2,560: P 1,024 B, Q 4,096 B
//	[256]      1,024 B uncompressed
//	[8 8]      64 > 2 x 16 x 4 = 128? no: 256 B uncompressed
//
// bucket 0: [64 256], [256], [8 8] (66,816 float32 bytes); bucket 1:
// [64 64], [64] (16,640); bucket 2: [1000 64] (256,000).
var (
	smallShapes  = [][]int{{1000, 64}, {64}, {64, 64}, {64, 256}, {256}, {8, 8}}
	smallBuckets = []int{66816, 16640, 256000}
)

func TestPowerSGDBytesByHand(t *testing.T) {
	p, err := NewPowerSGD(smallShapes, smallBuckets, 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []PowerSGDBucket{
		{Matrices: 1, Tensors: 2, Elems: 64 * 256, RestBytes: 1024 + 256, PBytes: 64 * 4 * 4, QBytes: 256 * 4 * 4},
		{Matrices: 1, Tensors: 1, Elems: 64 * 64, RestBytes: 256, PBytes: 64 * 4 * 4, QBytes: 64 * 4 * 4},
		{Matrices: 1, Elems: 64000, PBytes: 1000 * 4 * 4, QBytes: 64 * 4 * 4},
	}
	if len(p.Buckets) != 3 {
		t.Fatalf("%d buckets, want 3", len(p.Buckets))
	}
	for k, w := range want {
		got := p.Buckets[k]
		got.Phases = [3]float64{}
		if got != w {
			t.Errorf("bucket %d: %+v, want %+v", k, got, w)
		}
	}
	// fp16 for the rest: bucket 0 640 + 1,024 + 4,096; bucket 1 128 +
	// 1,024 + 1,024; bucket 2 16,000 + 1,024
	for k, w := range []int{5760, 2176, 17024} {
		if got := p.Buckets[k].WireBytes(dtype.Float16); got != w {
			t.Errorf("bucket %d: %d bytes on the wire, want %d", k, got, w)
		}
	}
	if got := p.WireBytes(dtype.Float16); got != 24960 {
		t.Errorf("a step: %d bytes on the wire, want 24,960", got)
	}
	// the FLOPs: 6nmr + 3nm + 2(n+m)r² each
	flops := matrixFLOPs(64, 256, 4) + matrixFLOPs(64, 64, 4) + matrixFLOPs(1000, 64, 4)
	near(t, "FLOPs", p.FLOPs(), flops)
	near(t, "FLOPs of 1000 x 64 at 4", matrixFLOPs(1000, 64, 4), 6*1000*64*4+3*1000*64+2*(1000+64)*16)
	mats, elems, tensors, rest := p.Totals()
	if mats != 3 || elems != 64*256+64*64+64000 || tensors != 3 || rest != 256+64+64 {
		t.Errorf("totals %d %d %d %d", mats, elems, tensors, rest)
	}
	// buckets that do not end at a parameter's end, or leave some over
	for _, bad := range [][]int{{66816, 16640, 255996}, {66816, 16640}, {66820, 16636, 256000}} {
		if _, err := NewPowerSGD(smallShapes, bad, 4); err == nil {
			t.Errorf("buckets %v: no error", bad)
		}
	}
	if _, err := NewPowerSGD(smallShapes, smallBuckets, 0); err == nil {
		t.Error("rank 0: no error")
	}
}

// The rule of DDP's min_compression_rate 2, as the compressor applies
// it: n·m > 2·(n+m)·min(r, n, m), the boundary itself not compressed.
func TestPowerSGDCompressesBoundary(t *testing.T) {
	for _, k := range []struct {
		n, m, r int
		want    bool
	}{
		{16, 16, 4, false}, // 256 = 2 x 32 x 4: on the boundary
		{17, 16, 4, true},  // 272 > 264
		{16, 15, 4, false}, // 240 < 248
		{24, 12, 4, false}, // 288 = 2 x 36 x 4
		{25, 12, 4, true},  // 300 > 296
		{3, 1000, 4, false},
		{512, 512, 4, true},
		{32768, 512, 4, true},
		{512, 512, 128, false}, // 262,144 = 2 x 1,024 x 128
		{512, 512, 127, true},
		{0, 10, 4, false},
		{10, 10, 0, false},
	} {
		if got := PowerSGDCompresses(k.n, k.m, k.r); got != k.want {
			t.Errorf("%d x %d at rank %d: compressed %v, want %v", k.n, k.m, k.r, got, k.want)
		}
	}
	for _, k := range []struct {
		shape      []int
		rows, cols int
		ok         bool
	}{{[]int{64}, 0, 0, false}, {nil, 0, 0, false}, {[]int{4, 5}, 4, 5, true}, {[]int{2, 3, 4}, 2, 12, true}} {
		if r, c, ok := AsMatrix(k.shape); r != k.rows || c != k.cols || ok != k.ok {
			t.Errorf("AsMatrix(%v) = %d, %d, %v", k.shape, r, c, ok)
		}
	}
}

// On a GPU the compressor's compute is its FLOPs at the rate of the
// step's: 6 x parameters x tokens in the given seconds.
func TestComputeFromFLOPs(t *testing.T) {
	near(t, "StepFLOPs", StepFLOPs(60880896, 4096), 6*60880896*4096.0)
	near(t, "ComputeFromFLOPs", ComputeFromFLOPs(0.25, 1.5e9, 1.5e12), 0.25e-3)
	near(t, "no step FLOPs", ComputeFromFLOPs(0.25, 1.5e9, 0), 0)
	// the phases add up to the matrix's FLOPs
	ph := powerSGDPhases(1000, 64, 4)
	near(t, "phases", ph[0]+ph[1]+ph[2], matrixFLOPs(1000, 64, 4))
}

// psgdWorkload is the small model's workload with PowerSGD of rank 4 and
// compute c s.
func psgdWorkload(t *testing.T, c float64) Workload {
	t.Helper()
	p, err := NewPowerSGD(smallShapes, smallBuckets, 4)
	if err != nil {
		t.Fatal(err)
	}
	p.ComputeS = c
	return Workload{Params: 336960 / 4, Buckets: smallBuckets, ComputeS: 1, TokensPerRank: 1000, Wire: dtype.Float16, PowerSGD: p}
}

// Each bucket sends its uncompressed tensors in fp16, then P, then Q in
// float32, three allreduces one after the other (two where nothing is
// left uncompressed), each timed as the plan times any allreduce; after
// backward (no overlap) one of each for all buckets, and the
// compressor's compute after backward is all exposed.
func TestPowerSGDCalls(t *testing.T) {
	c := Cluster{Hosts: 2, PerHost: 1, LinkGbps: 1, Transport: "tcp"}
	m := algo.LinkModel(algo.Link{Gbps: 1, StepUs: TLSTCP.StepUs, CapGBs: TLSTCP.CapGBs}, 2)
	call := func(b int) float64 { return m.Predict(m.Choose(b, 2), b, 2) / 1e6 }
	w := psgdWorkload(t, 0.002)
	w.Overlap, w.BackwardS = true, 0.9
	p, err := Predict(c, w)
	if err != nil {
		t.Fatal(err)
	}
	wire := [][3]int{{640, 1024, 4096}, {128, 1024, 1024}, {0, 16000, 1024}}
	comm, last := 0.0, 0.0
	for k, b := range p.Buckets {
		var whats []string
		for i, cl := range b.Calls {
			whats = append(whats, cl.What)
			want := wire[k][i+3-len(b.Calls)]
			if cl.WireBytes != want {
				t.Errorf("bucket %d call %s: %d bytes, want %d", k, cl.What, cl.WireBytes, want)
			}
			near(t, "call", cl.Seconds, call(want))
			comm += call(want)
			if k == 2 {
				last += call(want)
			}
		}
		if want := map[bool]string{true: "rest P Q", false: "P Q"}[k < 2]; strings.Join(whats, " ") != want {
			t.Errorf("bucket %d: calls %v, want %s", k, whats, want)
		}
	}
	near(t, "CommS", p.CommS, comm)
	near(t, "CompressS", p.CompressS, 0.002)
	if p.WireBytes != 24960 || len(p.Buckets) != 3 {
		t.Errorf("%d bytes a step in %d buckets, want 24,960 in 3", p.WireBytes, len(p.Buckets))
	}
	// buckets 0 and 1 are ready well before backward ends and done under
	// it, with their compression; the last, the 1000 x 64 matrix, is
	// ready at its end: its allreduces and its compression are exposed
	f := matrixFLOPs(1000, 64, 4) / w.PowerSGD.FLOPs()
	near(t, "overlap CompressUnderS", p.CompressUnderS, 0.002*(1-f))
	near(t, "overlap ExposedS", p.ExposedS, last+0.002*f)
	near(t, "overlap StepS", p.StepS, 1+p.SyncS+p.CompressUnderS+p.ExposedS)
	// no overlap: one of each after backward, the compressor's 2 ms in
	// the exposed time, none in backward
	w.Overlap = false
	p, _ = Predict(c, w)
	near(t, "plain CommS", p.CommS, call(768)+call(18048)+call(6144))
	near(t, "plain ExposedS", p.ExposedS, p.CommS+0.002)
	near(t, "plain StepS", p.StepS, 1+p.SyncS+p.ExposedS)
	if p.CompressUnderS != 0 || len(p.Buckets) != 1 || p.WireBytes != 24960 {
		t.Errorf("no overlap: %v s of compression in backward, %d buckets, %d bytes", p.CompressUnderS, len(p.Buckets), p.WireBytes)
	}
}

// Latency: where the bytes cost nothing, a bucket of compressed matrices
// costs two allreduces' steps (P and Q) where fp16 costs one, and one
// with an uncompressed tensor too three. (2 ranks, calls over 256 KiB:
// the ring for each, 2 steps.)
func TestPowerSGDTwoAllreduceLatency(t *testing.T) {
	c := Cluster{Hosts: 2, PerHost: 1, LinkGbps: 1e12, Transport: "tcp", CapGBs: 1e9, LatencyUs: 100}
	for _, k := range []struct {
		shapes [][]int
		calls  float64
	}{{[][]int{{20000, 20000}}, 2}, {[][]int{{200000}, {20000, 20000}}, 3}} {
		bytes := 0
		for _, s := range k.shapes {
			n := 1
			for _, d := range s {
				n *= d
			}
			bytes += 4 * n
		}
		ps, err := NewPowerSGD(k.shapes, []int{bytes}, 4)
		if err != nil {
			t.Fatal(err)
		}
		w := Workload{Params: int64(bytes / 4), Buckets: []int{bytes}, ComputeS: 1, Wire: dtype.Float16}
		plain, err := Predict(c, w)
		if err != nil {
			t.Fatal(err)
		}
		w.PowerSGD = ps
		p, err := Predict(c, w)
		if err != nil {
			t.Fatal(err)
		}
		if r := p.CommS / plain.CommS; math.Abs(r-k.calls) > 0.01 || len(p.Buckets[0].Calls) != int(k.calls) {
			t.Errorf("%v: PowerSGD's %d allreduces take %.4g s, fp16's %.4g s: %.3f times, want %g", k.shapes, len(p.Buckets[0].Calls), p.CommS, plain.CommS, r, k.calls)
		}
		for _, cl := range p.Buckets[0].Calls {
			if cl.Algorithm != "ring" {
				t.Errorf("%v: %s by %s, want the ring", k.shapes, cl.What, cl.Algorithm)
			}
		}
	}
}

// A PowerSGD that does not describe the workload's buckets is refused.
func TestPowerSGDBadInput(t *testing.T) {
	c := Cluster{Hosts: 2, PerHost: 1, LinkGbps: 1}
	for what, f := range map[string]func(*Workload){
		"a bucket for each": func(w *Workload) { w.PowerSGD.Buckets = w.PowerSGD.Buckets[:2] },
		"holds 256004":      func(w *Workload) { w.PowerSGD.Buckets[2].RestBytes = 4 },
		"rank 0":            func(w *Workload) { w.PowerSGD.Rank = 0 },
		"-1 s":              func(w *Workload) { w.PowerSGD.ComputeS = -1 },
	} {
		w := psgdWorkload(t, 0)
		f(&w)
		if _, err := Predict(c, w); err == nil || !strings.Contains(err.Error(), strings.Fields(what)[len(strings.Fields(what))-1]) {
			t.Errorf("%s: error %v", what, err)
		}
	}
}

// More bandwidth is never slower with PowerSGD either.
func TestPowerSGDMoreBandwidthNeverSlower(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	for i := 0; i < 1000; i++ {
		c, w := randomCase(r)
		w.Wire = dtype.Float16
		ps := &PowerSGD{Rank: 4, ComputeS: r.Float64() * 0.05}
		for _, b := range w.Buckets {
			e := r.Intn(b/4 + 1)
			ps.Buckets = append(ps.Buckets, PowerSGDBucket{Matrices: 1, Elems: e, RestBytes: b - 4*e,
				PBytes: 4 * r.Intn(e/8+1), QBytes: 4 * r.Intn(e/8+1), Phases: [3]float64{r.Float64(), r.Float64(), r.Float64()}})
		}
		w.PowerSGD = ps
		p1, err := Predict(c, w)
		if err != nil {
			t.Fatalf("%+v %+v: %v", c, w, err)
		}
		c.LinkGbps *= 1 + 10*r.Float64()
		p2, err := Predict(c, w)
		if err != nil {
			t.Fatal(err)
		}
		if p2.StepS > p1.StepS*(1+1e-12) || p2.CommS > p1.CommS*(1+1e-12) {
			t.Fatalf("%+v: a faster link gave %.6f s (comm %.6f) against %.6f s (comm %.6f)", c, p2.StepS, p2.CommS, p1.StepS, p1.CommS)
		}
	}
}

// matrixFLOPs is the compressor's work on one n x m matrix at r columns,
// written out as docs/plan.md counts it: P = M Q, Q = Mᵀ P and P Qᵀ (2nmr
// each), the error feedback (3nm), Gram-Schmidt of Q and P (2mr², 2nr²).
func matrixFLOPs(n, m, r int) float64 {
	N, M, R := float64(n), float64(m), float64(r)
	return 6*N*M*R + 3*N*M + 2*(N+M)*R*R
}
