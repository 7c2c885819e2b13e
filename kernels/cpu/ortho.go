package cpu

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/kernels"
)

// orthoBlock is the number of rows whose float64 partial sums are added
// up on their own before the blocks' sums are combined in block order.
// The blocks do not depend on the number of threads, and neither does
// Orthonormalize's result: PowerSGD needs every worker to orthonormalize
// its all-reduced P to the same bits.
const orthoBlock = 512

// orthoGrain is the least work (rows*cols) one goroutine gets. A matrix
// split across goroutines pays a goroutine start per pass (cols+1 of
// them) and its partial sums; on the shared 2-core machine of
// docs/transformer.md splitting a 32768 x 8 matrix in two was slower than
// one goroutine (1.47 against 1.22 ms) and 524288 x 8 15 % faster, so
// only matrices (or batches) of 2^18 elements and more are split.
const orthoGrain = 1 << 18

// Orthonormalize implements kernels.Backend.
//
// Modified Gram-Schmidt, fused so that each column costs one pass over
// the rows: the pass that normalizes column j and subtracts its
// projection from the later columns also sums, over the updated rows,
// the squared norm of column j+1 and its dot products with the columns
// after it, which give the next pass its scale and coefficients.
func (be *Backend) Orthonormalize(pt kernels.Tensor, eps float32) {
	p := f32(pt, "p")
	if pt.Rank < 2 {
		panic(fmt.Sprintf("cpu: Orthonormalize: p must be [rows, cols] or [n, rows, cols], got %v", pt))
	}
	rows, cols := pt.Dim(-2), pt.Dim(-1)
	m := rows * cols
	if m == 0 {
		return
	}
	batch := len(p) / m
	nb := (rows + orthoBlock - 1) / orthoBlock
	slot := orthoSlot(cols)
	per := nb*slot + 3*cols // one matrix's partials and totals, coefficients, input norms
	if w := min(be.parts(m, orthoGrain), nb); batch == 1 || w >= be.Threads {
		// One matrix, or matrices big enough to keep every thread busy:
		// the row blocks of each in parallel.
		buf := be.orthoBuf(per)
		for b := 0; b < batch; b++ {
			orthoMatrix(p[b*m:(b+1)*m], rows, cols, float64(eps), buf, w)
		}
		return
	}
	// Small matrices: several at a time, each on one goroutine.
	w := be.parts(len(p), orthoGrain)
	if w > batch {
		w = batch
	}
	buf := be.orthoBuf(w * per)
	parFor(w, batch, func(part, lo, hi int) {
		for b := lo; b < hi; b++ {
			orthoMatrix(p[b*m:(b+1)*m], rows, cols, float64(eps), buf[part*per:(part+1)*per], 1)
		}
	})
}

func (be *Backend) orthoBuf(n int) []float64 {
	if len(be.ortho) < n {
		be.ortho = make([]float64, n)
	}
	return be.ortho[:n]
}

// orthoSlot is the number of partial sums one block keeps: the first pass
// sums every column's square and column 0's dot products with the others.
func orthoSlot(cols int) int { return 2 * cols }

