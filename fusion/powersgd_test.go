package fusion

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/fusion/fusiontest"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/rank/ranktest"
)

// psgdParams: three matrices PowerSGD compresses at rank 2 (12x10,
// 9x16, 20x8), a 4x4 matrix too small to (16 <= 2*(4+4)*2) and vectors,
// cut into several buckets by a 512-byte cap.
func psgdParams() []ParamInfo {
	return []ParamInfo{
		{Name: "emb", Len: 160, Rows: 20, Cols: 8},
		{Name: "l0/w", Len: 120, Rows: 12, Cols: 10},
		{Name: "l0/b", Len: 10},
		{Name: "l0/small", Len: 16, Rows: 4, Cols: 4},
		{Name: "l1/w", Len: 144, Rows: 9, Cols: 16},
		{Name: "l1/b", Len: 16},
		{Name: "ln", Len: 5},
	}
}

// psgdGrad is rank r's gradient of step s: normal values in the matrices
// compressed at rank 2, multiples of 1/16 elsewhere (their sums are exact
// in any order).
func psgdGrad(ps []ParamInfo, r, s int) []float32 {
	rng := rand.New(rand.NewPCG(uint64(r)+1, uint64(s)+100))
	out := make([]float32, bkTotalLen(ps))
	o := 0
	for p, pi := range ps {
		for i := 0; i < pi.Len; i++ {
			if pi.Rows*pi.Cols > 2*(pi.Rows+pi.Cols)*2 {
				out[o+i] = float32(rng.NormFloat64())
			} else {
				out[o+i] = bkExactVal(r, p, i+s)
			}
		}
		o += pi.Len
	}
	return out
}

// psgdJob runs steps steps of np ranks with PowerSGD in mode (flat or
// device), rank r's gradient of step s being grad(r, s), and returns each
// rank's reduced gradients and PowerSGD state after every step.
type psgdResult struct {
	out    [][][]float32 // [step][rank]
	errs   [][][]float32 // error feedback after the step
	q      [][][]float32
	stats  [][]StepStats
	layout []Bucket
}

func psgdJob(t *testing.T, mode gradMode, np, steps int, ps []ParamInfo, cfg BucketConfig, grad func(r, s int) []float32) psgdResult {
	return psgdJobScaled(t, mode, np, steps, ps, cfg, 1, grad)
}

// psgdJobScaled is psgdJob with SetScale(scale) on every rank.
func psgdJobScaled(t *testing.T, mode gradMode, np, steps int, ps []ParamInfo, cfg BucketConfig, scale float32, grad func(r, s int) []float32) psgdResult {
	t.Helper()
	res := psgdResult{out: make([][][]float32, steps), errs: make([][][]float32, steps), q: make([][][]float32, steps), stats: make([][]StepStats, steps)}
	for s := range res.out {
		res.out[s], res.errs[s], res.q[s], res.stats[s] = make([][]float32, np), make([][]float32, np), make([][]float32, np), make([]StepStats, np)
	}
	ts := ranktest.InMemory(np, 1)
	defer ranktest.CloseAll(ts)
	errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
		cfg := cfg
		ps := cfg.PowerSGD
		if ps == nil {
			return errors.New("no PowerSGD")
		}
		pcfg := *ps
		if mode == modeFlat {
			be := cpu.New()
			be.Threads = 2
			pcfg.Backend = be
		}
		cfg.PowerSGD = &pcfg
		b, err := NewBucketer(c, psgdParams(), cfg)
		if err != nil {
			return err
		}
		defer b.Close()
		if r == 0 {
			res.layout = b.Buckets()
		}
		flat := make([]float32, bkTotalLen(psgdParams()))
		dev, err := attachGrads(b, psgdParams(), flat, mode, uint64(r)+7)
		if err != nil {
			return err
		}
		b.SetScale(scale)
		for s := 0; s < steps; s++ {
			copy(flat, grad(r, s))
			for i := len(psgdParams()) - 1; i >= 0; i-- {
				b.MarkReady(i)
			}
			st, err := b.Wait()
			if err != nil {
				return err
			}
			res.stats[s][r] = st
			res.out[s][r] = append([]float32(nil), flat...)
			e, q, err := b.PowerSGDState()
			if err != nil {
				return err
			}
			res.errs[s][r], res.q[s][r] = e, q
		}
		if dev != nil {
			if err := dev.Err(); err != nil {
				return fmt.Errorf("HostStaging contract: %w", err)
			}
		}
		return nil
	})
	bkNoErrs(t, errs)
	return res
}

