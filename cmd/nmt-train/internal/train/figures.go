package train

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"

	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/report"
	"github.com/gorun/gorun/transformer"
)

// traffic is what this rank has moved so far, in bytes, by medium: over
// the network (QUIC or TCP: the messages to peers that shared memory does
// not reach) and through shared memory (the messages on the pair rings,
// and the host's group segment, where the shm allreduce works).
type traffic struct{ netOut, netIn, shmOut, shmIn uint64 }

func meshTraffic(m *rank.Mesh) traffic {
	var t traffic
	for p, s := range m.Stats() {
		if m.PeerTransport(p) == "shm" {
			t.shmOut, t.shmIn = t.shmOut+s.BytesSent, t.shmIn+s.BytesRecv
		} else {
			t.netOut, t.netIn = t.netOut+s.BytesSent, t.netIn+s.BytesRecv
		}
		t.shmOut, t.shmIn = t.shmOut+s.GroupSent, t.shmIn+s.GroupRecv
	}
	return t
}

// rankFigures are one rank's figures of a log interval.
type rankFigures struct {
	cpuPct                       float64 // CPU time over the interval, % of the cores given to the rank
	netOut, netIn, shmOut, shmIn float64 // MB/s
}

// figuresOf is the figures of the interval of secs seconds that ends
// with now (traffic) after last.
func figuresOf(now, last traffic, secs, cpuPct float64) rankFigures {
	rate := func(a, b uint64) float64 { return float64(a-b) / secs / 1e6 }
	return rankFigures{cpuPct: cpuPct, netOut: rate(now.netOut, last.netOut), netIn: rate(now.netIn, last.netIn),
		shmOut: rate(now.shmOut, last.shmOut), shmIn: rate(now.shmIn, last.shmIn)}
}

// gatherFigures adds every rank's figures of the log interval to vals
// (own is this rank's; its GPU's are taken here): cpu_util_pct,
// net_out_MBps, net_in_MBps, shm_out_MBps and shm_in_MBps, the means over
// the ranks, and cpu_util_pct_rankR, each rank's; from the ranks that have
// a GPU, gpu_util_pct and gpu_mem_used_MiB (their mean; _rankR: each
// rank's) and gpu_mem_peak_MiB (the largest of gorun's own peaks). It
// returns the log line's GPU part. Every rank calls it at the same step:
// the figures travel in one small allreduce, each rank filling its own
// slots.
func (t *Trainer) gatherFigures(ctx context.Context, own rankFigures, vals map[string]float64) (string, error) {
	const k = 8 // slots per rank
	n := t.id.Size
	v := make([]float64, k*n)
	mine := v[k*t.id.Rank : k*t.id.Rank+k]
	copy(mine, []float64{own.cpuPct, own.netOut, own.netIn, own.shmOut, own.shmIn})
	if util, used, peak, ok := t.gpu.take(); ok {
		mine[5], mine[6], mine[7] = util+1, used+1, peak+1 // 0: no GPU
	}
	if n > 1 {
		var err error
		if v, err = t.allreduceSums(ctx, v); err != nil {
			return "", err
		}
	}
	var cpu, no, ni, so, si float64
	for r := 0; r < n; r++ {
		f := v[k*r : k*r+k]
		cpu, no, ni, so, si = cpu+f[0], no+f[1], ni+f[2], so+f[3], si+f[4]
		if n > 1 {
			vals[fmt.Sprintf("cpu_util_pct_rank%d", r)] = f[0]
		}
	}
	vals["cpu_util_pct"], vals["net_out_MBps"], vals["net_in_MBps"], vals["shm_out_MBps"], vals["shm_in_MBps"] =
		cpu/float64(n), no/float64(n), ni/float64(n), so/float64(n), si/float64(n)

	var su, sm, pk float64
	lo, hi := math.Inf(1), math.Inf(-1)
	g := 0
	for r := 0; r < n; r++ {
		f := v[k*r : k*r+k]
		if f[5] <= 0 {
			continue // no GPU figures from this rank
		}
		u, m, p := f[5]-1, f[6]-1, f[7]-1
		if n > 1 {
			vals[fmt.Sprintf("gpu_util_pct_rank%d", r)] = u
			vals[fmt.Sprintf("gpu_mem_used_MiB_rank%d", r)] = m
		}
		su, sm, pk = su+u, sm+m, max(pk, p)
		lo, hi = min(lo, u), max(hi, u)
		g++
	}
	if g == 0 {
		return "", nil
	}
	vals["gpu_util_pct"], vals["gpu_mem_used_MiB"], vals["gpu_mem_peak_MiB"] = su/float64(g), sm/float64(g), pk
	note := fmt.Sprintf(" | GPU %.0f %% busy, %s MiB", su/float64(g), report.Commas(int64(sm/float64(g))))
	if g > 1 {
		note = fmt.Sprintf(" | GPUs %.0f %% busy (ranks %.0f-%.0f %%), %s MiB each", su/float64(g), lo, hi, report.Commas(int64(sm/float64(g))))
	}
	return note, nil
}

// cpuModel is the host's CPU as /proc/cpuinfo names it ("" where it does
// not).
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}

// WriteReport writes the run directory's report (report.Write),
// with the learning rate of the run's policy as run.json describes it.
func WriteReport(dir string) (string, error) {
	ri, err := metrics.ReadRunInfo(dir)
	if err != nil {
		return "", fmt.Errorf("%s is not a run directory: %w", dir, err)
	}
	var lr report.Schedule
	if p, err := transformer.ParsePolicy(ri.LRPolicy, ri.LearningRate, ri.DModel, ri.Warmup); err == nil {
		lr = p.LR
	}
	return report.Write(dir, lr)
}
