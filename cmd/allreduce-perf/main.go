// Command allreduce-perf measures gorun's Allreduce the way nccl-tests'
// all_reduce_perf measures NCCL's: for each size from -b to -e (times -f),
// -w warm-up and -n timed iterations, out of place and in place, and one
// row per size with the time, the algorithm bandwidth (size / time), the
// bus bandwidth (algbw * 2(n-1)/n, what each link carries) and, with -c 1,
// the number of wrong elements against a reference.
//
//	bin/gorun -np 4 bin/allreduce-perf -b 8 -e 256M -f 2 -d float -o sum -a auto
//
// With -C sendrecv it measures what nccl-tests' sendrecv_perf does instead:
// every rank sends the buffer to the next rank while it receives one from
// the previous rank, through the same mesh and transport, with no
// reduction. That is the traffic of every ring step, so its bandwidth is the
// ceiling a ring allreduce can reach on this transport (busbw = algbw).
//
// Started without a launcher it is rank 0 of 1.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/internal/envconf"
	"github.com/gorun/gorun/internal/version"
	"github.com/gorun/gorun/plan"
	"github.com/gorun/gorun/rank"
)

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// usageError is a bad flag or argument (exit status 2; a failure exits 1).
type usageError struct{ error }

type options struct {
	minBytes, maxBytes int64
	factor             int
	iters, warmup      int
	samples            int // the timed iterations split into this many samples
	dtype, wire        dtype.DType
	op                 collective.Op
	algo               algo.Algorithm
	check              bool
	timeout            time.Duration
	inPlace, outPlace  bool
	sendrecv           bool // -C sendrecv
}

func run(args []string, stdout, stderr io.Writer) int {
	status := 0
	app := &cli.App{
		Name:            "allreduce-perf",
		Usage:           "measure Allreduce bandwidth like nccl-tests' all_reduce_perf",
		UsageText:       "allreduce-perf [-b 8] [-e 64M] [-f 2] [-n 20] [-w 5] [-S 1] [-d float|half|bfloat16] [-o sum|avg|min|max] [-a auto|ring|tree|direct|shm|hd|rd] [-c 1] [-C allreduce|sendrecv]\n\nRun under a launcher: gorun -np 4 allreduce-perf ...",
		HideHelpCommand: true,
		Writer:          stdout,
		ErrWriter:       stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "minbytes", Aliases: []string{"b"}, Value: "8", Usage: "smallest size (bytes; K, M, G suffixes)"},
			&cli.StringFlag{Name: "maxbytes", Aliases: []string{"e"}, Value: "64M", Usage: "largest size (bytes; K, M, G suffixes)"},
			&cli.IntFlag{Name: "stepfactor", Aliases: []string{"f"}, Value: 2, Usage: "multiply the size by this between rows"},
			&cli.IntFlag{Name: "iters", Aliases: []string{"n"}, Value: 20, Usage: "timed iterations per size"},
			&cli.IntFlag{Name: "warmup_iters", Aliases: []string{"w"}, Value: 5, Usage: "untimed iterations per size"},
			&cli.IntFlag{Name: "samples", Aliases: []string{"S"}, Value: 1, Usage: "time the -n iterations as this many samples between barriers and report the median sample, each the slowest rank's (OpenMPI's and gloo's peers in bench/peers measure so); 1: one batch, the mean over the ranks, as nccl-tests"},
			&cli.StringFlag{Name: "datatype", Aliases: []string{"d"}, Value: "float", Usage: "float, half or bfloat16"},
			&cli.StringFlag{Name: "op", Aliases: []string{"o"}, Value: "sum", Usage: "sum, avg, min or max"},
			&cli.StringFlag{Name: "algo", Aliases: []string{"a"}, Value: "auto", Usage: "auto, ring, tree, direct, shm, hd (halving-doubling) or rd (recursive doubling) (auto: the cost model, or GORUN_ALLREDUCE)"},
			&cli.StringFlag{Name: "wire", Aliases: []string{"W"}, Value: "", Usage: "send float data as half or bfloat16 (default: the data type)"},
			&cli.IntFlag{Name: "check", Aliases: []string{"c"}, Value: 1, Usage: "1: check the results and count wrong elements; 0: do not"},
			&cli.IntFlag{Name: "inplace", Aliases: []string{"I"}, Value: 2, Usage: "0: out of place only, 1: in place only, 2: both"},
			&cli.StringFlag{Name: "collective", Aliases: []string{"C"}, Value: "allreduce", Usage: "allreduce, or sendrecv: each rank sends to the next and receives from the previous (nccl-tests' sendrecv_perf; the transport's ceiling for a ring)"},
			&cli.DurationFlag{Name: "timeout", Aliases: []string{"t"}, Value: 0, Usage: "give up on a peer after this long (default: the transport's, GORUN_TIMEOUT or 60s)"},
			&cli.BoolFlag{Name: "version", Usage: "print the version, commit, Go version and CPU features"},
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return usageError{fmt.Errorf("%w (see allreduce-perf --help)", err)}
		},
		ExitErrHandler: func(*cli.Context, error) {}, // one line, below, and the status it chooses
		Action: func(c *cli.Context) error {
			if c.Bool("version") {
				fmt.Fprint(stdout, version.String("allreduce-perf", ""))
				return nil
			}
			if c.NArg() > 0 {
				return usageError{fmt.Errorf("unexpected argument %q", c.Args().First())}
			}
			o, err := parseOptions(c)
			if err != nil {
				return usageError{err}
			}
			return bench(o, stdout)
		},
	}
	if err := app.Run(args); err != nil {
		fmt.Fprintln(stderr, "allreduce-perf:", err)
		// a usage error (as gorun's, mpirun.ExitUsage), or the CLI's "No
		// help topic" of --help X; any other error is a failure
		var ue usageError
		var help cli.ExitCoder
		if errors.As(err, &ue) || errors.As(err, &help) {
			status = 2
		} else {
			status = 1
		}
	}
	return status
}