// orth64 orthonormalizes the columns of the rows x cols matrix x as
// kernels.Backend.Orthonormalize documents (modified Gram-Schmidt, eps
// added to the norm, dependent columns zeroed), in float64.
func orth64(x []float64, rows, cols int, eps float64) {
	norm := func(k int) float64 {
		var s float64
		for r := 0; r < rows; r++ {
			s += x[r*cols+k] * x[r*cols+k]
		}
		return math.Sqrt(s)
	}
	in := make([]float64, cols)
	for k := range in {
		in[k] = norm(k)
	}
	for j := 0; j < cols; j++ {
		nrm := norm(j)
		if nrm <= kernels.OrthoDropTol*in[j] {
			for r := 0; r < rows; r++ {
				x[r*cols+j] = 0
			}
			continue
		}
		for k := j + 1; k < cols; k++ {
			var d float64
			for r := 0; r < rows; r++ {
				d += x[r*cols+j] * x[r*cols+k]
			}
			d /= nrm * nrm
			for r := 0; r < rows; r++ {
				x[r*cols+k] -= d * x[r*cols+j]
			}
		}
		for r := 0; r < rows; r++ {
			x[r*cols+j] /= nrm + eps
		}
	}
}

// psgdRef is PowerSGD in float64 for one matrix on np ranks: its state
// (errors per rank, Q) and one step.
type psgdRef struct {
	n, m, r, np int
	e           [][]float64
	q           []float64
}

func newPSGDRef(n, m, r, np int, q0 []float32) *psgdRef {
	f := &psgdRef{n: n, m: m, r: r, np: np, q: make([]float64, len(q0)), e: make([][]float64, np)}
	for i, v := range q0 {
		f.q[i] = float64(v)
	}
	for k := range f.e {
		f.e[k] = make([]float64, n*m)
	}
	return f
}

// step takes the ranks' gradients and returns the reduced (summed)
// gradient, updating the errors and Q.
func (f *psgdRef) step(g [][]float32) []float64 {
	n, m, r := f.n, f.m, f.r
	M := make([][]float64, f.np)
	for k := range M {
		M[k] = make([]float64, n*m)
		for i := range M[k] {
			M[k][i] = float64(g[k][i]) + f.e[k][i]
		}
	}
	qh := append([]float64(nil), f.q...)
	orth64(qh, m, r, powerSGDEps)
	P := make([]float64, n*r)
	for k := range M {
		for i := 0; i < n; i++ {
			for c := 0; c < r; c++ {
				var s float64
				for j := 0; j < m; j++ {
					s += M[k][i*m+j] * qh[j*r+c]
				}
				P[i*r+c] += s
			}
		}
	}
	orth64(P, n, r, powerSGDEps)
	Q := make([]float64, m*r)
	for k := range M {
		for j := 0; j < m; j++ {
			for c := 0; c < r; c++ {
				var s float64
				for i := 0; i < n; i++ {
					s += M[k][i*m+j] * P[i*r+c]
				}
				Q[j*r+c] += s
			}
		}
	}
	G := make([]float64, n*m)
	for i := 0; i < n; i++ {
		for j := 0; j < m; j++ {
			var s float64
			for c := 0; c < r; c++ {
				s += P[i*r+c] * Q[j*r+c]
			}
			G[i*m+j] = s
		}
	}
	for k := range M {
		for i := range M[k] {
			f.e[k][i] = M[k][i] - G[i]/float64(f.np)
		}
	}
	f.q = Q
	return G
}

// paramOffsets returns each parameter's offset in the flat buffer.
func paramOffsets(ps []ParamInfo) []int {
	out := make([]int, len(ps))
	o := 0
	for i, p := range ps {
		out[i] = o
		o += p.Len
	}
	return out
}

