package collective

import (
	"math"
	"math/bits"
	"testing"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank/ranktest"
)

// TestRecursiveDoublingPlan simulates the plan on every world size 1..16
// and awkward lengths: every rank ends with every rank's contribution
// exactly once in every element; each rank that takes part in the
// exchanges owns the whole buffer (a folded rank nothing); the step count
// is log2(p) (plus 2 on folded pairs); on a power of two each rank sends
// log2(P) buffers, and every step is an exchange of the whole buffer.
func TestRecursiveDoublingPlan(t *testing.T) {
	for n := 1; n <= 16; n++ {
		pof2 := 1 << (bits.Len(uint(n)) - 1)
		k := bits.Len(uint(pof2)) - 1
		for _, count := range []int{0, 1, 2, 3, n - 1, n, n + 1, 7, 64, 97, 1000} {
			if count < 0 {
				continue
			}
			owns, sent := hdSim(t, rdPlanFor, n, count)
			for r := 0; r < n; r++ {
				p := rdPlanFor(r, n, count)
				want, folded := k, r < 2*(n-pof2)
				if folded {
					want += 2
					if r%2 == 0 {
						want = 2
					}
				}
				if len(p.steps) != want {
					t.Fatalf("n=%d: rank %d has %d steps, want %d", n, r, len(p.steps), want)
				}
				wantOwn := span{0, count}
				if folded && r%2 == 0 {
					wantOwn = span{}
				}
				if n > 1 && owns[r] != wantOwn {
					t.Fatalf("n=%d count=%d: rank %d owns %v, want %v", n, count, r, owns[r], wantOwn)
				}
				exchanges := 0
				for _, st := range p.steps {
					if st.exchange {
						exchanges++
						if st.send != (span{0, count}) || st.recv != st.send || !st.reduce {
							t.Fatalf("n=%d count=%d: rank %d: exchange step %+v is not the whole buffer both ways", n, count, r, st)
						}
					}
				}
				if !(folded && r%2 == 0) && exchanges != k {
					t.Fatalf("n=%d: rank %d has %d exchanges, want %d", n, r, exchanges, k)
				}
				if n == pof2 && sent[r] != k*count {
					t.Fatalf("n=%d count=%d: rank %d sent %d elements, want log2(n)*count = %d", n, count, r, sent[r], k*count)
				}
			}
		}
	}
}

