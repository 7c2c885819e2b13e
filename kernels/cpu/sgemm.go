// Package cpu is the pure Go compute backend.
package cpu

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// SGEMM design (docs/sgemm.md has the long version):
//
// The driver follows the GotoBLAS/BLIS blocking. For a block of C of at most
// nc columns, the k dimension is cut into blocks of at most kc; for each
// k block a kc x nc panel of op(B) is packed into panels of NR columns
// (kc*NR floats each, contiguous), then for each block of at most mc rows an
// mc x kc panel of alpha*op(A) is packed into panels of MR rows. The
// macro-kernel walks the NR-column panels of B (one stays in L1 while it is
// used against every MR-row panel of A, which stay in L2) and calls the
// register-blocked micro-kernel for each MR x NR tile of C. Packing pads
// partial panels with zeros, so the micro-kernel always runs full tiles;
// partial tiles of C go through a small buffer. Several goroutines work on
// disjoint blocks of C (rows or columns, whichever duplicates less packing)
// and each packs its own panels, so they never wait on each other.

// microKernel computes one MR x NR tile: with acc = sum over p < kc of
// a[p*MR+i]*b[p*NR+j], it stores C[i*ldc+j] = acc when overwrite != 0 and
// C[i*ldc+j] = acc + beta*C[i*ldc+j] otherwise.
type microKernel func(kc int, a, b, c *float32, ldc int, beta float32, overwrite int)

// sgemmImpl is one micro-kernel with the block sizes that suit it.
type sgemmImpl struct {
	name   string
	mr, nr int // micro-tile
	kc     int // k block: the kc x NR B panel lives in L1
	mc     int // row block: the mc x kc A block lives in L2
	nc     int // column block: the kc x nc B block lives in L3
	fn     microKernel
	// asmPack: pack with the AVX-512 loops when the CPU has them (panels
	// of at most 32 floats); otherwise, and for the pure Go kernel, in Go.
	asmPack bool
}

// hasPackAVX512 is set by the amd64 init when the CPU has AVX-512F.
var hasPackAVX512 bool

var goImpl = &sgemmImpl{name: "go", mr: 4, nr: 4, kc: 256, mc: 128, nc: 4096, fn: sgemmKernelGo}

var (
	// sgemmImpls lists the implementations this CPU can run, best first;
	// the architecture files prepend theirs in init.
	sgemmImpls  = []*sgemmImpl{goImpl}
	activeImpl  atomic.Pointer[sgemmImpl]
	threadCount atomic.Int64 // 0: runtime.GOMAXPROCS(0)
)

// SetThreads sets how many goroutines Sgemm and SgemmStrided may use at most
// and returns the previous setting. n <= 0 means runtime.GOMAXPROCS(0), the
// default. Ranks of a distributed job that share one host should divide the
// cores among themselves (e.g. cores / local ranks each).
func SetThreads(n int) int {
	if n < 0 {
		n = 0
	}
	return int(threadCount.Swap(int64(n)))
}

// Threads reports how many goroutines Sgemm may use.
func Threads() int {
	if n := int(threadCount.Load()); n > 0 {
		return n
	}
	return runtime.GOMAXPROCS(0)
}

// EnvSgemmKernel names the environment variable that picks the SGEMM
// micro-kernel of a process's CPU backend by name (SetSgemmKernel; unset:
// the best the CPU runs), as OpenBLAS_CORETYPE does for OpenBLAS.
const EnvSgemmKernel = "GORUN_SGEMM_KERNEL"

// SgemmKernels lists the SGEMM micro-kernels this CPU can run, best first:
// a subset of "avx512" (AVX-512F), "avx2" (AVX2 and FMA) and "go" (pure Go,
// always present).
func SgemmKernels() []string {
	names := make([]string, len(sgemmImpls))
	for i, im := range sgemmImpls {
		names[i] = im.name
	}
	return names
}

// SgemmKernel reports the micro-kernel Sgemm uses now.
func SgemmKernel() string { return impl().name }

