package cudaemu

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/gorun/gorun/half"
)

// testBlockSum checks a block reduction (shared memory, barriers, warp
// shuffles) with blocks of the given size over rows of several lengths.
// The values are small integers, so every order of summation is exact.
func testBlockSum(t *testing.T, l *emuLibs, kernel string, block int) {
	t.Helper()
	for _, n := range []int{1, 31, block, 3*block + 17} {
		const rows = 5
		x := make([]float32, rows*n)
		want := make([]float32, rows)
		for i := range x {
			x[i] = float32(i%13) - 6
			want[i/n] += x[i]
		}
		dx := upload(t, l, x)
		dout := l.alloc(t, 4*rows)
		l.mustLaunch(t, kernel, d1(rows), d1(block), dout, dx, int32(n))
		got := make([]float32, rows)
		download(t, l, got, dout)
		for r := range got {
			if got[r] != want[r] {
				t.Errorf("%s, block %d, n %d: row %d sum %v, want %v", kernel, block, n, r, got[r], want[r])
			}
		}
	}
}

func TestBlockReduction(t *testing.T) {
	l := setup(t)
	for _, k := range []string{"emu_test_block_sum", "emu_test_block_sum_warps"} {
		for _, block := range []int{32, 256, 1024} {
			testBlockSum(t, l, k, block)
		}
	}
}

// shflRef is what CUDA documents for __shfl*_sync with a width.
func shflRef(op, arg, width, lane int) int {
	seg := lane &^ (width - 1)
	src := lane
	switch op {
	case 0: // idx
		src = seg + arg%width
	case 1: // up
		if lane-seg >= arg {
			src = lane - arg
		}
	case 2: // down
		if lane-seg+arg < width {
			src = lane + arg
		}
	case 3: // xor: lanes of a later group are out of reach
		if s := lane ^ arg; s < seg+width {
			src = s
		}
	}
	return src
}

func TestShuffles(t *testing.T) {
	l := setup(t)
	const block, grid = 64, 2
	out := l.alloc(t, 4*block*grid)
	got := make([]int32, block*grid)
	for op := 0; op < 4; op++ {
		for _, width := range []int{32, 16, 8, 4, 2, 1} {
			for arg := 0; arg < 32; arg++ {
				l.mustLaunch(t, "emu_test_shfl", d1(grid), d1(block), out, int32(op), int32(arg), int32(width))
				download(t, l, got, out)
				for i, g := range got {
					tid := i % block
					lane, warp := tid%32, tid/32
					want := int32((warp*32+shflRef(op, arg, width, lane))*7 + 3)
					if g != want {
						t.Fatalf("op %d arg %d width %d: thread %d got %d, want %d", op, arg, width, i, g, want)
					}
				}
			}
		}
	}

	of, od, ou := l.alloc(t, 4*32), l.alloc(t, 8*32), l.alloc(t, 4*32)
	f, d, u := make([]float32, 32), make([]float64, 32), make([]uint32, 32)
	for m := 1; m < 32; m++ {
		l.mustLaunch(t, "emu_test_shfl_types", d1(1), d1(32), of, od, ou, int32(m))
		download(t, l, f, of)
		download(t, l, d, od)
		download(t, l, u, ou)
		for i := range 32 {
			s := i ^ m
			if f[i] != float32(s)+0.5 || d[i] != float64(s)*1e10+0.25 || u[i] != 0x80000000+uint32(s) {
				t.Fatalf("mask %d lane %d: %v %v %#x", m, i, f[i], d[i], u[i])
			}
		}
	}
}

func TestVotes(t *testing.T) {
	l := setup(t)
	const n = 96
	out := l.alloc(t, 4*4*n)
	l.mustLaunch(t, "emu_test_vote", d1(1), d1(n), out)
	got := make([]uint32, 4*n)
	download(t, l, got, out)
	var ballot uint32
	for lane := 0; lane < 32; lane += 3 {
		ballot |= 1 << lane
	}
	count := uint32((n + 4) / 5)
	for i := range n {
		if g := got[4*i : 4*i+4]; g[0] != ballot || g[1] != 1 || g[2] != 0 || g[3] != count {
			t.Fatalf("thread %d: ballot %#x any %d all %d count %d; want %#x 1 0 %d", i, g[0], g[1], g[2], g[3], ballot, count)
		}
	}
}