// The compressed allreduce against PowerSGD computed in float64 from the
// same inputs (the initial Q drawn as the Bucketer draws it), over three
// steps (so warm start and error feedback count), on host gradients and
// through the HostStaging double, on 2 and 3 ranks, summed and (2 ranks)
// averaged; the errors each rank keeps are M - P Qᵀ/W. The other
// gradients are summed (averaged) exactly. Both modes give the same bits.
func TestPowerSGDMatchesReference(t *testing.T) {
	ps := psgdParams()
	off := paramOffsets(ps)
	const steps = 3
	for _, tc := range []struct {
		np  int
		avg bool
	}{{2, false}, {3, false}, {2, true}} {
		np := tc.np
		var flatOut psgdResult
		for _, mode := range []gradMode{modeFlat, modeDevice} {
			t.Run(fmt.Sprintf("np%d/avg=%v/%v", np, tc.avg, mode), func(t *testing.T) {
				cfg := BucketConfig{CapBytes: 512, FirstCapBytes: 256, Average: tc.avg, PowerSGD: &PowerSGD{Rank: 2, Seed: 5}}
				div := 1.0 // the reference's sums become means
				if tc.avg {
					div = float64(np)
				}
				res := psgdJob(t, mode, np, steps, ps, cfg, func(r, s int) []float32 { return psgdGrad(ps, r, s) })
				if len(res.layout) < 3 {
					t.Fatalf("%d buckets; want several", len(res.layout))
				}
				c, err := newCompressor(ps, off, *cfg.PowerSGD)
				if err != nil {
					t.Fatal(err)
				}
				if len(c.mats) != 3 {
					t.Fatalf("%d matrices compressed, want 3 (not the 4x4 one)", len(c.mats))
				}
				q0 := make([]float32, c.nQ)
				c.initQ(q0)
				refs := make([]*psgdRef, len(c.mats))
				for j, mt := range c.mats {
					refs[j] = newPSGDRef(mt.n, mt.m, mt.r, np, q0[mt.qOff:mt.qOff+mt.m*mt.r])
				}
				for s := 0; s < steps; s++ {
					if st := res.stats[s][0].PowerSGD; !st.Compressed || st.Matrices != 3 || st.Bytes != int64(4*(c.nP+c.nQ)) || st.FP16Bytes != int64(2*c.nE) {
						t.Fatalf("step %d: stats %+v", s, st)
					}
					grads := make([][]float32, np)
					for r := range grads {
						grads[r] = psgdGrad(ps, r, s)
					}
					for j, mt := range c.mats {
						gs := make([][]float32, np)
						for r := range gs {
							gs[r] = grads[r][mt.off : mt.off+mt.n*mt.m]
						}
						want := refs[j].step(gs)
						for i := range want {
							want[i] /= div
						}
						var scale float64
						for _, v := range want {
							scale = math.Max(scale, math.Abs(v))
						}
						tol := 2e-4 * scale * float64(s+1)
						for r := 0; r < np; r++ {
							got := res.out[s][r][mt.off : mt.off+mt.n*mt.m]
							for i, w := range want {
								if d := math.Abs(float64(got[i]) - w); d > tol || math.IsNaN(float64(got[i])) {
									t.Fatalf("step %d rank %d %s[%d]: %g, float64 reference %g (tolerance %g)", s, r, ps[mt.param].Name, i, got[i], w, tol)
								}
							}
							e := res.errs[s][r][mt.eOff : mt.eOff+mt.n*mt.m]
							for i, w := range refs[j].e[r] {
								if d := math.Abs(float64(e[i]) - w); d > tol {
									t.Fatalf("step %d rank %d %s: error[%d] %g, reference M - G/W = %g", s, r, ps[mt.param].Name, i, e[i], w)
								}
							}
							if r > 0 && fmt.Sprint(res.out[s][r][mt.off:mt.off+mt.n*mt.m]) != fmt.Sprint(res.out[s][0][mt.off:mt.off+mt.n*mt.m]) {
								t.Fatalf("step %d: ranks 0 and %d differ on %s", s, r, ps[mt.param].Name)
							}
						}
					}
					// the uncompressed gradients: exact sums
					for p, pi := range ps {
						if c.of[p] >= 0 {
							continue
						}
						for i := 0; i < pi.Len; i++ {
							var want float32
							for r := 0; r < np; r++ {
								want += grads[r][off[p]+i]
							}
							want /= float32(div)
							for r := 0; r < np; r++ {
								if got := res.out[s][r][off[p]+i]; got != want {
									t.Fatalf("step %d rank %d %s[%d] = %g, want the sum %g", s, r, pi.Name, i, got, want)
								}
							}
						}
					}
				}
				if mode == modeFlat {
					flatOut = res
				} else if fmt.Sprint(flatOut.out) != fmt.Sprint(res.out) || fmt.Sprint(flatOut.errs) != fmt.Sprint(res.errs) {
					t.Fatal("host and device gradients give different bits")
				}
			})
		}
	}
}