// SetSgemmKernel selects the micro-kernel by name ("auto" or "" for the best
// one this CPU supports; "go" forces the pure Go path, e.g. for tests) and
// returns the previous name. It fails for a kernel the CPU cannot run.
func SetSgemmKernel(name string) (string, error) {
	prev := impl().name
	if name == "" || name == "auto" {
		activeImpl.Store(sgemmImpls[0])
		return prev, nil
	}
	for _, im := range sgemmImpls {
		if im.name == name {
			activeImpl.Store(im)
			return prev, nil
		}
	}
	return prev, fmt.Errorf("sgemm: kernel %q not available on this CPU (have %v)", name, SgemmKernels())
}

func impl() *sgemmImpl {
	if im := activeImpl.Load(); im != nil {
		return im
	}
	return sgemmImpls[0]
}

// Below this many multiply-adds (m*n*k) a GEMM runs on the calling goroutine
// only: handing work to another core costs a few microseconds.
const parallelMinWork = 96 * 96 * 96

// Sgemm computes C = alpha*op(A)*op(B) + beta*C for row-major matrices, where
// op(X) is X or its transpose. op(A) is m x k, op(B) is k x n, C is m x n.
// lda, ldb, ldc are the row strides of A, B and C as stored. With beta == 0,
// C is overwritten (NaN or Inf in it do not propagate). It panics, naming the
// argument, if a stride or a slice is too short for the shape.
//
// Sgemm packs the operands into cache-sized panels and runs an assembly
// micro-kernel (AVX-512 or AVX2/FMA, chosen from the CPU's features) on up
// to Threads() goroutines. It does not allocate in the steady state.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	checkGemm("Sgemm", transA, transB, m, n, k, a, lda, b, ldb, c, ldc)
	nt := 1
	if m*n*k >= parallelMinWork {
		nt = Threads()
	}
	sgemm(impl(), nt, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// SgemmStrided runs batch independent Sgemm calls whose matrices are
// strideA, strideB, strideC elements apart: matrix i of A starts at
// a[i*strideA], and likewise for B and C. Small matrices are spread over the
// goroutines by batch; large ones are each computed on all of them.
func SgemmStrided(batch int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda, strideA int, b []float32, ldb, strideB int, beta float32, c []float32, ldc, strideC int) {
	if batch < 0 {
		panic(fmt.Sprintf("SgemmStrided: negative batch %d", batch))
	}
	if batch == 0 {
		return
	}
	if strideA < 0 || strideB < 0 || strideC < 0 {
		panic(fmt.Sprintf("SgemmStrided: negative stride (strideA %d, strideB %d, strideC %d)", strideA, strideB, strideC))
	}
	// Check every matrix before any work, so a bad call changes nothing.
	for i := 0; i < batch; i++ {
		checkGemm("SgemmStrided", transA, transB, m, n, k, tail(a, i*strideA, "a"), lda, tail(b, i*strideB, "b"), ldb, tail(c, i*strideC, "c"), ldc)
	}
	im := impl()
	nt := Threads()
	work := m * n * k
	if nt == 1 || batch == 1 || work*batch < parallelMinWork || work >= 4*parallelMinWork*nt {
		// One goroutine, or matrices large enough to split each one.
		per := 1
		if work >= parallelMinWork {
			per = nt
		}
		for i := 0; i < batch; i++ {
			sgemm(im, per, transA, transB, m, n, k, alpha, a[i*strideA:], lda, b[i*strideB:], ldb, beta, c[i*strideC:], ldc)
		}
		return
	}
	if nt > batch {
		nt = batch
	}
	j := getJob()
	j.set(im, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	j.strideA, j.strideB, j.strideC = strideA, strideB, strideC
	for t := 0; t < nt; t++ {
		j.tasks[t] = gemmTask{job: j, b0: t * batch / nt, b1: (t + 1) * batch / nt}
	}
	j.run(nt)
	putJob(j)
}

func tail(s []float32, off int, name string) []float32 {
	if off > len(s) {
		panic(fmt.Sprintf("SgemmStrided: %s has %d elements, a matrix starts at %d", name, len(s), off))
	}
	return s[off:]
}

func checkGemm(fn string, transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("%s: negative dimension m=%d n=%d k=%d", fn, m, n, k))
	}
	check := func(name string, s []float32, rows, cols, ld int) {
		if ld < max(cols, 1) {
			panic(fmt.Sprintf("%s: ld%s=%d < %d columns", fn, name, ld, cols))
		}
		if rows > 0 && cols > 0 && len(s) < (rows-1)*ld+cols {
			panic(fmt.Sprintf("%s: %s has %d elements, need %d for %dx%d with ld%s=%d", fn, name, len(s), (rows-1)*ld+cols, rows, cols, name, ld))
		}
	}
	if transA {
		check("a", a, k, m, lda)
	} else {
		check("a", a, m, k, lda)
	}
	if transB {
		check("b", b, n, k, ldb)
	} else {
		check("b", b, k, n, ldb)
	}
	check("c", c, m, n, ldc)
}

