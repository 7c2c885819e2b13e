package collective

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank"
)

// randomInputs returns n ranks' count values of varied magnitudes:
// sign * m * 2^e with m uniform in [1, 2) and e uniform in -10..10, so that
// sums mix numbers 2^20 apart and cancel (the order of summation changes
// the bits of the result, unlike with small integers).
func randomInputs(n, count int, seed uint64) [][]float64 {
	rng := rand.New(rand.NewPCG(seed, 16))
	in := make([][]float64, n)
	for r := range in {
		in[r] = make([]float64, count)
		for i := range in[r] {
			x := math.Ldexp(1+rng.Float64(), rng.IntN(21)-10)
			if rng.IntN(2) == 0 {
				x = -x
			}
			in[r][i] = x
		}
	}
	return in
}

// randomBound is how far an allreduce of random values may be from the
// float64 reduction of the same inputs (as stored in the data type), for
// element i with reference ref and sum of magnitudes abs = sum_r |x_r,i|.
//
// Every algorithm adds the n contributions with n-1 float32 additions,
// each rounded to float32 (error at most 2^-24 times a partial sum, itself
// at most abs). With a 16-bit format, the partial sums it stores or sends
// in that format are rounded to it, each rounding at most u*abs (u the
// format's unit roundoff: 2^-11 float16, 2^-8 bfloat16) plus, below
// float16's normal range, tiny = 2^-25. roundings counts them on an
// element's path, for n ranks:
//
//   - 16-bit data: the ring, tree, shm and hierarchical allreduces round
//     after each of the n-1 combinations (the ring's hops; a tree's
//     children; the shm owner's n-1 slots; m-1 hops on a host plus h-1
//     across hosts) or fewer (halving-doubling: log2(p) exchanges, one
//     more on a folded pair); direct accumulates in float32 and rounds once;
//   - float32 data on a 16-bit wire: the ring and tree send n-1 rounded
//     partial sums (the first sender's own value included) and the owner
//     rounds the result: n; halving-doubling sends log2(p) rounded
//     partial sums, one more on a folded pair, and rounds the result:
//     at most n; hierarchical at most m-1 on a host plus h
//     across hosts, so n too; direct and shm round every contribution once
//     (together at most u*abs) and the result once: 2;
//   - float32 throughout: none.
//
// So a Sum is within roundings*(u*abs + tiny) + (n-1)*2^-24*abs of the
// reference, plus n*2^-53*abs for the float64 reference's own rounding.
// Average: that bound divided by n, plus the division's rounding,
// (u + 2^-24)*|ref| + tiny. Min, Max: exact in the data type (0) when the
// wire is the data type; one rounding to the wire format (u*|ref| + tiny)
// otherwise.
func randomBound(k variant, a algo.Algorithm, op Op, n int, ref, abs float64) float64 {
	unit := map[dtype.DType]float64{dtype.Float32: 0x1p-24, dtype.Float16: 0x1p-11, dtype.BFloat16: 0x1p-8}
	tinies := map[dtype.DType]float64{dtype.Float16: 0x1p-25}
	conv := k.wire != k.dt
	f := k.dt // the format results are rounded to: 16-bit data, or the wire
	if conv {
		f = k.wire
	}
	u, tiny := unit[f], tinies[f]
	if op == Min || op == Max {
		if !conv {
			return 0
		}
		return u*math.Abs(ref) + tiny
	}
	var roundings float64 // to the 16-bit format f
	switch {
	case f == dtype.Float32:
	case a == algo.Direct && !conv:
		roundings = 1
	case conv && (a == algo.Direct || a == algo.Shared):
		roundings = 2
	case conv:
		roundings = float64(n)
	default:
		roundings = float64(n - 1)
	}
	b := roundings*(u*abs+tiny) + float64(n-1)*0x1p-24*abs + float64(n)*0x1p-53*abs
	if op == Average {
		b = b/float64(n) + (u+0x1p-24)*math.Abs(ref) + tiny
	}
	return b
}

// randomCase is one allreduce of random values.
type randomCase struct {
	count int
	op    Op
	v     variant
	algo  algo.Algorithm
}

func (k randomCase) String() string {
	return fmt.Sprintf("count %d %s %s wire %s %s", k.count, k.op, k.v.dt, k.v.wire, k.algo)
}

