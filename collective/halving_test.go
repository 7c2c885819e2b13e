package collective

import (
	"math/bits"
	"testing"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank/ranktest"
)

// hdSim executes the plans (hdPlanFor or rdPlanFor) of every rank of a
// world of n on count elements, with buffered sends and blocking
// receives, as the executor does: each element holds how many times each
// rank's contribution went into it. It checks that the two ends of every
// step agree on the ranges, that no rank waits forever and that every
// rank ends with every contribution exactly once in every element, and
// returns the elements each rank finished (own) and the elements each
// rank sent.
func hdSim(t *testing.T, planFor func(rank, world, count int) hdPlan, n, count int) (owns []span, sent []int) {
	t.Helper()
	plans := make([]hdPlan, n)
	bufs := make([][][]int, n)
	for r := range plans {
		plans[r] = planFor(r, n, count)
		bufs[r] = make([][]int, count)
		for i := range bufs[r] {
			bufs[r][i] = make([]int, n)
			bufs[r][i][r] = 1
		}
		owns = append(owns, plans[r].own)
	}
	type msg struct {
		s    span
		data [][]int
	}
	queue := map[[2]int][]msg{} // (from, to) -> messages in order
	pc := make([]int, n)
	didSend := make([]bool, n)
	sent = make([]int, n)
	finished := make([]bool, n)
	for progress := true; progress; {
		progress = false
		for r := 0; r < n; r++ {
			p := plans[r]
			if pc[r] == p.rs && !finished[r] {
				finished[r] = true // the owner finishes own here (nothing to simulate)
			}
			if pc[r] >= len(p.steps) {
				continue
			}
			st := p.steps[pc[r]]
			if st.sends && !didSend[r] {
				d := make([][]int, st.send.len())
				for i := range d {
					d[i] = append([]int(nil), bufs[r][st.send.lo+i]...)
				}
				queue[[2]int{r, st.peer}] = append(queue[[2]int{r, st.peer}], msg{st.send, d})
				sent[r] += st.send.len()
				didSend[r], progress = true, true
			}
			if st.recvs {
				q := queue[[2]int{st.peer, r}]
				if len(q) == 0 {
					continue // wait
				}
				m := q[0]
				queue[[2]int{st.peer, r}] = q[1:]
				if m.s != st.recv {
					t.Fatalf("n=%d count=%d: rank %d step %d expects %v from rank %d, which sent %v", n, count, r, pc[r], st.recv, st.peer, m.s)
				}
				for i, v := range m.data {
					dst := bufs[r][st.recv.lo+i]
					for j := range dst {
						if st.reduce {
							dst[j] += v[j]
						} else {
							dst[j] = v[j]
						}
					}
				}
			}
			pc[r]++
			didSend[r], progress = false, true
		}
	}
	for r := range plans {
		if pc[r] < len(plans[r].steps) {
			t.Fatalf("n=%d count=%d: rank %d stuck at step %d of %d (deadlock)", n, count, r, pc[r], len(plans[r].steps))
		}
	}
	for k, q := range queue {
		if len(q) > 0 {
			t.Fatalf("n=%d count=%d: %d messages from rank %d to %d never received", n, count, len(q), k[0], k[1])
		}
	}
	for r := range bufs {
		for i, c := range bufs[r] {
			for j, x := range c {
				if x != 1 {
					t.Fatalf("n=%d count=%d: rank %d element %d has rank %d's contribution %d times", n, count, r, i, j, x)
				}
			}
		}
	}
	return owns, sent
}