// sgemm computes one GEMM on nt goroutines (the caller included). The
// arguments have been checked.
func sgemm(im *sgemmImpl, nt int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	if alpha == 0 || k == 0 {
		scaleC(m, n, beta, c, ldc)
		return
	}
	j := getJob()
	j.set(im, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	nt = j.split(nt)
	if nt == 1 {
		buf := getBuf()
		j.block(buf, 0, m, 0, n, a, b, c)
		putBuf(buf)
	} else {
		j.run(nt)
	}
	putJob(j)
}

// scaleC sets C = beta*C, with beta == 0 clearing C.
func scaleC(m, n int, beta float32, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		switch beta {
		case 0:
			clear(row)
		case 1:
		default:
			for j := range row {
				row[j] *= beta
			}
		}
	}
}

const maxThreads = 256

// gemmJob holds one call's arguments and its per-goroutine tasks.
type gemmJob struct {
	im                        *sgemmImpl
	transA, transB            bool
	m, n, k                   int
	alpha, beta               float32
	a, b, c                   []float32
	lda, ldb, ldc             int
	strideA, strideB, strideC int
	wg                        sync.WaitGroup
	tasks                     [maxThreads]gemmTask
}

// gemmTask is one goroutine's share: a block of C, or a range of the batch
// when b1 > b0.
type gemmTask struct {
	job            *gemmJob
	i0, i1, j0, j1 int
	b0, b1         int
}

func (j *gemmJob) set(im *sgemmImpl, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	j.im, j.transA, j.transB = im, transA, transB
	j.m, j.n, j.k = m, n, k
	j.alpha, j.beta = alpha, beta
	j.a, j.b, j.c = a, b, c
	j.lda, j.ldb, j.ldc = lda, ldb, ldc
}

// split divides C among at most nt goroutines, into tm row blocks times tn
// column blocks, choosing the grid that packs the least: each goroutine packs
// its own rows of A and its own columns of B, so A is packed tn times and B
// tm times. It fills j.tasks and returns the number of tasks.
func (j *gemmJob) split(nt int) int {
	im := j.im
	rowPanels := (j.m + im.mr - 1) / im.mr
	colPanels := (j.n + im.nr - 1) / im.nr
	nt = min(nt, maxThreads, rowPanels*colPanels)
	if nt <= 1 {
		return 1
	}
	bestTm, bestCost := 0, 0.0
	for ; nt > 1 && bestTm == 0; nt-- {
		for tm := 1; tm <= nt; tm++ {
			tn := nt / tm
			if nt%tm != 0 || tm > rowPanels || tn > colPanels {
				continue
			}
			// Packed elements (A is packed tn times, B tm times) plus the
			// largest share of the multiply-adds, at ~32 per packed element.
			rowShare := float64((rowPanels+tm-1)/tm*im.mr) / float64(j.m)
			colShare := float64((colPanels+tn-1)/tn*im.nr) / float64(j.n)
			compute := rowShare * colShare * float64(j.m) * float64(j.n) / 32
			cost := float64(tn*j.m+tm*j.n) + compute
			if bestTm == 0 || cost < bestCost {
				bestTm, bestCost = tm, cost
			}
		}
	}
	if bestTm == 0 {
		return 1
	}
	nt++ // undo the loop's last decrement
	tm, tn := bestTm, nt/bestTm
	t := 0
	for r := 0; r < tm; r++ {
		i0 := r * rowPanels / tm * im.mr
		i1 := min((r+1)*rowPanels/tm*im.mr, j.m)
		for q := 0; q < tn; q++ {
			j0 := q * colPanels / tn * im.nr
			j1 := min((q+1)*colPanels/tn*im.nr, j.n)
			j.tasks[t] = gemmTask{job: j, i0: i0, i1: i1, j0: j0, j1: j1}
			t++
		}
	}
	return t
}

