package cuda

import (
	"fmt"
	"slices"
	"strings"
	"unsafe"
)

// EnvProfile turns the backend's profiler on (1) or off (0, unset):
// every operation queued on the compute stream (kernel, GEMM, memset,
// copy) is timed on the GPU between two CUDA events, and Profile sums the
// times by operation (Settings.Profile; a program reads the variable at
// its start, internal/envconf.CUDA). It costs two event records per operation, so a profiled run
// is for finding where the time goes, not for timing the whole.
const EnvProfile = "GORUN_CUDA_PROFILE"

// OpTime is the GPU time of one kind of operation: a kernel by name, a
// GEMM by types and shape, a memset or copy by direction.
type OpTime struct {
	Op      string
	Calls   int
	Seconds float64
}

// The copies' names in a profile.
const (
	opHostToDevice = "copy host to device"
	opDeviceToHost = "copy device to host"
)

// profiler keeps the event pairs of the operations queued since the last
// collect, and the sums of those collected.
type profiler struct {
	d       *driver
	stream  uintptr
	spare   []uintptr // recorded and read: free to record again
	start   uintptr   // recorded before the operation being queued
	pending []mark
	sums    map[string]*OpTime
}

type mark struct {
	op         string
	start, end uintptr
}

// collectEvery bounds the pairs kept before a collect that waits for them.
const collectEvery = 1 << 14

func (p *profiler) event() uintptr {
	if n := len(p.spare); n > 0 {
		ev := p.spare[n-1]
		p.spare = p.spare[:n-1]
		return ev
	}
	var ev uintptr
	p.d.must("cuEventCreate", p.d.call(p.d.eventCreate, uintptr(unsafe.Pointer(&ev)), 0))
	return ev
}

// begin records the start of the next operation on the stream.
func (p *profiler) begin() {
	p.start = p.event()
	p.d.must("cuEventRecord", p.d.call(p.d.eventRecord, p.start, p.stream))
}

// end records its end and keeps the pair under op's name.
func (p *profiler) end(op string) {
	ev := p.event()
	p.d.must("cuEventRecord", p.d.call(p.d.eventRecord, ev, p.stream))
	p.pending = append(p.pending, mark{op, p.start, ev})
	if len(p.pending) >= collectEvery {
		p.collect()
	}
}

// collect waits for the last pair and adds every pair's time to its sum.
func (p *profiler) collect() {
	if len(p.pending) == 0 {
		return
	}
	last := p.pending[len(p.pending)-1].end
	p.d.must("cuEventSynchronize", p.d.call(p.d.eventSynchronize, last))
	for _, m := range p.pending {
		var ms float32
		p.d.must("cuEventElapsedTime", p.d.call(p.d.eventElapsed, uintptr(unsafe.Pointer(&ms)), m.start, m.end))
		s := p.sums[m.op]
		if s == nil {
			s = &OpTime{Op: m.op}
			p.sums[m.op] = s
		}
		s.Calls++
		s.Seconds += float64(ms) / 1e3
		p.spare = append(p.spare, m.start, m.end)
	}
	p.pending = p.pending[:0]
}

// begin and end bracket one operation queued on the compute stream: end
// counts it (Counts), and when the profiler is on the two time it; op
// names it. GEMMs are counted and named in Backend.gemm.
func (b *Backend) begin() {
	if b.prof != nil {
		b.prof.begin()
	}
}

func (b *Backend) end(op string) {
	switch {
	case strings.HasPrefix(op, "gr_"):
		b.counts.Kernels++
	case op == "memset":
		b.counts.Memsets++
	default:
		b.counts.Copies++
	}
	if b.prof != nil {
		b.prof.end(op)
	}
}

// Counts are the operations the backend queued on its compute stream, by
// kind, and the times the host waited for that stream, since the backend
// opened or the last TakeCounts. Counted always (an increment each), with
// or without the profiler.
type Counts struct {
	Kernels int // launches of kernels.cu's kernels (cuLaunchKernel)
	GEMMs   int // cuBLAS calls (each launches one or more kernels on a GPU)
	Memsets int // cuMemsetD8Async (Alloc's and Zero's zeroing, the reduction buffer)
	Copies  int // host to device, device to host, device to device
	// Syncs is the host waiting for the compute stream
	// (cuStreamSynchronize): Sync, Download, the scalar results
	// (CrossEntropy's loss, HasInfNaN, SumSquares) and TakeScalars. The
	// copy stream's Fences, waited on by the Bucketer's goroutine, and
	// the profiler's own waits are not counted.
	Syncs int
}

// Launches is everything queued on the stream: kernels, GEMMs, memsets
// and copies.
func (c Counts) Launches() int { return c.Kernels + c.GEMMs + c.Memsets + c.Copies }

func (c Counts) String() string {
	return fmt.Sprintf("%d launches (%d kernels, %d GEMMs, %d memsets, %d copies), %d host syncs",
		c.Launches(), c.Kernels, c.GEMMs, c.Memsets, c.Copies, c.Syncs)
}

// TakeCounts returns the counts and starts them again.
func (b *Backend) TakeCounts() Counts {
	c := b.counts
	b.counts = Counts{}
	return c
}

// Profiling reports whether GORUN_CUDA_PROFILE=1 turned the profiler on.
func (b *Backend) Profiling() bool { return b.prof != nil }

// TakeProfile waits for the operations queued so far and returns their
// GPU times summed by operation, the largest first, and starts the sums
// again; nil when the profiler is off.
func (b *Backend) TakeProfile() []OpTime {
	p := b.prof
	if p == nil {
		return nil
	}
	p.collect()
	out := make([]OpTime, 0, len(p.sums))
	for _, s := range p.sums {
		out = append(out, *s)
	}
	clear(p.sums)
	slices.SortFunc(out, func(a, c OpTime) int {
		if a.Seconds != c.Seconds {
			if a.Seconds > c.Seconds {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Op, c.Op)
	})
	return out
}

// FormatProfile prints ops as a table: the top rows, each with its calls
// (in all), its time a step (ops summed over steps) and a call, and its
// share of all of them, then what the rest and the whole take.
func FormatProfile(ops []OpTime, steps, top int) string {
	var total float64
	for _, o := range ops {
		total += o.Seconds
	}
	steps = max(steps, 1)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-56s %8s %11s %10s %6s\n", "operation", "calls", "ms a step", "µs a call", "share")
	row := func(name string, calls int, sec float64) {
		per := 0.0
		if calls > 0 {
			per = 1e6 * sec / float64(calls)
		}
		share := 0.0
		if total > 0 {
			share = 100 * sec / total
		}
		fmt.Fprintf(&sb, "%-56s %8d %11.3f %10.1f %5.1f%%\n", name, calls, 1e3*sec/float64(steps), per, share)
	}
	var restCalls int
	var rest float64
	for i, o := range ops {
		if i < top {
			row(o.Op, o.Calls, o.Seconds)
		} else {
			restCalls += o.Calls
			rest += o.Seconds
		}
	}
	if len(ops) > top {
		row(fmt.Sprintf("(%d other operations)", len(ops)-top), restCalls, rest)
	}
	calls := 0
	for _, o := range ops {
		calls += o.Calls
	}
	row("all, on the GPU", calls, total)
	return sb.String()
}