// With R >= min(n, m) the approximation is exact: every matrix comes out
// as the plain sum, to float32 rounding. The errors are M - G/W, each
// rank's deviation from the mean, which add up to zero.
func TestPowerSGDFullRankExact(t *testing.T) {
	ps := psgdParams()
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) {
			// MinRate: compress every matrix, even at full rank
			cfg := BucketConfig{CapBytes: 512, FirstCapBytes: 256, PowerSGD: &PowerSGD{Rank: 16, MinRate: 1e-9}}
			res := psgdJob(t, mode, 2, 2, ps, cfg, func(r, s int) []float32 { return psgdGrad(ps, r, s) })
			c, _ := newCompressor(ps, paramOffsets(ps), *cfg.PowerSGD)
			if len(c.mats) != 4 {
				t.Fatalf("%d matrices compressed, want 4", len(c.mats))
			}
			for s := 0; s < 2; s++ {
				g0, g1 := psgdGrad(ps, 0, s), psgdGrad(ps, 1, s)
				for _, mt := range c.mats {
					if mt.r != min(mt.n, mt.m) {
						t.Fatalf("%s: rank %d", ps[mt.param].Name, mt.r)
					}
					for i := mt.off; i < mt.off+mt.n*mt.m; i++ {
						want := float64(g0[i]) + float64(g1[i])
						if d := math.Abs(float64(res.out[s][0][i]) - want); d > 1e-5*(1+math.Abs(want)) {
							t.Fatalf("step %d %s[%d]: %g, the sum is %g", s, ps[mt.param].Name, i-mt.off, res.out[s][0][i], want)
						}
					}
					for i := 0; i < mt.n*mt.m; i++ {
						e0, e1 := float64(res.errs[s][0][mt.eOff+i]), float64(res.errs[s][1][mt.eOff+i])
						m0 := float64(g0[mt.off+i]) // rank 0's M: its gradient plus the last step's error
						if s > 0 {
							m0 += float64(res.errs[s-1][0][mt.eOff+i])
						}
						if math.Abs(e0+e1) > 1e-5 || math.Abs(e0-(m0-float64(res.out[s][0][mt.off+i])/2)) > 1e-5*(1+math.Abs(m0)) {
							t.Fatalf("step %d %s[%d]: errors %g and %g; want M - G/2 = %g and a zero sum", s, ps[mt.param].Name, i, e0, e1, m0-float64(res.out[s][0][mt.off+i])/2)
						}
					}
				}
			}
		})
	}
}

