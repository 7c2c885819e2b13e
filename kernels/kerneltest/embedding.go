package kerneltest

import (
	"fmt"
	"math"
)

type embCase struct {
	vocab, d int
	ids      []int32 // nil: n random ids, about one in five the pad id
	n        int
	scale    float32
	pad      int32
}

func embCases() []embCase {
	return []embCase{
		{vocab: 4, d: 5, ids: []int32{1, 3, 0, 3, 2, 1}, scale: 1.5, pad: 0},
		{vocab: 3, d: 1, ids: []int32{1, 2, 0, 2}, scale: 1, pad: 0},
		{vocab: 6, d: 4, ids: []int32{2, 5, 0, 2, 1}, scale: 2.5, pad: 0},
		{vocab: 11, d: 7, n: 13, scale: 1, pad: 3},
		{vocab: 50, d: 33, n: 100, scale: 0.5, pad: 0},
		{vocab: 20, d: 513, n: 9, scale: float32(math.Sqrt(513)), pad: -1}, // no padding
		{vocab: 3, d: 1000, ids: []int32{2, 0, 2, 2, 1, 0, 2, 1, 2}, scale: 1, pad: 1},
		{vocab: 7, d: 4097, ids: []int32{6, 0, 3}, scale: 3, pad: 0},
		{vocab: 4, d: 200, n: 40, scale: 0.1, pad: 2},
	}
}

func (c embCase) String() string {
	return fmt.Sprintf("vocab=%d d=%d n=%d scale=%g pad=%d", c.vocab, c.d, max(c.n, len(c.ids)), c.scale, c.pad)
}

func (c embCase) draw(e *env) []int32 {
	if c.ids != nil {
		return c.ids
	}
	ids := make([]int32, c.n)
	for i := range ids {
		ids[i] = int32(e.rng.IntN(c.vocab))
		if c.pad >= 0 && e.rng.IntN(5) == 0 {
			ids[i] = c.pad
		}
	}
	return ids
}

// emb64 is table[ids[i]]*scale, zero rows for padding.
func emb64(table []float64, ids []int32, d int, scale float64, pad int32) []float64 {
	y := make([]float64, len(ids)*d)
	for i, id := range ids {
		if id == pad {
			continue
		}
		for j := range d {
			y[i*d+j] = table[int(id)*d+j] * scale
		}
	}
	return y
}

func testEmbedding(e *env) {
	for _, c := range embCases() {
		e.run(c.String(), func() {
			ids := c.draw(e)
			n := len(ids)
			table := e.varied(c.vocab*c.d, 1)
			out := e.up(e.randn(n*c.d, 1), n, c.d) // stale values: pad rows must be written
			e.be.Embedding(out, e.up(table, c.vocab, c.d), e.upI(ids, n), c.scale, c.pad)
			got := e.down(out)
			e.near("out", got, emb64(to64(table), ids, c.d, float64(c.scale), c.pad), e.tol.F32)
			for i, id := range ids {
				if id == c.pad {
					e.exact(fmt.Sprintf("out row %d (pad)", i), got[i*c.d:(i+1)*c.d], zeros(c.d))
				}
			}
		})
	}
	e.run("ids copied on the device", func() {
		// Copy of an I32 tensor, then Embedding reads the copy.
		ids := []int32{3, 1, 0, 3}
		src, dst := e.upI(ids, 4), e.upI([]int32{2, 2, 2, 2}, 4)
		e.be.Copy(dst, src)
		table := e.randn(4*5, 1)
		out := e.alloc(f32, 4, 5)
		e.be.Embedding(out, e.up(table, 4, 5), dst, 1, 0)
		e.near("out", e.down(out), emb64(to64(table), ids, 5, 1, 0), 0)
	})
}

func testEmbeddingBackward(e *env) {
	for _, c := range embCases() {
		e.run(c.String(), func() {
			ids := c.draw(e)
			n := len(ids)
			table, dout := e.varied(c.vocab*c.d, 1), e.varied(n*c.d, 1)
			dt0 := e.randn(c.vocab*c.d, 1) // accumulated onto
			small := c.vocab*c.d <= 40
			dt := e.up(dt0, c.vocab, c.d)
			e.be.EmbeddingBackward(dt, e.up(dout, n, c.d), e.upI(ids, n), c.scale, c.pad)
			ana := make([]float64, c.vocab*c.d)
			for i, id := range ids {
				if id == c.pad {
					continue
				}
				for j := range c.d {
					ana[int(id)*c.d+j] += float64(dout[i*c.d+j]) * float64(c.scale)
				}
			}
			var f func([]float64) float64
			if small {
				f = func(tb []float64) float64 { return dot64(dout, emb64(tb, ids, c.d, float64(c.scale), c.pad)) }
			}
			got := e.down(dt)
			e.gradCheck("dtable (accumulated)", got, dt0, ana, f, to64(table), e.tol.F32)
			if p := int(c.pad); p >= 0 && p < c.vocab {
				e.exact(fmt.Sprintf("dtable row %d (pad)", p), got[p*c.d:(p+1)*c.d], dt0[p*c.d:(p+1)*c.d])
			}
		})
	}
}