// checkRandom runs the cases on every rank of ts and checks each result
// bit-identical on every rank and within randomBound of the float64
// reduction. Each case must run with the algorithm it asks for, and the
// communicator must see the hierarchical layout hosts (hosts, ranks per
// host; (0, 0): flat).
func checkRandom(t *testing.T, ts []rank.Transport, cfg Config, cases []randomCase, hosts [2]int) {
	t.Helper()
	n := len(ts)
	inputs := make([][][]float64, len(cases))
	for ci, k := range cases {
		inputs[ci] = randomInputs(n, k.count, uint64(ci+1))
	}
	results := make([][][]byte, n) // [rank][case]
	errs := group(ts, cfg, func(c *Communicator) error {
		r := c.Rank()
		if h, p := c.Hierarchical(); [2]int{h, p} != hosts {
			return fmt.Errorf("layout %d hosts x %d, want %d x %d", h, p, hosts[0], hosts[1])
		}
		for ci, k := range cases {
			if a := c.AlgorithmFor(k.algo, k.count*k.v.wire.Size()); a != k.algo {
				return fmt.Errorf("%v runs %s", k, a)
			}
			buf := makeBuf(k.v.dt, inputs[ci][r])
			var send []byte // in place on even cases
			if ci%2 == 1 {
				send = append([]byte(nil), buf...)
			}
			o := []CallOption{WithAlgorithm(k.algo)}
			if k.v.wire != k.v.dt {
				o = append(o, WithWire(k.v.wire))
			}
			if err := c.Allreduce(testCtx(t), send, buf, k.v.dt, k.op, o...); err != nil {
				return fmt.Errorf("%v: %w", k, err)
			}
			results[r] = append(results[r], buf)
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	for ci, k := range cases {
		for r := 1; r < n; r++ {
			if !bytes.Equal(results[r][ci], results[0][ci]) {
				i := firstDiff(k.v.dt, results[r][ci], results[0][ci])
				t.Fatalf("N=%d %v: rank %d's result differs from rank 0's at element %d: %v vs %v", n, k, r, i,
					readBuf(k.v.dt, results[r][ci])[i], readBuf(k.v.dt, results[0][ci])[i])
			}
		}
		vals := make([][]float64, n) // the inputs as stored in the data type
		abs := make([]float64, k.count)
		for r := range vals {
			vals[r] = readBuf(k.v.dt, makeBuf(k.v.dt, inputs[ci][r]))
			for i, x := range vals[r] {
				abs[i] += math.Abs(x)
			}
		}
		ref := reference(vals, k.op)
		got := readBuf(k.v.dt, results[0][ci])
		for i := range ref {
			// float32 data on a 16-bit wire ends in the wire format's values
			// (on every algorithm, the owner's part included)
			if x := float32(got[i]); k.v.wire != k.v.dt && roundTo(k.v.wire, x) != got[i] {
				t.Fatalf("N=%d %v: element %d = %v is not a %s value", n, k, i, got[i], k.v.wire)
			}
			b := randomBound(k.v, k.algo, k.op, n, ref[i], abs[i])
			if d := math.Abs(got[i] - ref[i]); !(d <= b) {
				t.Fatalf("N=%d %v: element %d = %v, want %v within %.3g (sum of |x| %.4g), off by %.3g",
					n, k, i, got[i], ref[i], b, abs[i], d)
			}
		}
	}
}

func firstDiff(dt dtype.DType, a, b []byte) int {
	for i := 0; i < len(a); i += dt.Size() {
		if !bytes.Equal(a[i:i+dt.Size()], b[i:i+dt.Size()]) {
			return i / dt.Size()
		}
	}
	return -1
}

// randomCases: every op and variant (float32, float16, bfloat16, and
// float32 data on a float16 and a bfloat16 wire) for each algorithm, on
// count elements.
func randomCases(count int, algos ...algo.Algorithm) []randomCase {
	var cases []randomCase
	for _, a := range algos {
		for _, op := range ops {
			for _, v := range variants {
				cases = append(cases, randomCase{count: count, op: op, v: v, algo: a})
			}
		}
	}
	return cases
}

// TestRandomFloats: random values of varied magnitudes (where the order
// of summation changes the bits), over real QUIC and TLS/TCP meshes on
// 127.0.0.1 and over shared memory, for the ring, tree, direct, shm,
// halving-doubling and hierarchical allreduces and every op and data type: every rank ends
// with the same bits, within randomBound of a float64 reference.
func TestRandomFloats(t *testing.T) {
	// 1031 elements in 256-byte slices: several slices per chunk, and
	// chunks and tree halves of unequal length.
	const count = 1031
	cfg := Config{SliceBytes: 256}
	t.Run("quic-N3", func(t *testing.T) {
		checkRandom(t, loopback(t, 3, "quic"), cfg, randomCases(count, algo.Ring, algo.Tree, algo.Direct, algo.HalvingDoubling, algo.RecursiveDoubling), [2]int{})
	})
	t.Run("tcp-N3", func(t *testing.T) {
		checkRandom(t, loopback(t, 3, "tcp"), cfg, randomCases(count, algo.Ring, algo.Tree, algo.Direct, algo.HalvingDoubling, algo.RecursiveDoubling), [2]int{})
	})
	t.Run("shm-N3", func(t *testing.T) {
		// the shm allreduce over the group segment, and the message-passing
		// ones over the pair segments; the last cases take two rounds of the
		// shm allreduce (float32) and several in the wire format
		ts := loopback(t, 3, "shm")
		cases := randomCases(count, algo.Shared, algo.Ring, algo.Tree, algo.Direct, algo.HalvingDoubling, algo.RecursiveDoubling)
		for _, op := range ops {
			cases = append(cases, randomCase{DefaultSharedRoundBytes/4 + 4099, op, variant{dtype.Float32, dtype.Float32}, algo.Shared},
				randomCase{DefaultSharedRoundBytes/4 + 4099, op, variant{dtype.Float32, dtype.BFloat16}, algo.Shared})
		}
		checkRandom(t, ts, cfg, cases, [2]int{})
	})
	// two "hosts" of two ranks each (host names given to real meshes):
	// a reduce-scatter on each host, the allreduce of each part across
	// hosts (ring or tree), an allgather on each host
	t.Run("hier-quic-2x2", func(t *testing.T) {
		ts := withHosts(loopback(t, 4, "quic"), "a", "a", "b", "b")
		checkRandom(t, ts, cfg, randomCases(count, algo.Ring, algo.Tree, algo.HalvingDoubling, algo.RecursiveDoubling), [2]int{2, 2})
	})
	t.Run("hier-shm-2x2", func(t *testing.T) {
		// every pair through shared memory (the group segment hidden, so
		// the hierarchical allreduce runs on the pair segments)
		ts := withHosts(loopback(t, 4, "shm"), "a", "b", "a", "b")
		checkRandom(t, ts, cfg, randomCases(count, algo.Ring, algo.Tree, algo.HalvingDoubling, algo.RecursiveDoubling), [2]int{2, 2})
	})
}
