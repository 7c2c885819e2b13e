package bench

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// sgemmShape is one GEMM of the Transformer (or a square reference shape),
// run batch times with strided matrices when batch > 1.
type sgemmShape struct {
	name           string
	batch          int
	transA, transB bool
	m, n, k        int
}

// 1024 tokens = 32 sentences x 32 tokens, d_model 512, FFN 2048, 8 heads of
// 64, vocabulary 32768 (base preset).
var sgemmShapes = []sgemmShape{
	{"sq512", 1, false, false, 512, 512, 512},
	{"sq1024", 1, false, false, 1024, 1024, 1024},
	{"sq2048", 1, false, false, 2048, 2048, 2048},
	{"proj_XW_1024x512x512", 1, false, false, 1024, 512, 512},
	{"ffn1_XW_1024x2048x512", 1, false, false, 1024, 2048, 512},
	{"ffn2_XW_1024x512x2048", 1, false, false, 1024, 512, 2048},
	{"dX_dYWt_1024x512x2048", 1, false, true, 1024, 512, 2048},
	{"dW_XtdY_512x2048x1024", 1, true, false, 512, 2048, 1024},
	{"attn_QKt_256x32x32x64", 256, false, true, 32, 32, 64},
	{"attn_PV_256x32x64x32", 256, false, false, 32, 64, 32},
	{"logits_HEt_1024x32768x512", 1, false, true, 1024, 32768, 512},
}

func stored(trans bool, r, c int) (int, int) {
	if trans {
		return c, r
	}
	return r, c
}

func randFloats(n int) []float32 {
	r := rand.New(rand.NewPCG(1, uint64(n)))
	s := make([]float32, n)
	for i := range s {
		s[i] = r.Float32() - 0.5
	}
	return s
}

func tr(t bool) blas.Transpose {
	if t {
		return blas.Trans
	}
	return blas.NoTrans
}

// BenchmarkSgemm runs each shape with gorun's Sgemm/SgemmStrided and with
// gonum's Sgemm (blas/gonum, pure Go + SSE) in the same process, reporting
// GFLOP/s (2*m*n*k*batch per op).
func BenchmarkSgemm(b *testing.B) {
	for _, s := range sgemmShapes {
		ar, ac := stored(s.transA, s.m, s.k)
		br, bc := stored(s.transB, s.k, s.n)
		sa, sb, sc := ar*ac, br*bc, s.m*s.n
		a, bb, c := randFloats(s.batch*sa), randFloats(s.batch*sb), make([]float32, s.batch*sc)
		flops := 2 * float64(s.m) * float64(s.n) * float64(s.k) * float64(s.batch)
		report := func(b *testing.B) {
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			b.ReportMetric(0, "ns/op") // GFLOP/s is the figure of merit
		}
		b.Run(s.name+"/impl=gorun", func(b *testing.B) {
			for b.Loop() {
				if s.batch == 1 {
					cpu.Sgemm(s.transA, s.transB, s.m, s.n, s.k, 1, a, ac, bb, bc, 0, c, s.n)
				} else {
					cpu.SgemmStrided(s.batch, s.transA, s.transB, s.m, s.n, s.k, 1, a, ac, sa, bb, bc, sb, 0, c, s.n, sc)
				}
			}
			report(b)
		})
		b.Run(s.name+"/impl=gonum", func(b *testing.B) {
			impl := gonum.Implementation{}
			for b.Loop() {
				for i := 0; i < s.batch; i++ {
					impl.Sgemm(tr(s.transA), tr(s.transB), s.m, s.n, s.k, 1, a[i*sa:], ac, bb[i*sb:], bc, 0, c[i*sc:], s.n)
				}
			}
			report(b)
		})
	}
}

// BenchmarkSgemmKernels compares the micro-kernels this CPU can run on one
// Transformer shape, on all threads and on one.
func BenchmarkSgemmKernels(b *testing.B) {
	const m, n, k = 1024, 512, 512
	a, bb, c := randFloats(m*k), randFloats(k*n), make([]float32, m*n)
	for _, name := range cpu.SgemmKernels() {
		for _, threads := range []int{cpu.Threads(), 1} {
			b.Run(fmt.Sprintf("kernel=%s/threads=%d", name, threads), func(b *testing.B) {
				prevK, err := cpu.SetSgemmKernel(name)
				if err != nil {
					b.Fatal(err)
				}
				prevT := cpu.SetThreads(threads)
				defer func() {
					cpu.SetSgemmKernel(prevK)
					cpu.SetThreads(prevT)
				}()
				for b.Loop() {
					cpu.Sgemm(false, false, m, n, k, 1, a, k, bb, n, 0, c, n)
				}
				b.ReportMetric(2*m*n*k*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