// parseSize reads a byte count with an optional K, M or G suffix (powers
// of 1024; an optional trailing B or iB is accepted).
func parseSize(flag, s string) (int64, error) {
	v := strings.ToUpper(strings.TrimSpace(s))
	v = strings.TrimSuffix(strings.TrimSuffix(v, "B"), "I")
	mult := int64(1)
	if v != "" {
		switch v[len(v)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult > 1 {
			v = v[:len(v)-1]
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("-%s %q: want a byte count such as 8, 64K, 256M or 1G", flag, s)
	}
	return n * mult, nil
}

func parseOptions(c *cli.Context) (options, error) {
	var o options
	var err error
	if o.minBytes, err = parseSize("b", c.String("minbytes")); err != nil {
		return o, err
	}
	if o.maxBytes, err = parseSize("e", c.String("maxbytes")); err != nil {
		return o, err
	}
	if o.maxBytes < o.minBytes {
		return o, fmt.Errorf("-e %s is smaller than -b %s", c.String("maxbytes"), c.String("minbytes"))
	}
	if o.factor = c.Int("stepfactor"); o.factor < 2 && o.minBytes != o.maxBytes {
		return o, fmt.Errorf("-f %d: want a factor of at least 2", o.factor)
	}
	if o.iters = c.Int("iters"); o.iters < 1 {
		return o, fmt.Errorf("-n %d: want at least 1 iteration", o.iters)
	}
	if o.warmup = c.Int("warmup_iters"); o.warmup < 0 {
		return o, fmt.Errorf("-w %d: want 0 or more warm-up iterations", o.warmup)
	}
	if o.samples = c.Int("samples"); o.samples < 1 || o.samples > o.iters {
		return o, fmt.Errorf("-S %d: want 1 to -n (%d) samples", o.samples, o.iters)
	}
	if o.dtype, err = dtype.Parse(c.String("datatype")); err != nil {
		return o, fmt.Errorf("-d: %w", err)
	}
	o.wire = o.dtype
	if w := c.String("wire"); w != "" {
		if o.wire, err = dtype.Parse(w); err != nil {
			return o, fmt.Errorf("-W: %w", err)
		}
		if o.wire != o.dtype && o.dtype != dtype.Float32 {
			return o, fmt.Errorf("-W %s: only float data can be sent as half or bfloat16", w)
		}
	}
	if o.op, err = collective.ParseOp(c.String("op")); err != nil {
		return o, fmt.Errorf("-o: %w", err)
	}
	if o.algo, err = algo.ParseAlgorithm(c.String("algo")); err != nil {
		return o, fmt.Errorf("-a: %w", err)
	}
	switch c.Int("check") {
	case 0:
	case 1:
		o.check = true
	default:
		return o, fmt.Errorf("-c %d: want 0 or 1", c.Int("check"))
	}
	switch c.Int("inplace") {
	case 0:
		o.outPlace = true
	case 1:
		o.inPlace = true
	case 2:
		o.outPlace, o.inPlace = true, true
	default:
		return o, fmt.Errorf("-I %d: want 0, 1 or 2", c.Int("inplace"))
	}
	o.timeout = c.Duration("timeout")
	switch c.String("collective") {
	case "allreduce":
	case "sendrecv":
		o.sendrecv = true
		if c.IsSet("inplace") && o.inPlace {
			return o, fmt.Errorf("-I %d: sendrecv has no in-place form (use -I 0)", c.Int("inplace"))
		}
		if c.IsSet("algo") || c.IsSet("wire") || c.IsSet("op") {
			return o, fmt.Errorf("-C sendrecv reduces nothing: -a, -o and -W do not apply")
		}
		o.inPlace, o.outPlace = false, true
	default:
		return o, fmt.Errorf("-C %q: want allreduce or sendrecv", c.String("collective"))
	}
	return o, nil
}

func bench(o options, out io.Writer) error {
	id, err := rank.FromEnv()
	if err != nil {
		return err
	}
	procs, procsFrom := shareOfHost(id.LocalSize)
	ctx := context.Background()
	mopt, err := envconf.Mesh(os.LookupEnv, rank.Options{Timeout: o.timeout})
	if err != nil {
		return err
	}
	mesh, err := rank.Connect(ctx, id, mopt)
	if err != nil {
		return err
	}
	defer mesh.Close()
	cfg, err := envconf.Collective(os.LookupEnv)
	if err != nil {
		return err
	}
	if o.algo != algo.Auto {
		cfg.Algorithm = o.algo
	}
	cfg.Across = plan.Across(mesh.TransportChoice())
	comm, err := collective.New(mesh, cfg)
	if err != nil {
		return err
	}
	defer comm.Close()
	n, me := comm.Size(), comm.Rank()
	es := int64(o.dtype.Size())
	maxCount := o.maxBytes / es
	send := make([]byte, maxCount*es)
	recv := make([]byte, maxCount*es)
	var opts []collective.CallOption
	if o.wire != o.dtype {
		opts = append(opts, collective.WithWire(o.wire))
	}
	if o.algo != algo.Auto {
		opts = append(opts, collective.WithAlgorithm(o.algo))
	}
	p := func(format string, a ...any) {
		if me == 0 {
			fmt.Fprintf(out, format, a...)
		}
	}
	printHeader(p, o, mesh, comm, cfg.Algorithm, procs, procsFrom)
	var busSum float64
	var rows int
	wrongTotal := 0
	for size := o.minBytes; size <= o.maxBytes; size *= int64(o.factor) {
		count := size / es
		b := count * es
		chosen, redop := comm.AlgorithmFor(o.algo, int(count)*o.wire.Size()).String(), o.op.String()
		if o.sendrecv {
			chosen, redop = "p2p", "none"
		}
		// the row is printed whole, so that an error never lands inside it
		row := fmt.Sprintf("  %10d %12d %8s %6s %6s", b, count, typeName(o.dtype), redop, chosen)
		notes := ""
		for _, inPlace := range []bool{false, true} {
			if inPlace && !o.inPlace || !inPlace && !o.outPlace {
				continue
			}
			s, r := send[:b], recv[:b]
			if inPlace {
				s = r
			}
			var tm timing
			var wrong int
			var err error
			if o.sendrecv {
				tm, wrong, err = sendRecv(ctx, comm, mesh, s, r, o)
			} else {
				tm, err = timeIt(ctx, comm, s, r, o, opts)
				if err == nil && o.check {
					wrong, err = checkIt(ctx, comm, mesh, s, r, o, opts)
				}
			}
			if err != nil {
				return err
			}
			us := tm.median
			if o.samples > 1 {
				place := "out-of-place"
				if inPlace {
					place = "in-place"
				}
				notes += fmt.Sprintf("# %10d %s: mean %s us, median %s us, best %s us\n", b, place, fmtTime(tm.mean), fmtTime(tm.median), fmtTime(tm.best))
			}
			wrongTotal += wrong
			algbw := float64(b) / us / 1e3
			busbw := algbw * 2 * float64(n-1) / float64(n)
			if o.sendrecv {
				busbw = algbw // each link carries the buffer once
			}
			busSum += busbw
			rows++
			wr := "N/A"
			if o.check {
				wr = strconv.Itoa(wrong)
			}
			row += fmt.Sprintf("  %9s %7.3f %7.3f %6s", fmtTime(us), algbw, busbw, wr)
		}
		p("%s\n%s", row, notes)
		if o.factor < 2 || size == o.maxBytes {
			break
		}
		if size == 0 { // -b 0: the next row is the element size, then x factor
			size = int64(es) / int64(o.factor)
			if size == 0 {
				size = 1
			}
		}
	}
	p("# Out of bounds values : %d %s\n", wrongTotal, okText(wrongTotal))
	if rows > 0 {
		p("# Avg bus bandwidth    : %g\n", math.Round(busSum/float64(rows)*1e4)/1e4)
	}
	p("#\n")
	if wrongTotal > 0 {
		return fmt.Errorf("%d wrong elements", wrongTotal)
	}
	return nil
}

// printHeader prints nccl-tests' header: the job, the transport and why,
// the settings, then the table's column titles.
func printHeader(p func(string, ...any), o options, mesh *rank.Mesh, comm *collective.Communicator, a algo.Algorithm, procs int, procsFrom string) {
	if o.sendrecv {
		p("# gorun allreduce-perf -C sendrecv: %d ranks, transport %s, %d channels; each rank sends to rank+1 and receives from rank-1\n",
			comm.Size(), mesh.TransportChoice().Transport, mesh.Channels())
	} else {
		p("# gorun allreduce-perf: %d ranks, transport %s, %d channels, data %s, wire %s, op %s, algorithm %s\n",
			comm.Size(), mesh.TransportChoice().Transport, mesh.Channels(), o.dtype, o.wire, o.op, a)
	}
	if comm.Size() > 1 {
		p("# %v\n", mesh.TransportChoice())
		if a == algo.Auto {
			p("# auto chooses with %s\n", comm.AutoBasis())
		}
	}
	p("# GOMAXPROCS %d per rank (%s)\n", procs, procsFrom)
	if h, m := comm.Hierarchical(); h > 0 {
		within := "by the ring over the pair rings (no group segment)"
		if comm.HierarchicalInGroup() {
			within = "through the group segment (GORUN_SHM_GROUP=0: the ring)"
		}
		p("# hierarchical allreduce: %d hosts x %d ranks, within rank 0's host %s; GORUN_HIERARCHICAL=0 turns it off\n", h, m, within)
	}
	p("# sizes %d to %d bytes (x%d), %d warm-up and %d timed iterations, check %v\n", o.minBytes, o.maxBytes, o.factor, o.warmup, o.iters, o.check)
	if o.samples > 1 {
		p("# time: the median of %d samples between barriers, each the slowest rank's time per call; mean and best below each row\n", o.samples)
	} else {
		p("# time: the mean over the timed iterations and the ranks\n")
	}
	p("#\n")
	p("# %10s %12s %8s %6s %6s", "", "", "", "", "")
	if o.outPlace {
		p("  %-33s", "             out-of-place")
	}
	if o.inPlace {
		p("  %-33s", "               in-place")
	}
	p("\n# %10s %12s %8s %6s %6s", "size", "count", "type", "redop", "algo")
	for i := 0; i < btoi(o.outPlace)+btoi(o.inPlace); i++ {
		p("  %9s %7s %7s %6s", "time", "algbw", "busbw", "#wrong")
	}
	p("\n# %10s %12s %8s %6s %6s", "(B)", "(elements)", "", "", "")
	for i := 0; i < btoi(o.outPlace)+btoi(o.inPlace); i++ {
		p("  %9s %7s %7s %6s", "(us)", "(GB/s)", "(GB/s)", "")
	}
	p("\n")
}

// shareOfHost sets GOMAXPROCS to this rank's share of the host's cores
// (cores / ranks on this host, at least 1), as nmt-train sizes its compute
// threads, unless the GOMAXPROCS variable is set: a benchmark that only
// communicates runs faster with one OS thread per core it has than with
// every rank's runtime scheduling on every core. It returns the value and
// where it came from.
func shareOfHost(localSize int) (int, string) {
	if os.Getenv("GOMAXPROCS") != "" {
		return runtime.GOMAXPROCS(0), "from the GOMAXPROCS variable"
	}
	n := max(1, runtime.NumCPU()/max(1, localSize))
	runtime.GOMAXPROCS(n)
	return n, fmt.Sprintf("%d cores / %d ranks on this host; set GOMAXPROCS to change", runtime.NumCPU(), max(1, localSize))
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func okText(w int) string {
	if w == 0 {
		return "OK"
	}
	return "FAILED"
}

func typeName(d dtype.DType) string {
	switch d {
	case dtype.Float32:
		return "float"
	case dtype.Float16:
		return "half"
	}
	return "bfloat16"
}

func fmtTime(us float64) string {
	if us >= 1e4 {
		return strconv.FormatFloat(us, 'f', 0, 64)
	}
	return strconv.FormatFloat(us, 'f', 1, 64)
}

// timeIt runs the warm-up and timed iterations and returns the time of one
// allreduce.
func timeIt(ctx context.Context, c *collective.Communicator, send, recv []byte, o options, opts []collective.CallOption) (timing, error) {
	fill(send, c.Rank(), o.dtype)
	for i := 0; i < o.warmup; i++ {
		if err := c.Allreduce(ctx, send, recv, o.dtype, o.op, opts...); err != nil {
			return timing{}, err
		}
	}
	return timeSamples(ctx, c, o, func(n int) error {
		hs := make([]*collective.Handle, n)
		for i := range hs {
			hs[i] = c.AllreduceAsync(ctx, send, recv, o.dtype, o.op, opts...)
		}
		// Like nccl-tests, which synchronizes its stream once after
		// launching every iteration: calls finish in order, so waiting for
		// the last one waits for all (an earlier failure fails the later
		// ones too), and the others' Waits below return at once.
		hs[len(hs)-1].Wait()
		for _, h := range hs {
			if err := h.Wait(); err != nil {
				return err
			}
		}
		return nil
	})
}

// timing is the time of one call in microseconds. The row shows median:
// with one sample it is the mean.
type timing struct{ mean, median, best float64 }

// timeSamples times o.iters calls, run by batch(n) n at a time, in
// o.samples samples, each after a barrier. mean is the time of all samples
// over o.iters, averaged over the ranks (nccl-tests' figure); median and
// best are over the samples' times per call, each the slowest rank's (as
// the OpenMPI and gloo peers of bench/peers measure).
func timeSamples(ctx context.Context, c *collective.Communicator, o options, batch func(n int) error) (timing, error) {
	per := make([]float32, o.samples)
	total := 0.0
	for k := range per {
		n := o.iters / o.samples
		if k < o.iters%o.samples {
			n++
		}
		if err := c.Barrier(ctx); err != nil {
			return timing{}, err
		}
		start := time.Now()
		if err := batch(n); err != nil {
			return timing{}, err
		}
		d := time.Since(start).Seconds() * 1e6
		total += d
		per[k] = float32(d / float64(n))
	}
	mean, err := overRanks(ctx, c, total/float64(o.iters), collective.Average)
	if err != nil || o.samples == 1 {
		return timing{mean, mean, mean}, err
	}
	if err := c.Allreduce(ctx, nil, collective.Float32Bytes(per), dtype.Float32, collective.Max); err != nil {
		return timing{}, err
	}
	slices.Sort(per)
	median := float64(per[len(per)/2])
	return timing{mean, median, float64(per[0])}, nil
}

// overRanks reduces one value of every rank with op (the mean time per op,
// the sum of wrong elements).
func overRanks(ctx context.Context, c *collective.Communicator, v float64, op collective.Op) (float64, error) {
	x := []float32{float32(v)}
	if err := c.Allreduce(ctx, nil, collective.Float32Bytes(x), dtype.Float32, op); err != nil {
		return 0, err
	}
	return float64(x[0]), nil
}

// elem is element i of b, of type dt, as a float32.
func elem(b []byte, i int, dt dtype.DType) float32 {
	switch dt {
	case dtype.Float32:
		return collective.Float32s(b)[i]
	case dtype.Float16:
		return half.F16ToF32(collective.Uint16s(b)[i])
	}
	return half.BF16ToF32(collective.Uint16s(b)[i])
}

// value is rank r's element i: a small integer, so that sums are exact in
// every data type and the reference is exact.
func value(r, i int) float32 { return float32((r*7+i*13)%17 - 8) }

func fill(b []byte, r int, dt dtype.DType) {
	switch dt {
	case dtype.Float32:
		f := collective.Float32s(b)
		for i := range f {
			f[i] = value(r, i)
		}
	case dtype.Float16:
		u := collective.Uint16s(b)
		for i := range u {
			u[i] = half.F32ToF16(value(r, i))
		}
	case dtype.BFloat16:
		u := collective.Uint16s(b)
		for i := range u {
			u[i] = half.F32ToBF16(value(r, i))
		}
	}
}

func round(dt dtype.DType, v float32) float32 {
	switch dt {
	case dtype.Float16:
		return half.F16ToF32(half.F32ToF16(v))
	case dtype.BFloat16:
		return half.BF16ToF32(half.F32ToBF16(v))
	}
	return v
}

// checkIt refills the input, runs one allreduce and counts the elements
// (over all ranks) that differ from the exact reference.
func checkIt(ctx context.Context, c *collective.Communicator, t rank.Transport, send, recv []byte, o options, opts []collective.CallOption) (int, error) {
	fill(send, c.Rank(), o.dtype)
	if err := c.Allreduce(ctx, send, recv, o.dtype, o.op, opts...); err != nil {
		return 0, err
	}
	n := c.Size()
	count := len(recv) / o.dtype.Size()
	wrong := 0
	for i := 0; i < count; i++ {
		var acc float32
		for r := 0; r < n; r++ {
			v := value(r, i)
			switch {
			case r == 0:
				acc = v
			case o.op == collective.Min:
				acc = min(acc, v)
			case o.op == collective.Max:
				acc = max(acc, v)
			default:
				acc += v
			}
		}
		if o.op == collective.Average {
			acc /= float32(n)
		}
		if elem(recv, i, o.dtype) != round(o.dtype, round(o.wire, acc)) {
			wrong++
		}
	}
	return sumCounts(ctx, t, &countSeq, wrong)
}

// countKind marks the messages of sumCounts (Tag.Kind), apart from every
// collective's and from -C sendrecv's.
const countKind = 0xfffd

// countSeq numbers sumCounts's exchanges; every rank counts the same.
var countSeq uint64

// sumCounts adds up one count of every rank and gives every rank the
// total, with point-to-point messages through rank 0 (seq numbers the
// exchanges: the same count on every rank): not with the
// collective under test, which could otherwise hide its own wrong results
// by summing their count wrong too.
func sumCounts(ctx context.Context, t rank.Transport, seq *uint64, v int) (int, error) {
	n, me := t.Size(), t.Rank()
	*seq++
	tag := rank.Tag{Seq: *seq, Kind: countKind}
	var b [8]byte
	if me != 0 {
		binary.LittleEndian.PutUint64(b[:], uint64(v))
		if err := t.Send(ctx, 0, 0, tag, b[:]); err != nil {
			return 0, err
		}
		if err := t.Recv(ctx, 0, 0, tag, b[:]); err != nil {
			return 0, err
		}
		return int(binary.LittleEndian.Uint64(b[:])), nil
	}
	total := v
	for r := 1; r < n; r++ {
		if err := t.Recv(ctx, r, 0, tag, b[:]); err != nil {
			return 0, err
		}
		total += int(binary.LittleEndian.Uint64(b[:]))
	}
	binary.LittleEndian.PutUint64(b[:], uint64(total))
	for r := 1; r < n; r++ {
		if err := t.Send(ctx, r, 0, tag, b[:]); err != nil {
			return 0, err
		}
	}
	return total, nil
}