// run executes tasks[0:nt]: nt-1 of them on the worker goroutines and the
// first on the caller's.
func (j *gemmJob) run(nt int) {
	startWorkers(nt - 1)
	j.wg.Add(nt - 1)
	for t := 1; t < nt; t++ {
		workQueue <- &j.tasks[t]
	}
	j.tasks[0].do()
	j.wg.Wait()
}

func (t *gemmTask) do() {
	j := t.job
	buf := getBuf()
	if t.b1 > t.b0 {
		for i := t.b0; i < t.b1; i++ {
			j.block(buf, 0, j.m, 0, j.n, j.a[i*j.strideA:], j.b[i*j.strideB:], j.c[i*j.strideC:])
		}
	} else {
		j.block(buf, t.i0, t.i1, t.j0, t.j1, j.a, j.b, j.c)
	}
	putBuf(buf)
}

var (
	workQueue   = make(chan *gemmTask, maxThreads)
	workersMu   sync.Mutex
	workerCount int
)

// startWorkers makes sure at least n worker goroutines exist. They live for
// the life of the process, parked on workQueue when idle.
func startWorkers(n int) {
	workersMu.Lock()
	for workerCount < n {
		workerCount++
		go func() {
			for t := range workQueue {
				t.do()
				t.job.wg.Done()
			}
		}()
	}
	workersMu.Unlock()
}

var jobPool = sync.Pool{New: func() any { return new(gemmJob) }}

func getJob() *gemmJob { return jobPool.Get().(*gemmJob) }

func putJob(j *gemmJob) {
	j.a, j.b, j.c = nil, nil, nil
	jobPool.Put(j)
}

// packBuf holds one goroutine's packed panels, reused across calls.
type packBuf struct {
	a, b, tile []float32
}

var bufPool = sync.Pool{New: func() any { return new(packBuf) }}

func getBuf() *packBuf  { return bufPool.Get().(*packBuf) }
func putBuf(p *packBuf) { bufPool.Put(p) }

// aligned returns a slice of n floats starting on a 64-byte boundary,
// reusing s when it is large enough.
func aligned(s []float32, n int) []float32 {
	if cap(s) >= n {
		return s[:n]
	}
	raw := make([]float32, n+16)
	off := 0
	if r := uintptr(unsafe.Pointer(&raw[0])) & 63; r != 0 {
		off = int(64-r) / 4
	}
	return raw[off : off+n : off+n]
}

// block computes the block [i0,i1) x [j0,j1) of C for the matrices a, b, c
// (the job's shape, strides, alpha and beta).
func (j *gemmJob) block(buf *packBuf, i0, i1, j0, j1 int, a, b, c []float32) {
	im := j.im
	mr, nr := im.mr, im.nr
	k := j.k
	// Balanced block sizes: no nearly-empty last block.
	nk := (k + im.kc - 1) / im.kc
	kcb := (k + nk - 1) / nk
	rows := i1 - i0
	nm := (rows + im.mc - 1) / im.mc
	mcb := ((rows+nm-1)/nm + mr - 1) / mr * mr
	cols := j1 - j0
	nn := (cols + im.nc - 1) / im.nc
	ncb := ((cols+nn-1)/nn + nr - 1) / nr * nr

	buf.a = aligned(buf.a, mcb*kcb)
	buf.b = aligned(buf.b, ncb*kcb)
	buf.tile = aligned(buf.tile, mr*nr)
	asmA := im.asmPack && hasPackAVX512 && mr <= 32
	asmB := im.asmPack && hasPackAVX512 && nr <= 32
	for jc := j0; jc < j1; jc += ncb {
		nc := min(ncb, j1-jc)
		for pc := 0; pc < k; pc += kcb {
			kc := min(kcb, k-pc)
			beta, overwrite := j.beta, 0
			if pc > 0 {
				beta = 1
			} else if beta == 0 {
				overwrite = 1
			}
			if asmB {
				packBAsm(buf.b, nr, j.transB, b, j.ldb, pc, kc, jc, nc)
			} else {
				packB(buf.b, nr, j.transB, b, j.ldb, pc, kc, jc, nc)
			}
			for ic := i0; ic < i1; ic += mcb {
				mc := min(mcb, i1-ic)
				if asmA {
					packAAsm(buf.a, mr, j.transA, a, j.lda, ic, mc, pc, kc, j.alpha)
				} else {
					packA(buf.a, mr, j.transA, a, j.lda, ic, mc, pc, kc, j.alpha)
				}
				macroKernel(im, buf, kc, mc, nc, c[ic*j.ldc+jc:], j.ldc, beta, overwrite)
			}
		}
	}
}

