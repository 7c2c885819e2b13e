package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
)

// brokenOrtho is the CPU backend with Orthonormalize replaced by a float32
// host version that gets one thing wrong.
type brokenOrtho struct {
	*cpu.Backend
	noProjection bool // normalize each column on its own
	powerSGD     bool // PowerSGD's literal code: project on the normalized column, no drop rule
	noDrop       bool // exact projections, but dependent columns are normalized too
	noEps        bool // divide by the norm alone
	firstOnly    bool // only the first matrix of a batch
	acc32        bool // sums in float32
	reverse      bool // columns right to left
}

func (b brokenOrtho) Orthonormalize(pt kernels.Tensor, eps float32) {
	rows, cols := pt.Dim(-2), pt.Dim(-1)
	m := rows * cols
	for s := 0; s < len(pt.F32)/m; s++ {
		if b.firstOnly && s > 0 {
			return
		}
		x := pt.F32[s*m : (s+1)*m]
		at := func(r, k int) *float32 {
			if b.reverse {
				k = cols - 1 - k
			}
			return &x[r*cols+k]
		}
		dot := func(j, k int) float64 {
			var s64 float64
			var s32 float32
			for r := 0; r < rows; r++ {
				s64 += float64(*at(r, j)) * float64(*at(r, k))
				s32 += *at(r, j) * *at(r, k)
			}
			if b.acc32 {
				return float64(s32)
			}
			return s64
		}
		in := make([]float64, cols)
		for k := range in {
			in[k] = math.Sqrt(dot(k, k))
		}
		for j := 0; j < cols; j++ {
			nrm := math.Sqrt(dot(j, j))
			drop := nrm <= kernels.OrthoDropTol*in[j] && !b.noDrop && !b.powerSGD
			inv := 1 / (nrm + float64(eps))
			if b.noEps {
				inv = 1 / nrm
			}
			if drop {
				inv = 0
			}
			if b.powerSGD {
				for r := 0; r < rows; r++ {
					*at(r, j) = float32(float64(*at(r, j)) * inv)
				}
			}
			for k := j + 1; k < cols && !b.noProjection && !drop; k++ {
				d := dot(j, k)
				if !b.powerSGD {
					d /= nrm * nrm
				}
				for r := 0; r < rows; r++ {
					*at(r, k) = float32(float64(*at(r, k)) - d*float64(*at(r, j)))
				}
			}
			if !b.powerSGD {
				for r := 0; r < rows; r++ {
					*at(r, j) = float32(float64(*at(r, j)) * inv)
				}
			}
		}
	}
}

// recorder collects a test's failures instead of failing it.
type recorder struct {
	testing.TB
	fails []string
}

func (r *recorder) Helper()             {}
func (r *recorder) Logf(string, ...any) {}
func (r *recorder) Errorf(format string, a ...any) {
	r.fails = append(r.fails, fmt.Sprintf(format, a...))
}

func runOrtho(t *testing.T, be kernels.Backend) []string {
	rec := &recorder{TB: t}
	e := &env{t: rec, be: be, tol: FP32(), op: "Orthonormalize", rng: rand.New(rand.NewPCG(0x6b65726e, seedOf("Orthonormalize")))}
	testOrthonormalize(e)
	return rec.fails
}

// The table catches an Orthonormalize that gets any one thing wrong, and
// passes the host version that gets nothing wrong (the mutants' base).
func TestOrthonormalizeCatchesBrokenOps(t *testing.T) {
	if fails := runOrtho(t, brokenOrtho{Backend: cpu.New()}); len(fails) > 0 {
		t.Fatalf("the correct host version fails:\n%s", strings.Join(fails, "\n"))
	}
	for _, c := range []struct {
		name string
		be   brokenOrtho
	}{
		{"no projection", brokenOrtho{noProjection: true}},
		{"PowerSGD's literal code", brokenOrtho{powerSGD: true}},
		{"no drop rule", brokenOrtho{noDrop: true}},
		{"no eps", brokenOrtho{noEps: true}},
		{"first matrix only", brokenOrtho{firstOnly: true}},
		{"right to left", brokenOrtho{reverse: true}},
		{"float32 sums", brokenOrtho{acc32: true}},
	} {
		c.be.Backend = cpu.New()
		fails := runOrtho(t, c.be)
		if len(fails) == 0 {
			t.Errorf("%s: the table passes it", c.name)
			continue
		}
		first := fails[0]
		if i := strings.IndexByte(first, '\n'); i > 0 {
			first = first[:i]
		}
		t.Logf("%s: %d cases fail, first: %s", c.name, len(fails), first)
	}
}
