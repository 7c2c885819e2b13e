// Command archeck is the multi-host tests' allreduce probe: every rank
// allreduces a float32 buffer whose expected sum is known exactly, checks
// every element, and rank 0 prints one line with the time and the bus
// bandwidth (nccl-tests convention: busbw = algbw * 2(n-1)/n).
//
//	gorun -np 4 -hostfile H archeck -bytes 64M -iters 3
//
// It exists so that test/multihost depends on nothing but the rank and
// collective packages; bin/allreduce-perf is the benchmark.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/internal/envconf"
	"github.com/gorun/gorun/plan"
	"github.com/gorun/gorun/rank"
)

func main() {
	size := flag.String("bytes", "1M", "message size in bytes (suffix K, M: KiB, MiB)")
	iters := flag.Int("iters", 3, "timed allreduces (after one warm-up)")
	timeout := flag.Duration("timeout", 0, "give up on a silent peer after this long (default GORUN_TIMEOUT or 60s)")
	duration := flag.Duration("duration", 0, "after the timed allreduces, go on allreducing until this much time has passed (for fault tests)")
	flag.Parse()
	n, err := parseSize(*size)
	if err != nil {
		fmt.Fprintln(os.Stderr, "archeck: -bytes:", err)
		os.Exit(2)
	}
	if err := run(n, *iters, *timeout, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "archeck:", err)
		os.Exit(1)
	}
}

func parseSize(s string) (int, error) {
	mul := 1
	switch {
	case strings.HasSuffix(s, "K"):
		mul, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mul, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q: want a non-negative size like 4096, 64K or 16M", s)
	}
	return v * mul / 4 * 4, nil
}

// run returns on the first error without closing the mesh, so that the
// error (which names the peer) is printed at once: closing first would let
// the peers fail on "connection closed" and the launcher stop this rank
// before it said why.
func run(bytes, iters int, timeout, duration time.Duration) error {
	id, err := rank.FromEnv()
	if err != nil {
		return err
	}
	ctx := context.Background()
	start := time.Now()
	opt, err := envconf.Mesh(os.LookupEnv, rank.Options{Timeout: timeout})
	if err != nil {
		return err
	}
	m, err := rank.Connect(ctx, id, opt)
	if err != nil {
		return err
	}
	cfg, err := envconf.Collective(os.LookupEnv)
	if err != nil {
		return err
	}
	cfg.Across = plan.Across(m.TransportChoice())
	c, err := collective.New(m, cfg)
	if err != nil {
		return err
	}
	me, size := id.Rank, id.Size
	buf := make([]float32, bytes/4)
	fill := func() {
		for i := range buf {
			buf[i] = float32(i%97 + me)
		}
	}
	wrong := 0
	check := func() {
		base := float32(size * (size - 1) / 2)
		for i, v := range buf {
			if v != float32(size*(i%97))+base {
				wrong++
			}
		}
	}
	b := collective.Float32Bytes(buf)
	fill()
	if err := c.Allreduce(ctx, nil, b, dtype.Float32, collective.Sum); err != nil {
		return err
	}
	check()
	var best, total time.Duration
	var times []time.Duration
	for it := 0; it < iters; it++ {
		fill()
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		t0 := time.Now()
		if err := c.Allreduce(ctx, nil, b, dtype.Float32, collective.Sum); err != nil {
			return err
		}
		d := time.Since(t0)
		check()
		total += d
		times = append(times, d)
		if best == 0 || d < best {
			best = d
		}
	}
	if wrong > 0 {
		return fmt.Errorf("rank %d: %d wrong elements", me, wrong)
	}
	if duration > 0 && me == 0 {
		fmt.Printf("archeck: rank 0: running until %v have passed\n", duration)
	}
	more := 0
	for duration > 0 {
		fill()
		if err := c.Allreduce(ctx, nil, b, dtype.Float32, collective.Sum); err != nil {
			return err
		}
		check()
		if wrong > 0 {
			return fmt.Errorf("rank %d: %d wrong elements", me, wrong)
		}
		more++
		// Every rank must agree when to stop: rank 0 decides, and the
		// decision travels with the next allreduce's result.
		stop := float32(0)
		if me == 0 && time.Since(start) >= duration {
			stop = 1
		}
		flag := []float32{stop}
		if err := c.Allreduce(ctx, nil, collective.Float32Bytes(flag), dtype.Float32, collective.Sum); err != nil {
			return err
		}
		if flag[0] > 0 {
			break
		}
	}
	if me == 0 {
		bus := func(d time.Duration) float64 {
			if d <= 0 || size < 2 {
				return 0
			}
			return float64(bytes) / d.Seconds() * 2 * float64(size-1) / float64(size) / 1e9
		}
		avg, med := time.Duration(0), time.Duration(0)
		if iters > 0 {
			avg = total / time.Duration(iters)
			slices.Sort(times)
			med = times[len(times)/2]
		}
		fmt.Printf("archeck: %v\n", m.TransportChoice())
		fmt.Printf("archeck: np %d bytes %d algo %s iters %d wrong 0 best_s %.6f avg_s %.6f median_s %.6f busbw_best_GBps %.4f busbw_avg_GBps %.4f busbw_median_GBps %.4f more %d transport %s hosts %s\n",
			size, bytes, algoName(), iters, best.Seconds(), avg.Seconds(), med.Seconds(), bus(best), bus(avg), bus(med), more, m.TransportChoice().Transport, strings.Join(m.HostNames(), ","))
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	if err := c.Close(); err != nil {
		return err
	}
	return m.Close()
}

func algoName() string {
	if a := os.Getenv(envconf.Allreduce); a != "" {
		return a
	}
	return "auto"
}