// Error feedback: with the same gradients every step, what was applied
// adds up to the gradients' sum less the ranks' errors (exactly, to
// rounding), and the errors stay bounded, so the applied sum's relative
// distance from the gradients' falls like 1/steps. Rank 1 compresses
// hard.
func TestPowerSGDErrorFeedback(t *testing.T) {
	ps := psgdParams()
	const steps, np = 60, 2
	cfg := BucketConfig{CapBytes: 512, FirstCapBytes: 256, PowerSGD: &PowerSGD{Rank: 1}}
	res := psgdJob(t, modeFlat, np, steps, ps, cfg, func(r, _ int) []float32 { return psgdGrad(ps, r, 0) })
	c, _ := newCompressor(ps, paramOffsets(ps), *cfg.PowerSGD)
	for _, mt := range c.mats {
		k := mt.n * mt.m
		sum := make([]float64, k) // the gradients' sum over ranks, each step
		for r := 0; r < np; r++ {
			g := psgdGrad(ps, r, 0)
			for i := range sum {
				sum[i] += float64(g[mt.off+i])
			}
		}
		norm := func(x []float64) float64 {
			var s float64
			for _, v := range x {
				s += v * v
			}
			return math.Sqrt(s)
		}
		applied := make([]float64, k)
		var worst, first, last float64 // the errors' largest, in the first half, and the applied sum's final distance
		for s := 0; s < steps; s++ {
			diff, errSum := make([]float64, k), make([]float64, k)
			for i := range applied {
				applied[i] += float64(res.out[s][0][mt.off+i])
				diff[i] = float64(s+1)*sum[i] - applied[i]
				for r := 0; r < np; r++ {
					errSum[i] += float64(res.errs[s][r][mt.eOff+i])
				}
			}
			// the invariant: sum of gradients - sum applied = sum of errors
			for i := range diff {
				if d := math.Abs(diff[i] - errSum[i]); d > 1e-4*float64(s+1)*norm(sum) {
					t.Fatalf("%s step %d: gradients - applied = %g but the errors add up to %g", ps[mt.param].Name, s, diff[i], errSum[i])
				}
			}
			worst = math.Max(worst, norm(diff)/norm(sum))
			if s < steps/2 {
				first = worst
			}
			last = norm(diff) / (float64(s+1) * norm(sum))
		}
		t.Logf("%s %dx%d rank %d: the errors reach %.2f x the step's gradient (%.2f in the first %d steps); after %d steps the applied sum is off by %.3f",
			ps[mt.param].Name, mt.n, mt.m, mt.r, worst, first, steps/2, steps, last)
		if worst > 1.25*first || worst > 20 {
			t.Fatalf("%s: the errors grow: %.2f x the gradient in the first %d steps, %.2f after %d", ps[mt.param].Name, first, steps/2, worst, steps)
		}
	}
}

// SetScale's factor (a loss scale's inverse) applies before compression:
// gradients 4 times larger with SetScale(0.25) give the same bits and the
// same errors (powers of two: exact), so the errors stay in the
// unscaled gradient's units when the loss scale changes.
func TestPowerSGDScaleBeforeCompression(t *testing.T) {
	ps := psgdParams()
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := BucketConfig{CapBytes: 512, FirstCapBytes: 256, PowerSGD: &PowerSGD{Rank: 2}}
			plain := psgdJob(t, mode, 2, 2, ps, cfg, func(r, s int) []float32 { return psgdGrad(ps, r, s) })
			scaled := psgdJobScaled(t, mode, 2, 2, ps, cfg, 0.25, func(r, s int) []float32 {
				g := psgdGrad(ps, r, s)
				for i := range g {
					g[i] *= 4
				}
				return g
			})
			if fmt.Sprint(plain.out) != fmt.Sprint(scaled.out) || fmt.Sprint(plain.errs) != fmt.Sprint(scaled.errs) {
				t.Fatal("gradients x4 with SetScale(0.25) differ from the gradients themselves")
			}
		})
	}
}

// Steps before StartStep are the ordinary buckets (exact sums here, no
// PowerSGD bytes); from StartStep on the matrices are compressed.
func TestPowerSGDStartStep(t *testing.T) {
	ps := psgdParams()
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := BucketConfig{CapBytes: 512, FirstCapBytes: 256, PowerSGD: &PowerSGD{Rank: 2, StartStep: 2}}
			res := psgdJob(t, mode, 2, 3, ps, cfg, func(r, s int) []float32 {
				g := make([]float32, bkTotalLen(ps))
				bkFill(g, ps, r, func(r, p, i int) float32 { return bkExactVal(r, p, i+s) })
				return g
			})
			for s := 0; s < 3; s++ {
				exact := true
				want := make([]float32, bkTotalLen(ps))
				bkFill(want, ps, 0, func(_, p, i int) float32 { return bkExactVal(0, p, i+s) + bkExactVal(1, p, i+s) })
				for i, w := range want {
					exact = exact && res.out[s][0][i] == w
				}
				st := res.stats[s][0].PowerSGD
				if s < 2 && (st.Compressed || st.Bytes != 0 || !exact) {
					t.Fatalf("step %d (before the start step): compressed %v, %d bytes, exact sums %v", s, st.Compressed, st.Bytes, exact)
				}
				if s == 2 && (!st.Compressed || st.Bytes == 0 || st.Bytes >= st.FP16Bytes || exact) {
					t.Fatalf("step %d (the start step): stats %+v, exact sums %v", s, st, exact)
				}
			}
		})
	}
}