// TestHalvingDoublingPlan simulates the plan on every world size 1..16
// and awkward lengths: every rank ends with every rank's contribution
// exactly once in every element; the ranks' own ranges partition the
// elements (each final value is computed once, then copied); the step
// count is 2 log2(p) (plus 2 on folded pairs); on a power of two each
// rank sends 2(P-1)/P of the buffer.
func TestHalvingDoublingPlan(t *testing.T) {
	for n := 1; n <= 16; n++ {
		pof2 := 1 << (bits.Len(uint(n)) - 1)
		k := bits.Len(uint(pof2)) - 1
		for _, count := range []int{0, 1, 2, 3, n - 1, n, n + 1, 2 * n, 7, 64, 97, 1000, 1024} {
			if count < 0 {
				continue
			}
			owns, sent := hdSim(t, hdPlanFor, n, count)
			owner := make([]int, count)
			for r, o := range owns {
				for i := o.lo; i < o.hi; i++ {
					owner[i]++
				}
				if o.lo < 0 || o.hi > count || o.lo > o.hi {
					t.Fatalf("n=%d count=%d: rank %d owns %v", n, count, r, o)
				}
			}
			for i, c := range owner {
				if c != 1 {
					t.Fatalf("n=%d count=%d: element %d finished by %d ranks", n, count, i, c)
				}
			}
			for r := 0; r < n; r++ {
				p := hdPlanFor(r, n, count)
				want := 2 * k
				if r < 2*(n-pof2) {
					want += 2
					if r%2 == 0 {
						want = 2
					}
				}
				if len(p.steps) != want {
					t.Fatalf("n=%d: rank %d has %d steps, want %d", n, r, len(p.steps), want)
				}
				if n == pof2 && count%n == 0 && sent[r] != 2*(n-1)*count/n {
					t.Fatalf("n=%d count=%d: rank %d sent %d elements, want 2(n-1)/n*count = %d", n, count, r, sent[r], 2*(n-1)*count/n)
				}
			}
		}
	}
}

// TestHalvingDoublingTag: the algorithm travels in 4 bits of the tag.
func TestHalvingDoublingTag(t *testing.T) {
	c := call{kind: kAllreduce, count: 5, dtype: dtype.Float32, op: Average, wire: dtype.BFloat16, algo: algo.HalvingDoubling}
	if got := fromTag(c.tag(0)); got.algo != algo.HalvingDoubling || got.wire != dtype.BFloat16 || got.op != Average {
		t.Errorf("tag round trip: %+v", got)
	}
}

// TestHalvingDoublingBytes: the executor moves what the plan says, to
// the peers it names and no others (the transport's byte counters: every
// step's range in the wire format, plus the call's 9-byte header to the
// ring successor), over world sizes 2..8 and both wire widths; on a
// power of two that is 2(P-1)/P of the buffer per rank.
func TestHalvingDoublingBytes(t *testing.T) {
	const count = 4096
	for n := 2; n <= 8; n++ {
		for _, v := range []variant{{dtype.Float32, dtype.Float32}, {dtype.Float32, dtype.BFloat16}} {
			for r, total := range checkPlanBytes(t, algo.HalvingDoubling, hdPlanFor, n, count, v) {
				if n&(n-1) == 0 && total != uint64(2*(n-1)*count/n*v.wire.Size()) {
					t.Errorf("N=%d: rank %d sent %d bytes, want 2(N-1)/N of %d", n, r, total, count*v.wire.Size())
				}
			}
		}
	}
}

// checkPlanBytes runs an allreduce of count elements with algorithm a on
// n ranks in process and checks that every rank sent each peer what its
// plan (planFor) says, plus the call's header to its ring successor. It
// returns the bytes each rank's plan sends.
func checkPlanBytes(t *testing.T, a algo.Algorithm, planFor func(rank, world, count int) hdPlan, n, count int, v variant) []uint64 {
	t.Helper()
	ts := ranktest.InMemory(n, 2)
	defer ranktest.CloseAll(ts)
	errs := group(ts, Config{SliceBytes: 1024}, func(c *Communicator) error {
		buf := make([]byte, count*v.dt.Size())
		o := []CallOption{WithAlgorithm(a)}
		if v.wire != v.dt {
			o = append(o, WithWire(v.wire))
		}
		return c.Allreduce(testCtx(t), nil, buf, v.dt, Sum, o...)
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	ws := v.wire.Size()
	totals := make([]uint64, n)
	for r, tr := range ts {
		want := make([]uint64, n)
		want[(r+1)%n] += uint64(len(settings(0, 0, 0, 0, false)))
		for _, st := range planFor(r, n, count).steps {
			if st.sends {
				want[st.peer] += uint64(st.send.len() * ws)
				totals[r] += uint64(st.send.len() * ws)
			}
		}
		for p, s := range tr.Stats() {
			if p != r && s.BytesSent != want[p] {
				t.Errorf("%v N=%d wire %s: rank %d sent %d bytes to rank %d, the plan %d", a, n, v.wire, r, s.BytesSent, p, want[p])
			}
		}
	}
	return totals
}
