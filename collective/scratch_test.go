package collective

import (
	"runtime"
	"testing"
)

// TestScratchReused: calls after the first take their receive slots and
// wire buffers from the runs before them, so that a steady stream of
// allreduces allocates little: with a slot allocated per call, an
// allreduce of 1 MiB at np 2 allocated over 1 MiB each time.
func TestScratchReused(t *testing.T) {
	ts := loopback(t, 2, "tcp")
	const count, calls = 1 << 18, 20
	for _, v := range []variant{{Float32, Float32}, {Float32, Float16}} {
		for _, algo := range []Algorithm{Ring, Tree, HalvingDoubling} {
			var perCall uint64
			errs := group(ts, Config{}, func(c *Communicator) error {
				buf := make([]byte, count*v.dt.Size())
				opts := []CallOption{WithAlgorithm(algo), WithWire(v.wire)}
				for i := 0; i < 3; i++ {
					if err := c.Allreduce(testCtx(t), nil, buf, v.dt, Sum, opts...); err != nil {
						return err
					}
				}
				if c.Rank() != 0 {
					for i := 0; i < calls; i++ {
						if err := c.Allreduce(testCtx(t), nil, buf, v.dt, Sum, opts...); err != nil {
							return err
						}
					}
					return nil
				}
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				for i := 0; i < calls; i++ {
					if err := c.Allreduce(testCtx(t), nil, buf, v.dt, Sum, opts...); err != nil {
						return err
					}
				}
				runtime.ReadMemStats(&after)
				perCall = (after.TotalAlloc - before.TotalAlloc) / calls
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			// both ranks run in this process: their allocations add up
			t.Logf("%v %v: %d bytes allocated per call", v, algo, perCall)
			if perCall > 256<<10 {
				t.Errorf("%v %v: %d bytes allocated per call of 1 MiB, want the slots reused", v, algo, perCall)
			}
		}
	}
}