// TestRecursiveDoublingSameBits: both ends of an exchange compute a (op) b
// with the lower rank's value first, so every rank ends with the same bits
// where operand order shows: two NaNs with different payloads (a Sum keeps
// the first's), on 2, 3 (a fold) and 4 ranks, over real goroutines and
// the local transport, for float32, a 16-bit wire and bfloat16 data; the
// value is the NaN of the lowest rank in the exchanges.
func TestRecursiveDoublingSameBits(t *testing.T) {
	const count = 1000
	nans := []uint32{0x7fc0_1234, 0xffc0_0042, 0x7fc0_0777, 0xffc0_5555}
	for _, n := range []int{2, 3, 4} {
		for _, v := range []variant{{dtype.Float32, dtype.Float32}, {dtype.Float32, dtype.Float16}, {dtype.BFloat16, dtype.BFloat16}} {
			ts := ranktest.InMemory(n, 2)
			out := make([][]byte, n)
			errs := group(ts, Config{SliceBytes: 512}, func(c *Communicator) error {
				r := c.t.Rank()
				vals := make([]float64, count)
				for i := range vals {
					vals[i] = intValue(r, i)
				}
				buf := makeBuf(v.dt, vals)
				for i := 0; i < count; i += 7 { // every rank a NaN of its own here
					setNaN(buf, v.dt, i, nans[r%len(nans)])
				}
				o := []CallOption{WithAlgorithm(algo.RecursiveDoubling)}
				if v.wire != v.dt {
					o = append(o, WithWire(v.wire))
				}
				err := c.Allreduce(testCtx(t), nil, buf, v.dt, Sum, o...)
				out[r] = buf
				return err
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			ranktest.CloseAll(ts)
			for r := 1; r < n; r++ {
				if string(out[r]) != string(out[0]) {
					t.Fatalf("n=%d %v: rank %d's result differs from rank 0's", n, v, r)
				}
			}
			narrow := v.dt // rank 0's NaN as the call rounds it
			if v.wire != v.dt {
				narrow = v.wire
			}
			first := 0 // the lowest rank in the exchanges: at 3, rank 1, into which rank 0 folds (its own value first, as halving-doubling's fold)
			if n == 3 {
				first = 1
			}
			if got, want := nanBits(out[0], v.dt, 0), nanBits(nanBuf(narrow, nans[first]), narrow, 0); got != want {
				t.Errorf("n=%d %v: element 0 is %#x, want rank %d's NaN %#x", n, v, got, first, want)
			}
			if !intSumsMatch(out[0], v.dt, n, func(i int) bool { return i%7 == 0 }) {
				t.Errorf("n=%d %v: wrong sums", n, v)
			}
		}
	}
}

// setNaN stores the float32 NaN with bits b (as the data type has it) in
// element i of buf.
func setNaN(buf []byte, dt dtype.DType, i int, b uint32) {
	one := nanBuf(dt, b)
	copy(buf[i*dt.Size():], one)
}

// nanBuf is one element holding the float32 NaN with bits b in type dt.
func nanBuf(dt dtype.DType, b uint32) []byte {
	out := make([]byte, dt.Size())
	encode(out, []float32{math.Float32frombits(b)}, dt)
	return out
}

// nanBits returns element i of buf's bits.
func nanBits(buf []byte, dt dtype.DType, i int) uint32 {
	f := make([]float32, 1)
	decode(f, buf[i*dt.Size():(i+1)*dt.Size()], dt)
	return math.Float32bits(f[0])
}

// intSumsMatch reports whether every element of buf but the skipped ones
// holds the sum over n ranks of their intValue inputs (reference).
func intSumsMatch(buf []byte, dt dtype.DType, n int, skip func(int) bool) bool {
	count := len(buf) / dt.Size()
	vals := make([][]float64, n)
	for r := range vals {
		vals[r] = make([]float64, count)
		for i := range vals[r] {
			vals[r][i] = intValue(r, i)
		}
	}
	want := reference(vals, Sum)
	for i, x := range readBuf(dt, buf) {
		if !skip(i) && x != want[i] {
			return false
		}
	}
	return true
}

// TestRecursiveDoublingBytes: the executor moves what the plan says, to
// the peers it names and no others (as TestHalvingDoublingBytes): on a
// power of two, log2(P) buffers per rank.
func TestRecursiveDoublingBytes(t *testing.T) {
	const count = 4096
	for n := 2; n <= 6; n++ {
		for _, v := range []variant{{dtype.Float32, dtype.Float32}, {dtype.Float32, dtype.BFloat16}} {
			for r, total := range checkPlanBytes(t, algo.RecursiveDoubling, rdPlanFor, n, count, v) {
				if k := bits.Len(uint(n)) - 1; n&(n-1) == 0 && total != uint64(k*count*v.wire.Size()) {
					t.Errorf("N=%d: rank %d sent %d bytes, want log2(N) buffers of %d", n, r, total, count*v.wire.Size())
				}
			}
		}
	}
}

// TestRecursiveDoublingTag: the algorithm and the wire format survive
// the tag.
func TestRecursiveDoublingTag(t *testing.T) {
	c := call{kind: kAllreduce, count: 5, dtype: dtype.Float32, op: Sum, wire: dtype.Float16, algo: algo.RecursiveDoubling}
	if got := fromTag(c.tag(0)); got.algo != algo.RecursiveDoubling || got.wire != dtype.Float16 {
		t.Errorf("tag round trip: %+v", got)
	}
}