// macroKernel multiplies the packed mc x kc block of A by the packed kc x nc
// block of B into C (c starts at the block's first element).
func macroKernel(im *sgemmImpl, buf *packBuf, kc, mc, nc int, c []float32, ldc int, beta float32, overwrite int) {
	mr, nr := im.mr, im.nr
	ap, bp, tile := buf.a, buf.b, buf.tile
	fn := im.fn
	for jr := 0; jr < nc; jr += nr {
		nrr := min(nr, nc-jr)
		bPanel := &bp[jr*kc]
		for ir := 0; ir < mc; ir += mr {
			mrr := min(mr, mc-ir)
			aPanel := &ap[ir*kc]
			off := ir*ldc + jr
			if mrr == mr && nrr == nr {
				fn(kc, aPanel, bPanel, &c[off], ldc, beta, overwrite)
				continue
			}
			// Partial tile: compute the full tile aside, keep its valid part.
			fn(kc, aPanel, bPanel, &tile[0], nr, 0, 1)
			for i := 0; i < mrr; i++ {
				dst := c[off+i*ldc : off+i*ldc+nrr]
				src := tile[i*nr : i*nr+nrr]
				if overwrite != 0 {
					copy(dst, src)
				} else {
					for q := range dst {
						dst[q] = src[q] + beta*dst[q]
					}
				}
			}
		}
	}
}

// packA packs rows [i0,i0+mc) and columns [p0,p0+kc) of alpha*op(A) into
// panels of mr rows: panel r holds, for each p < kc, the mr values of rows
// i0+r*mr.. at column p0+p, rows past mc set to zero.
func packA(dst []float32, mr int, trans bool, a []float32, lda, i0, mc, p0, kc int, alpha float32) {
	for ir := 0; ir < mc; ir += mr {
		mrr := min(mr, mc-ir)
		panel := dst[ir*kc : ir*kc+mr*kc]
		if trans {
			// op(A)[i][p] = a[p*lda+i]: each k step is a contiguous run.
			for p := 0; p < kc; p++ {
				src := a[(p0+p)*lda+i0+ir:]
				src = src[:mrr]
				d := panel[p*mr : p*mr+mr]
				for i, v := range src {
					d[i] = alpha * v
				}
				clear(d[mrr:])
			}
			continue
		}
		// op(A)[i][p] = a[i*lda+p]: transpose each row into the panel.
		for i := 0; i < mrr; i++ {
			src := a[(i0+ir+i)*lda+p0:]
			src = src[:kc]
			q := i
			for _, v := range src {
				panel[q] = alpha * v
				q += mr
			}
		}
		for i := mrr; i < mr; i++ {
			for p := 0; p < kc; p++ {
				panel[p*mr+i] = 0
			}
		}
	}
}