// The compressed buckets still overlap the backward pass: the first
// compressed bucket's allreduces (its other gradients', P's) start before
// the backward pass ends.
func TestPowerSGDOverlap(t *testing.T) {
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) {
			const layers, rows, cols = 6, 64, 256
			var ps []ParamInfo
			for l := 0; l < layers; l++ {
				ps = append(ps, ParamInfo{Name: fmt.Sprintf("layer_%d/w", l), Len: rows * cols, Rows: rows, Cols: cols},
					ParamInfo{Name: fmt.Sprintf("layer_%d/b", l), Len: cols})
			}
			ts := ranktest.InMemory(2, 2)
			defer ranktest.CloseAll(ts)
			errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
				pc := &PowerSGD{Rank: 2}
				if mode == modeFlat {
					pc.Backend = cpu.New()
				}
				b, err := NewBucketer(c, ps, BucketConfig{CapBytes: 4 * rows * cols, FirstCapBytes: 4 * rows * cols, PowerSGD: pc})
				if err != nil {
					return err
				}
				flat := make([]float32, bkTotalLen(ps))
				for i := range flat {
					flat[i] = float32(i%7) - 3
				}
				dev, err := attachGrads(b, ps, flat, mode, uint64(r))
				if err != nil {
					return err
				}
				for step := 0; step < 2; step++ {
					for l := layers - 1; l >= 0; l-- {
						time.Sleep(15 * time.Millisecond) // this layer's backward
						b.MarkReady(2*l + 1)
						b.MarkReady(2 * l)
					}
					b.BackwardDone()
					st, err := b.Wait()
					if err != nil {
						return err
					}
					if !st.PowerSGD.Compressed {
						return errors.New("not compressed")
					}
					// the first compressed bucket to leave: the last matrix's
					ms := b.PowerSGDMatrices()
					k := b.BucketOf(ms[len(ms)-1].Param)
					if first := st.Buckets[k]; !first.Start.Before(st.BackwardDone) || st.Hidden <= 0 || st.Exposed >= st.CommTime {
						return fmt.Errorf("no overlap: compressed bucket %d's allreduce started %v after backward done, stats %+v",
							k, first.Start.Sub(st.BackwardDone), st)
					}
				}
				if dev != nil {
					return dev.Err()
				}
				return nil
			})
			bkNoErrs(t, errs)
		})
	}
}

// An Inf in one rank's matrix: the step overflows, and the compressor's
// state (errors, Q) is what it was before the step; the next step is
// clean.
func TestPowerSGDOverflowKeepsState(t *testing.T) {
	ps := psgdParams()
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := BucketConfig{CapBytes: 512, FirstCapBytes: 256, PowerSGD: &PowerSGD{Rank: 2}}
			res := psgdJob(t, mode, 2, 3, ps, cfg, func(r, s int) []float32 {
				g := psgdGrad(ps, r, s)
				if s == 1 && r == 1 {
					g[paramOffsets(ps)[1]+3] = float32(math.Inf(1)) // l0/w
				}
				return g
			})
			if res.stats[0][0].Overflow || !res.stats[1][0].Overflow || !res.stats[1][1].Overflow || res.stats[2][0].Overflow {
				t.Fatalf("overflow flags %v %v %v", res.stats[0][0].Overflow, res.stats[1][0].Overflow, res.stats[2][0].Overflow)
			}
			c, _ := newCompressor(ps, paramOffsets(ps), *cfg.PowerSGD)
			l0 := c.mats[c.of[1]]
			for r := 0; r < 2; r++ {
				before, after := res.errs[0][r][l0.eOff:l0.eOff+l0.n*l0.m], res.errs[1][r][l0.eOff:l0.eOff+l0.n*l0.m]
				if fmt.Sprint(before) != fmt.Sprint(after) {
					t.Fatalf("rank %d: the overflowed step changed l0/w's errors", r)
				}
				qb, qa := res.q[0][r][l0.qOff:l0.qOff+l0.m*l0.r], res.q[1][r][l0.qOff:l0.qOff+l0.m*l0.r]
				if fmt.Sprint(qb) != fmt.Sprint(qa) {
					t.Fatalf("rank %d: the overflowed step changed l0/w's Q", r)
				}
				if !finite(res.errs[2][r]) || !finite(res.q[2][r]) || !finite(res.out[2][r]) {
					t.Fatalf("rank %d: NaN or Inf after the step that followed the overflow", r)
				}
			}
		})
	}
}

