package collective

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/gorun/gorun/rank/ranktest"
)

// pattern is rank r's deterministic test bytes.
func pattern(r, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r*31 + i*7 + i>>8)
	}
	return b
}

func byteLengths(n int) []int {
	return []int{0, 1, n - 1, n + 1, 13, 4099, 70001}
}

// TestBroadcastEveryRoot: every root, awkward lengths, N 1..8.
func TestBroadcastEveryRoot(t *testing.T) {
	for n := 1; n <= 8; n++ {
		t.Run(fmt.Sprint("N", n), func(t *testing.T) {
			t.Parallel()
			errs := group(ranktest.InMemory(n, 2), Config{SliceBytes: 256}, func(c *Communicator) error {
				for root := 0; root < n; root++ {
					for _, l := range byteLengths(n) {
						if l < 0 {
							continue
						}
						buf := pattern(c.Rank()+100, l) // garbage except on the root
						if c.Rank() == root {
							buf = pattern(root, l)
						}
						if err := c.Broadcast(testCtx(t), buf, root); err != nil {
							return err
						}
						if !bytes.Equal(buf, pattern(root, l)) {
							return fmt.Errorf("broadcast of %d bytes from root %d: wrong bytes", l, root)
						}
					}
				}
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestAllgather(t *testing.T) {
	for n := 1; n <= 8; n++ {
		t.Run(fmt.Sprint("N", n), func(t *testing.T) {
			t.Parallel()
			errs := group(ranktest.InMemory(n, 3), Config{SliceBytes: 128}, func(c *Communicator) error {
				for _, l := range byteLengths(n) {
					if l < 0 {
						continue
					}
					recv := make([]byte, n*l)
					for i := range recv {
						recv[i] = 0xEE
					}
					if err := c.Allgather(testCtx(t), pattern(c.Rank(), l), recv); err != nil {
						return err
					}
					for r := 0; r < n; r++ {
						if !bytes.Equal(recv[r*l:(r+1)*l], pattern(r, l)) {
							return fmt.Errorf("allgather of %d bytes per rank: block %d wrong", l, r)
						}
					}
				}
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestReduceScatter: block r of the reduction lands on rank r, for every
// op and data type (small integers: exact).
func TestReduceScatter(t *testing.T) {
	for n := 1; n <= 8; n++ {
		t.Run(fmt.Sprint("N", n), func(t *testing.T) {
			t.Parallel()
			type tc struct {
				per int
				op  Op
				v   variant
			}
			var cases []tc
			for _, per := range []int{0, 1, n + 1, 37, 1001} {
				for _, op := range ops {
					for _, v := range variants {
						cases = append(cases, tc{per, op, v})
					}
				}
			}
			got := make([][][]byte, n)
			errs := group(ranktest.InMemory(n, 2), Config{SliceBytes: 64}, func(c *Communicator) error {
				for _, k := range cases {
					vals := make([]float64, n*k.per)
					for i := range vals {
						vals[i] = intValue(c.Rank(), i)
					}
					send := makeBuf(k.v.dt, vals)
					keep := append([]byte(nil), send...)
					recv := make([]byte, k.per*k.v.dt.Size())
					var o []CallOption
					if k.v.wire != k.v.dt {
						o = append(o, WithWire(k.v.wire))
					}
					if err := c.ReduceScatter(testCtx(t), send, recv, k.v.dt, k.op, o...); err != nil {
						return fmt.Errorf("%d per rank %s %s wire %s: %w", k.per, k.op, k.v.dt, k.v.wire, err)
					}
					if !bytes.Equal(send, keep) {
						return fmt.Errorf("reduce-scatter modified its send buffer")
					}
					got[c.Rank()] = append(got[c.Rank()], recv)
				}
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			for ci, k := range cases {
				vals := make([][]float64, n)
				for r := range vals {
					vals[r] = make([]float64, n*k.per)
					for i := range vals[r] {
						vals[r][i] = intValue(r, i)
					}
				}
				ref := reference(vals, k.op)
				for r := 0; r < n; r++ {
					res := readBuf(k.v.dt, got[r][ci])
					for i, x := range res {
						// the owner keeps its own result: no final wire rounding
						want := expectInt(ref[r*k.per+i], n, k.op, variant{k.v.dt, k.v.dt})
						if x != want {
							t.Fatalf("N=%d %d per rank %s %s wire %s: rank %d element %d = %v, want %v",
								n, k.per, k.op, k.v.dt, k.v.wire, r, i, x, want)
						}
					}
				}
			}
		})
	}
}

// TestBarrier: no rank leaves a barrier before every rank has entered it.
func TestBarrier(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 8} {
		t.Run(fmt.Sprint("N", n), func(t *testing.T) {
			t.Parallel()
			const rounds = 20
			var entered [rounds]chan int
			for i := range entered {
				entered[i] = make(chan int, n)
			}
			errs := group(ranktest.InMemory(n, 2), Config{}, func(c *Communicator) error {
				for i := 0; i < rounds; i++ {
					entered[i] <- c.Rank()
					if err := c.Barrier(testCtx(t)); err != nil {
						return err
					}
					if len(entered[i]) != n {
						return fmt.Errorf("round %d: rank %d left the barrier when %d of %d ranks had entered", i, c.Rank(), len(entered[i]), n)
					}
				}
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
		})
	}
}