// packB packs rows [p0,p0+kc) and columns [j0,j0+nc) of op(B) into panels
// of nr columns: panel s holds, for each p < kc, the nr values of row p0+p
// at columns j0+s*nr.., columns past nc set to zero.
func packB(dst []float32, nr int, trans bool, b []float32, ldb, p0, kc, j0, nc int) {
	for jr := 0; jr < nc; jr += nr {
		nrr := min(nr, nc-jr)
		panel := dst[jr*kc : jr*kc+nr*kc]
		if !trans {
			// op(B)[p][j] = b[p*ldb+j]: contiguous rows.
			for p := 0; p < kc; p++ {
				src := b[(p0+p)*ldb+j0+jr:]
				d := panel[p*nr : p*nr+nr]
				copy(d, src[:nrr])
				clear(d[nrr:])
			}
			continue
		}
		// op(B)[p][j] = b[j*ldb+p]: transpose each stored row.
		for j := 0; j < nrr; j++ {
			src := b[(j0+jr+j)*ldb+p0:]
			src = src[:kc]
			q := j
			for _, v := range src {
				panel[q] = v
				q += nr
			}
		}
		for j := nrr; j < nr; j++ {
			for p := 0; p < kc; p++ {
				panel[p*nr+j] = 0
			}
		}
	}
}

// laneMasks returns the AVX-512 lane masks of the first n of 32 lanes.
func laneMasks(n int) (lo, hi int) {
	lo = 1<<min(n, 16) - 1
	hi = 1<<max(n-16, 0) - 1
	return lo, hi
}

// packAAsm is packA with the AVX-512 loops (mr <= 32).
func packAAsm(dst []float32, mr int, trans bool, a []float32, lda, i0, mc, p0, kc int, alpha float32) {
	sm1, sm2 := laneMasks(mr)
	for ir := 0; ir < mc; ir += mr {
		mrr := min(mr, mc-ir)
		lm1, lm2 := laneMasks(mrr)
		panel := dst[ir*kc : ir*kc+mr*kc]
		if trans {
			// Row p0+p of the stored A holds op(A)'s column: contiguous.
			src := a[p0*lda+i0+ir:]
			_ = src[(kc-1)*lda+mrr-1]
			packCopyAVX512(&panel[0], &src[0], kc, lda, alpha, lm1, lm2, sm1, sm2)
		} else {
			src := a[(i0+ir)*lda+p0:]
			_ = src[(mrr-1)*lda+kc-1]
			packTrans16(panel, src, lda, mrr, kc, mr, alpha)
		}
	}
}

// packBAsm is packB with the AVX-512 loops (nr <= 32).
func packBAsm(dst []float32, nr int, trans bool, b []float32, ldb, p0, kc, j0, nc int) {
	sm1, sm2 := laneMasks(nr)
	for jr := 0; jr < nc; jr += nr {
		nrr := min(nr, nc-jr)
		lm1, lm2 := laneMasks(nrr)
		panel := dst[jr*kc : jr*kc+nr*kc]
		if !trans {
			src := b[p0*ldb+j0+jr:]
			_ = src[(kc-1)*ldb+nrr-1]
			packCopyAVX512(&panel[0], &src[0], kc, ldb, 1, lm1, lm2, sm1, sm2)
		} else {
			src := b[(j0+jr)*ldb+p0:]
			_ = src[(nrr-1)*ldb+kc-1]
			packTrans16(panel, src, ldb, nrr, kc, nr, 1)
		}
	}
}

// packTrans16 packs rows [0,rows) of the stored matrix src (row stride ld),
// columns [0,kc), transposed into a panel of width w <= 32: panel[p*w+i] =
// alpha*src[i*ld+p], lanes rows..w-1 zero. It runs the AVX-512 16 x 16
// transpose once per group of 16 lanes.
func packTrans16(panel, src []float32, ld, rows, kc, w int, alpha float32) {
	var offs [16]int
	for g := 0; g < w; g += 16 {
		n := min(16, rows-g) // rows in this group; <= 0: all lanes zero
		first := min(g, rows-1)
		for i := range offs {
			offs[i] = (min(g+i, rows-1) - first) * ld * 4
		}
		rowMask := 0
		if n > 0 {
			rowMask = 1<<n - 1
		}
		packTransAVX512(&panel[g], &src[first*ld], &offs, kc, w, alpha, rowMask, 1<<min(16, w-g)-1)
	}
}