func TestAtomics(t *testing.T) {
	l := setup(t)
	const n = 64 * 256 * 3
	f, d, i, u := l.alloc(t, 4), l.alloc(t, 8), l.alloc(t, 4), l.alloc(t, 4)
	for _, p := range []uintptr{f, i, u} {
		l.must(t, "cuMemsetD32Async", p, 0, 1, 0)
	}
	l.must(t, "cuMemsetD8Async", d, 0, 8, 0)
	slot := l.alloc(t, 4*n)
	l.must(t, "cuMemsetD32Async", slot, 0, n, 0)
	l.mustLaunch(t, "emu_test_atomic", d1(64), d1(256), f, d, i, u, slot, int64(n))
	var gf [1]float32
	var gd [1]float64
	var gi [1]int32
	var gu [1]uint32
	download(t, l, gf[:], f)
	download(t, l, gd[:], d)
	download(t, l, gi[:], i)
	download(t, l, gu[:], u)
	if gf[0] != n || gd[0] != n/2 || gi[0] != n || gu[0] != 2*n {
		t.Errorf("atomicAdd: float %v double %v int %v unsigned %v; want %d %d %d %d", gf[0], gd[0], gi[0], gu[0], n, n/2, n, 2*n)
	}
	s := make([]int32, n)
	download(t, l, s, slot)
	for k, v := range s {
		if v != 1 {
			t.Fatalf("slot %d written %d times: atomicAdd's old values are not distinct", k, v)
		}
	}
}

func TestCoordinates(t *testing.T) {
	l := setup(t)
	for _, c := range []struct{ grid, block dim }{
		{dim{3, 2, 1}, dim{8, 4, 1}}, // a 2-D launch
		{dim{2, 2, 2}, dim{4, 2, 3}},
		{dim{1, 1, 1}, dim{32, 32, 1}}, // the column-reduction shape
		{dim{5, 1, 1}, dim{33, 1, 1}},  // a partial warp
	} {
		tpb := int(c.block[0] * c.block[1] * c.block[2])
		nb := int(c.grid[0] * c.grid[1] * c.grid[2])
		out, dims := l.alloc(t, 4*6*tpb*nb), l.alloc(t, 4*6)
		l.mustLaunch(t, "emu_test_coords", c.grid, c.block, out, dims)
		got := make([]int32, 6*tpb*nb)
		download(t, l, got, out)
		var gd [6]int32
		download(t, l, gd[:], dims)
		if gd != [6]int32{int32(c.block[0]), int32(c.block[1]), int32(c.block[2]), int32(c.grid[0]), int32(c.grid[1]), int32(c.grid[2])} {
			t.Errorf("grid %v block %v: blockDim, gridDim %v", c.grid, c.block, gd)
		}
		i := 0
		for bz := range int32(c.grid[2]) {
			for by := range int32(c.grid[1]) {
				for bx := range int32(c.grid[0]) {
					for tz := range int32(c.block[2]) {
						for ty := range int32(c.block[1]) {
							for tx := range int32(c.block[0]) {
								want := [6]int32{tx, ty, tz, bx, by, bz}
								if [6]int32(got[6*i:6*i+6]) != want {
									t.Fatalf("grid %v block %v: slot %d has %v, want %v", c.grid, c.block, i, got[6*i:6*i+6], want)
								}
								i++
							}
						}
					}
				}
			}
		}
	}
}