// A step whose gradients are all zero drops every column of P, and so of
// Q; the zero columns of Q are drawn again, so the next step still
// compresses (a Q left at zero would send nothing from then on).
func TestPowerSGDZeroGradientStep(t *testing.T) {
	ps := psgdParams()
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := BucketConfig{CapBytes: 512, FirstCapBytes: 256, PowerSGD: &PowerSGD{Rank: 2}}
			res := psgdJob(t, mode, 2, 2, ps, cfg, func(r, s int) []float32 {
				if s == 0 {
					return make([]float32, bkTotalLen(ps))
				}
				return psgdGrad(ps, r, s)
			})
			c, _ := newCompressor(ps, paramOffsets(ps), *cfg.PowerSGD)
			for _, mt := range c.mats {
				var n0, n1 float64
				for _, v := range res.q[0][0][mt.qOff : mt.qOff+mt.m*mt.r] {
					n0 += float64(v * v)
				}
				for _, v := range res.out[1][0][mt.off : mt.off+mt.n*mt.m] {
					n1 += float64(v * v)
				}
				if n0 == 0 || n1 == 0 {
					t.Fatalf("%s: |Q| %g after the zero step, |G| %g after the next", ps[mt.param].Name, n0, n1)
				}
			}
		})
	}
}

// Ranks with another PowerSGD rank, or a matrix of another shape, are
// refused at the first step, naming it.
func TestPowerSGDFingerprintMismatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(r int, ps []ParamInfo, cfg *PowerSGD) []ParamInfo
		want string
	}{
		{"rank", func(r int, ps []ParamInfo, cfg *PowerSGD) []ParamInfo {
			if r == 1 {
				cfg.Rank = 1
			}
			return ps
		}, "PowerSGD is rank 2, start step 0, minimum rate 2, seed 0, 3 matrices on rank 0 but rank 1, start step 0, minimum rate 2, seed 0, 3 matrices on rank 1"},
		{"shape", func(r int, ps []ParamInfo, cfg *PowerSGD) []ParamInfo {
			if r == 1 {
				ps[1].Rows, ps[1].Cols = 10, 12
			}
			return ps
		}, `parameter 1 "l0/w" is a 12x10 matrix on rank 0 but 10x12 on rank 1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := ranktest.InMemory(2, 1)
			defer ranktest.CloseAll(ts)
			errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
				pc := PowerSGD{Rank: 2, Backend: cpu.New()}
				ps := tc.edit(r, psgdParams(), &pc)
				b, err := NewBucketer(c, ps, BucketConfig{PowerSGD: &pc})
				if err != nil {
					return err
				}
				if err := b.AttachFlat(make([]float32, bkTotalLen(ps))); err != nil {
					return err
				}
				for i := len(ps) - 1; i >= 0; i-- {
					b.MarkReady(i)
				}
				_, err = b.Wait()
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					return fmt.Errorf("got %v, want an error with %q", err, tc.want)
				}
				return nil
			})
			bkNoErrs(t, errs)
		})
	}
}

// The state round trip: PowerSGDState after a step, given to a fresh
// Bucketer with SetPowerSGDState and SetStep, continues exactly as the
// first one does.
func TestPowerSGDStateResumes(t *testing.T) {
	ps := psgdParams()
	for _, mode := range []gradMode{modeFlat, modeDevice} {
		t.Run(mode.String(), func(t *testing.T) {
			ts := ranktest.InMemory(2, 1)
			defer ranktest.CloseAll(ts)
			errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
				run := func(steps int, from int, errs, q []float32) ([]float32, []float32, []float32, error) {
					pc := PowerSGD{Rank: 2, StartStep: 1}
					if mode == modeFlat {
						pc.Backend = cpu.New()
					}
					b, err := NewBucketer(c, ps, BucketConfig{CapBytes: 512, FirstCapBytes: 256, PowerSGD: &pc})
					if err != nil {
						return nil, nil, nil, err
					}
					flat := make([]float32, bkTotalLen(ps))
					var dev *fusiontest.StagedCPU
					if dev, err = attachGrads(b, ps, flat, mode, 3); err != nil {
						return nil, nil, nil, err
					}
					if errs != nil {
						if err := b.SetPowerSGDState(errs, q); err != nil {
							return nil, nil, nil, err
						}
					}
					b.SetStep(from)
					for s := from; s < steps; s++ {
						copy(flat, psgdGrad(ps, r, s))
						for i := len(ps) - 1; i >= 0; i-- {
							b.MarkReady(i)
						}
						if _, err := b.Wait(); err != nil {
							return nil, nil, nil, err
						}
					}
					e, q, err := b.PowerSGDState()
					if dev != nil && err == nil {
						err = dev.Err()
					}
					return append([]float32(nil), flat...), e, q, err
				}
				full, _, _, err := run(4, 0, nil, nil)
				if err != nil {
					return err
				}
				_, e, q, err := run(2, 0, nil, nil)
				if err != nil {
					return err
				}
				resumed, _, _, err := run(4, 2, e, q)
				if err != nil {
					return err
				}
				if fmt.Sprint(full) != fmt.Sprint(resumed) {
					return errors.New("the resumed Bucketer's step 4 differs from the uninterrupted one's")
				}
				// without the errors (zeros), step 4 differs
				noErr, _, _, err := run(4, 2, make([]float32, len(e)), q)
				if err != nil {
					return err
				}
				if fmt.Sprint(full) == fmt.Sprint(noErr) {
					return errors.New("the errors made no difference")
				}
				return nil
			})
			bkNoErrs(t, errs)
		})
	}
}

// Ranks on one host need no exact sum before compression: P = M Q and
// Q = Mᵀ P are linear in M and each rank's error is M - G/W, so four ranks
// compressing their own gradients give the same G, step after step, as two
// ranks compressing each pair's sum (as if each host first summed its two
// ranks exactly), and each pair's errors add up to the two-rank run's.
// With a hierarchical allreduce the link carries one P and one Q per host
// either way (docs/fusion.md, "Ranks on one host").
func TestPowerSGDHostSumsEquivalent(t *testing.T) {
	ps := psgdParams()
	const steps = 6
	cfg := BucketConfig{CapBytes: 512, FirstCapBytes: 256, PowerSGD: &PowerSGD{Rank: 2}}
	four := psgdJob(t, modeFlat, 4, steps, ps, cfg, func(r, s int) []float32 { return psgdGrad(ps, r, s) })
	two := psgdJob(t, modeFlat, 2, steps, ps, cfg, func(h, s int) []float32 {
		a, b := psgdGrad(ps, 2*h, s), psgdGrad(ps, 2*h+1, s)
		for i := range a {
			a[i] += b[i]
		}
		return a
	})
	c, _ := newCompressor(ps, paramOffsets(ps), *cfg.PowerSGD)
	if len(c.mats) == 0 {
		t.Fatal("nothing compressed")
	}
	for s := 0; s < steps; s++ {
		for _, mt := range c.mats {
			var scale float64
			for i := mt.off; i < mt.off+mt.n*mt.m; i++ {
				scale = math.Max(scale, math.Abs(float64(four.out[s][0][i])))
			}
			for i := mt.off; i < mt.off+mt.n*mt.m; i++ {
				if d := math.Abs(float64(four.out[s][0][i]) - float64(two.out[s][0][i])); d > 1e-4*scale {
					t.Fatalf("step %d %s[%d]: %g from 4 ranks, %g from 2 ranks of summed pairs", s, ps[mt.param].Name, i-mt.off, four.out[s][0][i], two.out[s][0][i])
				}
			}
			for h := 0; h < 2; h++ {
				for i := mt.eOff; i < mt.eOff+mt.n*mt.m; i++ {
					pair := float64(four.errs[s][2*h][i]) + float64(four.errs[s][2*h+1][i])
					if d := math.Abs(pair - float64(two.errs[s][h][i])); d > 1e-4*(scale+math.Abs(pair)) {
						t.Fatalf("step %d %s: ranks %d and %d's errors add up to %g, host %d's is %g", s, ps[mt.param].Name, 2*h, 2*h+1, pair, h, two.errs[s][h][i])
					}
				}
			}
		}
	}
}