// orthoMatrix orthonormalizes one [rows, cols] matrix with w goroutines.
// buf holds the blocks' partial sums (a slot each), then the coefficients
// c, the input norms o and the blocks' totals tot.
func orthoMatrix(p []float32, rows, cols int, eps float64, buf []float64, w int) {
	nb := (rows + orthoBlock - 1) / orthoBlock
	slot := orthoSlot(cols)
	part := buf[:nb*slot]
	c := buf[nb*slot : nb*slot+cols]
	o := buf[nb*slot+cols : nb*slot+2*cols]
	tot := buf[nb*slot+2*cols : nb*slot+3*cols]
	w = min(w, nb)
	// pass runs pass j over every block (j = -1: the input norms and
	// column 0's dot products) and sums the blocks' partials in order into
	// tot: tot[0] the squared norm of column j+1, tot[k] its dot product
	// with column k > j+1 (pass -1: tot[k] for k >= 1, and o).
	pass := func(j int, inv float64) {
		clear(part)
		parFor(w, nb, func(_, lo, hi int) {
			for b := lo; b < hi; b++ {
				r0, r1 := b*orthoBlock, min((b+1)*orthoBlock, rows)
				acc := part[b*slot : (b+1)*slot]
				if j < 0 {
					orthoNorms(p, cols, r0, r1, acc)
				} else {
					orthoPass(p, cols, r0, r1, j, inv, c, acc)
				}
			}
		})
		clear(tot)
		if j < 0 {
			clear(o)
		}
		for b := 0; b < nb; b++ {
			acc := part[b*slot : (b+1)*slot]
			for k := 0; k < cols; k++ {
				tot[k] += acc[k]
			}
			if j < 0 {
				for k := 0; k < cols; k++ {
					o[k] += acc[cols+k]
				}
			}
		}
	}
	pass(-1, 0)
	for k := range o {
		o[k] = math.Sqrt(o[k])
	}
	for j := 0; j < cols; j++ {
		// tot: column j's squared norm and its dot products with later columns.
		nrm := math.Sqrt(tot[0])
		inv := 0.0
		clear(c)
		if nrm > kernels.OrthoDropTol*o[j] {
			inv = 1 / (nrm + eps)
			for k := j + 1; k < cols; k++ {
				c[k] = tot[k] / (nrm * nrm)
			}
		}
		pass(j, inv)
	}
}

// orthoNorms sums, over rows [r0, r1), acc[k] = p_0.p_k and acc[cols+k] =
// p_k.p_k for every column k.
func orthoNorms(p []float32, cols, r0, r1 int, acc []float64) {
	blk := p[r0*cols : r1*cols]
	for k := 0; k < cols; k++ {
		acc[k] += dotCols(blk, cols, 0, k)
		acc[cols+k] += dotCols(blk, cols, k, k)
	}
}

// orthoPass, over rows [r0, r1): subtracts c[k] times column j from every
// column k > j, normalizes column j (times inv), and sums into acc the
// squared norm of the updated column j+1 (acc[0]) and its dot products
// with the columns k > j+1 (acc[k]). It goes column by column (a block of
// rows is in L1), each loop free of dependences between rows.
func orthoPass(p []float32, cols, r0, r1, j int, inv float64, c []float64, acc []float64) {
	blk := p[r0*cols : r1*cols]
	pj := blk[j:]
	for k := j + 1; k < cols; k++ {
		ck, pk := c[k], blk[k:]
		for o := 0; o < len(pk); o += cols {
			pk[o] = float32(float64(pk[o]) - ck*float64(pj[o]))
		}
	}
	for o := 0; o < len(pj); o += cols {
		pj[o] = float32(float64(pj[o]) * inv)
	}
	if j+1 < cols {
		acc[0] += dotCols(blk, cols, j+1, j+1)
		for k := j + 2; k < cols; k++ {
			acc[k] += dotCols(blk, cols, j+1, k)
		}
	}
}

// dotCols is the dot product, in float64, of columns a and b of the
// row-major block blk of cols columns: four partial sums (rows i mod 4)
// added pairwise at the end, so the adds do not wait on each other.
func dotCols(blk []float32, cols, a, b int) float64 {
	pa, pb := blk[a:], blk[b:]
	var s0, s1, s2, s3 float64
	o, n := 0, len(blk)-a
	if m := len(blk) - b; m < n {
		n = m
	}
	for ; o+3*cols < n; o += 4 * cols {
		s0 += float64(pa[o]) * float64(pb[o])
		s1 += float64(pa[o+cols]) * float64(pb[o+cols])
		s2 += float64(pa[o+2*cols]) * float64(pb[o+2*cols])
		s3 += float64(pa[o+3*cols]) * float64(pb[o+3*cols])
	}
	for ; o < n; o += cols {
		s0 += float64(pa[o]) * float64(pb[o])
	}
	return (s0 + s1) + (s2 + s3)
}
