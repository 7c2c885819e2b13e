package collective

import (
	"fmt"
	"testing"
)

// ringSim executes the ring plans of every rank of a ring of n, channel c
// of nch, on count elements (float32 on the wire, sliceBytes per slice),
// with unbounded links, as the executor does: each rank sends in its
// plan's order (a step's slice as soon as the slice it forwards has come),
// receives in its plan's order, combines in the reduce-scatter and stores
// in the allgather. Each element holds how many times each rank's
// contribution went into it. It checks that the two ends of every link
// agree on every message's elements and that every send after the first
// step forwards the chunk received at the step before, and returns the
// final buffers.
func ringSim(t *testing.T, n, nch, c, count, sliceBytes int, rs, ag bool) [][][]int {
	t.Helper()
	chunks := split(count, n)
	plans := make([]ringPlan, n)
	bufs := make([][][]int, n)
	for r := range plans {
		plans[r] = ringPlanFor(chunks, nch, c, n, r, 4, sliceBytes, rs, ag)
		bufs[r] = make([][]int, count)
		for i := range bufs[r] {
			bufs[r][i] = make([]int, n)
			if rs || !ag {
				bufs[r][i][r] = 1
			}
		}
		if !rs { // allgather alone: each rank starts with its own chunk complete
			for i := chunks[r]; i < chunks[r+1]; i++ {
				for j := range bufs[r][i] {
					bufs[r][i][j] = 1
				}
			}
		}
		p := plans[r]
		for tt := 1; tt < p.T; tt++ {
			if p.sendChunks[tt] != p.recvChunks[tt-1] {
				t.Fatalf("n=%d rank %d: step %d sends chunk %d, not the chunk %d it received at step %d", n, r, tt, p.sendChunks[tt], p.recvChunks[tt-1], tt-1)
			}
		}
	}
	type msg struct {
		lo, hi int
		data   [][]int
	}
	links := make([][]msg, n) // links[r]: messages from r to r+1, in order
	sent := make([]int, n)    // sends made so far
	got := make([]int, n)     // receives done so far
	done := make([]map[ringMsg]bool, n)
	for r := range done {
		done[r] = map[ringMsg]bool{}
	}
	for progress := true; progress; {
		progress = false
		for r := 0; r < n; r++ {
			p := plans[r]
			for sent[r] < len(p.sends) {
				m := p.sends[sent[r]]
				if m.t > 0 && !done[r][ringMsg{m.t - 1, m.k}] {
					break
				}
				lo, hi := p.slice(p.sendChunks[m.t], m.k)
				d := make([][]int, hi-lo)
				for i := range d {
					d[i] = append([]int(nil), bufs[r][lo+i]...)
				}
				links[r] = append(links[r], msg{lo, hi, d})
				sent[r]++
				progress = true
			}
			prev := (r + n - 1) % n
			for got[r] < len(p.recvs) && len(links[prev]) > 0 {
				m := p.recvs[got[r]]
				in := links[prev][0]
				links[prev] = links[prev][1:]
				lo, hi := p.slice(p.recvChunks[m.t], m.k)
				if in.lo != lo || in.hi != hi {
					t.Fatalf("n=%d nch=%d count=%d: rank %d's receive %d (%+v) expects elements [%d, %d), rank %d sent [%d, %d)", n, nch, count, r, got[r], m, lo, hi, prev, in.lo, in.hi)
				}
				for i, v := range in.data {
					dst := bufs[r][lo+i]
					for j := range dst {
						if m.t < p.nRS {
							dst[j] += v[j]
						} else {
							dst[j] = v[j]
						}
					}
				}
				done[r][m] = true
				got[r]++
				progress = true
			}
		}
	}
	for r := range plans {
		if got[r] < len(plans[r].recvs) || sent[r] < len(plans[r].sends) {
			t.Fatalf("n=%d nch=%d count=%d: rank %d stuck after %d of %d receives and %d of %d sends", n, nch, count, r, got[r], len(plans[r].recvs), sent[r], len(plans[r].sends))
		}
		if len(links[r]) > 0 {
			t.Fatalf("n=%d nch=%d count=%d: %d messages from rank %d never received", n, nch, count, len(links[r]), r)
		}
	}
	return bufs
}

// TestRingPlan simulates the ring's plan (a pure function of the ring's
// shape) on 2..8 ranks, 1..3 channels, awkward lengths and slices small
// enough for many slices and several slice groups: the ends of every link
// agree on every message; after reduce-scatter and allgather every rank
// holds every contribution once in every element of its channel's part;
// after reduce-scatter alone rank r's chunk does; after allgather alone
// every rank holds every chunk whole.
func TestRingPlan(t *testing.T) {
	for n := 2; n <= 8; n++ {
		for nch := 1; nch <= 3; nch++ {
			for _, count := range []int{0, 1, n - 1, n, n + 1, 7, 97, 1031, 20000} {
				for _, phases := range [][2]bool{{true, true}, {true, false}, {false, true}} {
					t.Run(fmt.Sprintf("n%d/ch%d/%d/rs=%v,ag=%v", n, nch, count, phases[0], phases[1]), func(t *testing.T) {
						chunks := split(count, n)
						for c := 0; c < nch; c++ {
							bufs := ringSim(t, n, nch, c, count, 64, phases[0], phases[1])
							p := ringPlanFor(chunks, nch, c, n, 0, 4, 64, phases[0], phases[1])
							for r := range bufs {
								for j := 0; j < n; j++ {
									if phases[0] && !phases[1] && j != r {
										continue // reduce-scatter alone: only rank r's chunk is complete
									}
									s := p.segs[j]
									for i := s.lo; i < s.hi; i++ {
										for q, x := range bufs[r][i] {
											if x != 1 {
												t.Fatalf("channel %d: rank %d element %d (chunk %d) has rank %d's contribution %d times", c, r, i, j, q, x)
											}
										}
									}
								}
							}
						}
					})
				}
			}
		}
	}
}