// The kernels' float16 / bfloat16 conversions are package half's, bit for
// bit: every 16-bit pattern to float32, and many float32s to 16 bits.
func TestHalfConversions(t *testing.T) {
	l := setup(t)
	const n16 = 1 << 16
	bits := make([]uint16, n16)
	for i := range bits {
		bits[i] = uint16(i)
	}
	// float32 inputs: every float16 and bfloat16 value, the midpoints
	// between neighbours and their next floats (rounding ties), extremes,
	// and random bit patterns (NaNs with payloads included).
	var fs []float32
	for i := range n16 {
		for _, f := range []float32{half.F16ToF32(uint16(i)), half.BF16ToF32(uint16(i))} {
			b := math.Float32bits(f)
			fs = append(fs, f, math.Float32frombits(b+0x1000), math.Float32frombits(b+0x0fff), math.Float32frombits(b+0x1001),
				math.Float32frombits(b+0x8000), math.Float32frombits(b+0x7fff))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1 << 19 {
		fs = append(fs, math.Float32frombits(rng.Uint32()))
	}
	fs = append(fs, float32(math.Inf(1)), float32(math.Inf(-1)), 65504, 65520, 65519.998, -65520, 1e-8, -6e-8, 3e-8,
		math.Float32frombits(0x7f800001), math.Float32frombits(0xff812345), math.Float32frombits(0x7fffffff))
	n := len(fs)

	dBits := upload(t, l, bits)
	dF := upload(t, l, fs)
	dOut32 := l.alloc(t, 4*n16)
	dOut16 := l.alloc(t, 2*n)
	got32 := make([]float32, n16)
	got16 := make([]uint16, n)
	grid, block := d1(64), d1(256)

	check32 := func(name string, ref func(uint16) float32) {
		download(t, l, got32, dOut32)
		bad := 0
		for i, g := range got32 {
			if w := ref(uint16(i)); math.Float32bits(g) != math.Float32bits(w) {
				if bad++; bad < 5 {
					t.Errorf("%s(%#04x) = %#08x, package half says %#08x", name, i, math.Float32bits(g), math.Float32bits(w))
				}
			}
		}
	}
	check16 := func(name string, ref func(float32) uint16) {
		download(t, l, got16, dOut16)
		bad := 0
		for i, g := range got16 {
			if w := ref(fs[i]); g != w {
				if bad++; bad < 5 {
					t.Errorf("%s(%#08x) = %#04x, package half says %#04x", name, math.Float32bits(fs[i]), g, w)
				}
			}
		}
	}
	l.mustLaunch(t, "emu_test_f16_to_f32", grid, block, dOut32, dBits, int64(n16))
	check32("__half2float", half.F16ToF32)
	l.mustLaunch(t, "emu_test_bf16_to_f32", grid, block, dOut32, dBits, int64(n16))
	check32("__bfloat162float", half.BF16ToF32)
	l.mustLaunch(t, "emu_test_f32_to_f16", grid, block, dOut16, dF, int64(n))
	check16("__float2half_rn", half.F32ToF16)
	l.mustLaunch(t, "emu_test_f32_to_bf16", grid, block, dOut16, dF, int64(n))
	check16("__float2bfloat16_rn", half.F32ToBF16)
}

// Kernels made by macros and __launch_bounds__ through a macro are found.
func TestScan(t *testing.T) {
	openLibs(t) // skips without g++
	ks, err := Scan(testKernelsCU)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, k := range ks {
		got[k.Name] = k.LaunchBounds
	}
	for name, bounds := range map[string]string{"emu_test_fill_f32": "", "emu_test_fill_i32": "", "emu_test_bounded": "128",
		"emu_test_block_sum": "1024", "emu_test_axpy": ""} {
		if b, ok := got[name]; !ok || b != bounds {
			t.Errorf("%s: found %v, launch bounds %q; want %q", name, ok, b, bounds)
		}
	}
	if len(ks) != 21 {
		t.Errorf("%d kernels found, want 21: %v", len(ks), ks)
	}
	l := setup(t)
	p := l.alloc(t, 4*100)
	l.mustLaunch(t, "emu_test_fill_i32", d1(2), d1(32), p, int32(-7), int64(100))
	got32 := make([]int32, 100)
	download(t, l, got32, p)
	if got32[0] != -7 || got32[99] != -7 {
		t.Errorf("fill: %v", got32)
	}
}

// The timing targets (printed, not asserted: this machine's speed is not
// the emulator's business): 64 blocks of 256 threads with barriers, and a
// kernel without barriers against the same work done by one thread.
func TestTiming(t *testing.T) {
	l := setup(t)
	const blocks, threads = 64, 256
	x := make([]float32, blocks*threads)
	for i := range x {
		x[i] = float32(i % 7)
	}
	dx := upload(t, l, x)
	out := l.alloc(t, 4*blocks)
	timeIt := func(f func()) time.Duration {
		best := time.Duration(math.MaxInt64)
		for range 5 {
			start := time.Now()
			f()
			best = min(best, time.Since(start))
		}
		return best
	}
	s0 := l.stats(t)
	bar := timeIt(func() { l.mustLaunch(t, "emu_test_barriers", d1(blocks), d1(threads), out, dx) })
	s1 := l.stats(t)
	got := make([]float32, blocks)
	download(t, l, got, out)
	for b := range blocks {
		var want float32
		for _, v := range x[b*threads : (b+1)*threads] {
			want += v
		}
		if got[b] != want {
			t.Fatalf("block %d: %v, want %v", b, got[b], want)
		}
	}
	const n = 1 << 20
	y := l.alloc(t, 4*n)
	xs := l.alloc(t, 4*n)
	l.must(t, "cuMemsetD32Async", y, 0, n, 0)
	l.must(t, "cuMemsetD32Async", xs, uintptr(math.Float32bits(1)), n, 0)
	many := timeIt(func() { l.mustLaunch(t, "emu_test_axpy", d1(blocks), d1(threads), y, float32(0.5), xs, int64(n)) })
	one := timeIt(func() { l.mustLaunch(t, "emu_test_axpy", d1(1), d1(1), y, float32(0.5), xs, int64(n)) })
	flat := timeIt(func() {
		l.mustLaunch(t, "emu_test_axpy", d1(n/threads), d1(threads), y, float32(0.5), xs, int64(n))
	})
	t.Logf("64 blocks x 256 threads, 4 __syncthreads + 5 shuffles each: %v a launch (%.0f ns a thread, %d fiber switches)",
		bar, float64(bar.Nanoseconds())/(blocks*threads), (s1[3]-s0[3])/5)
	t.Logf("axpy of 2^20 floats without barriers: 64 blocks x 256 threads %v, %d blocks x 256 threads (one element each) %v; one thread doing it all %v",
		many, n/threads, flat, one)
	t.Logf("so a thread costs about %.1f ns over running its work alone", float64((flat-one).Nanoseconds())/n)
	if os.Getenv("GORUN_EMU_TIMING_ASSERT") != "" && bar > 100*time.Millisecond {
		t.Errorf("the barrier launch took %v", bar)
	}
}

// kernels/cuda/kernels.cu compiles under the emulator, and every kernel it
// defines is launchable through the embedded PTX (checked in a process of
// its own: one emulated driver per process).
func TestKernelsCU(t *testing.T) {
	openLibs(t)
	cu, err := KernelsCU()
	if err != nil {
		t.Skipf("skipping: %v (not written yet?)", err)
	}
	dir, err := build("", []string{cu})
	if err != nil {
		t.Fatal(err)
	}
	// compute capability 9.0: the device loads both PTX files (on 7.0 the
	// sm_80 one is refused, as by the driver)
	out := runHelper(t, "kernelscu", envHelperDir+"="+dir, "GORUN_EMU_KERNELS_CU="+cu, "GORUN_CUDA_EMU_CC=9.0")
	t.Log(lastLines(out, 3))
}

func helperKernelsCU(t *testing.T) {
	cu := os.Getenv("GORUN_EMU_KERNELS_CU")
	ks, err := Scan(cu)
	if err != nil {
		t.Fatal(err)
	}
	l := setup(t)
	if n := l.call(t, "gorunEmuKernelCount"); n != len(ks) {
		t.Errorf("%d kernels registered, %d found in %s", n, len(ks), cu)
	}
	modules := map[string]uintptr{"no PTX": l.module}
	for _, sm := range []string{"sm70", "sm80"} {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(cu), "ptx", "kernels_"+sm+".ptx"))
		if err != nil || len(b) == 0 {
			t.Logf("no %s PTX to check against", sm)
			continue
		}
		var m uintptr
		img := append(b, 0)
		l.must(t, "cuModuleLoadData", uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&img[0])))
		modules[sm] = m
	}
	for what, m := range modules {
		for _, k := range ks {
			var f uintptr
			if r := l.call(t, "cuModuleGetFunction", uintptr(unsafe.Pointer(&f)), m, uintptr(unsafe.Pointer(cstr(k.Name)))); r != 0 {
				t.Errorf("%s (%s): %d: %s", k.Name, what, r, l.lastError(t))
			}
		}
	}
	t.Logf("%d kernels of %s registered and found through %d module(s)", len(ks), cu, len(modules))
}

func lastLines(s string, n int) string {
	lines := []string{}
	for _, line := range splitLines(s) {
		if line != "" {
			lines = append(lines, line)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	r := ""
	for _, l := range lines {
		r += l + "\n"
	}
	return r
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}
