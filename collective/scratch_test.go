package collective

import (
	"runtime"
	"testing"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
)

// TestScratchReused: calls after the first take their receive slots and
// wire buffers from the runs before them, so that a steady stream of
// allreduces allocates little: with a slot allocated per call, an
// allreduce of 1 MiB at np 2 allocated over 1 MiB each time. What a
// call allocates may grow with its number of slices (the schedule), not
// faster: the ring once cut a segment anew for every slice it touched,
// 7.6 MB of garbage per 64 MiB call (here 1.3 MB are allowed), and at
// 256 MiB the heap it grew into cost fresh pages that halved busbw.
func TestScratchReused(t *testing.T) {
	ts := loopback(t, 2, "tcp")
	cases := []struct {
		v            variant
		count, calls int
	}{
		{variant{dtype.Float32, dtype.Float32}, 1 << 18, 20},
		{variant{dtype.Float32, dtype.Float16}, 1 << 18, 20},
		{variant{dtype.Float32, dtype.Float32}, 1 << 24, 3},
	}
	for _, tc := range cases {
		v := tc.v
		for _, a := range []algo.Algorithm{algo.Ring, algo.Tree, algo.HalvingDoubling, algo.RecursiveDoubling} {
			var perCall uint64
			errs := group(ts, Config{}, func(c *Communicator) error {
				buf := make([]byte, tc.count*v.dt.Size())
				opts := []CallOption{WithAlgorithm(a), WithWire(v.wire)}
				for i := 0; i < 3; i++ {
					if err := c.Allreduce(testCtx(t), nil, buf, v.dt, Sum, opts...); err != nil {
						return err
					}
				}
				if c.Rank() != 0 {
					for i := 0; i < tc.calls; i++ {
						if err := c.Allreduce(testCtx(t), nil, buf, v.dt, Sum, opts...); err != nil {
							return err
						}
					}
					return nil
				}
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				for i := 0; i < tc.calls; i++ {
					if err := c.Allreduce(testCtx(t), nil, buf, v.dt, Sum, opts...); err != nil {
						return err
					}
				}
				runtime.ReadMemStats(&after)
				perCall = (after.TotalAlloc - before.TotalAlloc) / uint64(tc.calls)
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			// both ranks run in this process: their allocations add up
			mib := tc.count * v.dt.Size() >> 20
			t.Logf("%v %v %d MiB: %d bytes allocated per call", v, a, mib, perCall)
			if perCall > 256<<10+uint64(tc.count*v.dt.Size()/64) {
				t.Errorf("%v %v: %d bytes allocated per call of %d MiB, want the slots reused and no garbage per slice", v, a, perCall, mib)
			}
		}
	}
}
