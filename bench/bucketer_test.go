package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/transformer"
)

var (
	baseOnce   sync.Once
	baseParams []collective.ParamInfo
	baseErr    error
)

// transformerBaseParams is the real parameter list of the base preset with
// the lab's 32768 ids (60,880,896 parameters), in the model's order.
func transformerBaseParams() ([]collective.ParamInfo, error) {
	baseOnce.Do(func() {
		cfg, err := transformer.Preset("base", 32768)
		if err != nil {
			baseErr = err
			return
		}
		m, err := transformer.New(cfg, cpu.New(), 1)
		if err != nil {
			baseErr = err
			return
		}
		for _, p := range m.Params {
			baseParams = append(baseParams, collective.ParamInfo{Name: p.Name, Len: p.Len})
		}
	})
	return baseParams, baseErr
}

// layerOf groups parameters by layer: "encoder/layer_3/ffn/..." ->
// "encoder/layer_3"; "embedding_and_softmax/weights" -> its first part.
func layerOf(name string) string {
	parts := strings.Split(name, "/")
	if len(parts) > 2 {
		return parts[0] + "/" + parts[1]
	}
	return parts[0]
}

// BenchmarkBucketer runs a synthetic backward pass over Transformer-base's
// real parameter list on 2 and 4 ranks over QUIC on loopback: each layer
// "computes" (sleeps) for a time proportional to its parameters
// (GORUN_BENCH_NS_PER_PARAM, default 30 ns: 1.8 s per backward pass, what
// PyTorch's CPU backward of this model takes on 2 threads, see
// ../shared/peers), then marks its gradients ready. Modes: "overlap" marks
// them as each layer finishes; "serial" marks them all after the whole
// backward pass (compute, then bucketed communication); "plain" does no
// bucketing: one allreduce of the whole gradient buffer after the backward
// pass. Reported per step, on rank 0: step time, comm time, exposed comm,
// hidden %, and MB sent. GORUN_BENCH_TRANSPORT=tcp runs over TLS/TCP
// instead of QUIC.
//
//	go test -run '^$' -bench Bucketer -benchtime 3x ./bench/
func BenchmarkBucketer(b *testing.B) {
	ps, err := transformerBaseParams()
	if err != nil {
		b.Fatal(err)
	}
	nsPer := 30.0
	if v := os.Getenv("GORUN_BENCH_NS_PER_PARAM"); v != "" {
		if nsPer, err = strconv.ParseFloat(v, 64); err != nil {
			b.Fatalf("GORUN_BENCH_NS_PER_PARAM=%q: %v", v, err)
		}
	}
	total := 0
	for _, p := range ps {
		total += p.Len
	}
	for _, np := range []int{2, 4} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ts, err := rank.LoopbackGroup(ctx, np, rank.Options{Timeout: 120 * time.Second, Transport: os.Getenv("GORUN_BENCH_TRANSPORT")})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		warmUp(b, ts)
		grads := make([][]float32, np)
		for r := range grads {
			grads[r] = make([]float32, total)
			for i := range grads[r] {
				grads[r][i] = float32((i*7+r)%1000-500) * 1e-4
			}
		}
		for _, comp := range []collective.Compression{collective.CompressNone, collective.CompressFP16} {
			for _, mode := range []string{"plain", "serial", "overlap"} {
				b.Run(fmt.Sprintf("np%d/%v/%s", np, comp, mode), func(b *testing.B) {
					benchBucketer(b, ts, ps, grads, comp, mode, nsPer)
				})
			}
		}
		rank.CloseAll(ts)
	}
}

func benchBucketer(b *testing.B, ts []rank.Transport, ps []collective.ParamInfo, grads [][]float32, comp collective.Compression, mode string, nsPer float64) {
	overlap := mode == "overlap"
	np := len(ts)
	var step, comm, exposed time.Duration
	var hidden float64
	var sent uint64
	var nbuckets int
	errs := make([]error, np)
	var wg sync.WaitGroup
	b.ResetTimer()
	for r := 0; r < np; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			c, err := collective.New(ts[r], collective.Config{Timeout: 120 * time.Second})
			if err != nil {
				errs[r] = err
				return
			}
			defer c.Close()
			bk, err := collective.NewBucketer(c, ps, collective.BucketConfig{Compression: comp, Average: true})
			if err != nil {
				errs[r] = err
				return
			}
			defer bk.Close()
			if err := bk.AttachFlat(grads[r]); err != nil {
				errs[r] = err
				return
			}
			for it := 0; it < b.N; it++ {
				t0 := time.Now()
				var pending []int
				var work time.Duration
				flush := func() {
					time.Sleep(work)
					work = 0
					for _, i := range pending {
						bk.MarkReady(i)
					}
					pending = pending[:0]
				}
				for i := len(ps) - 1; i >= 0; i-- {
					if overlap && i < len(ps)-1 && layerOf(ps[i].Name) != layerOf(ps[i+1].Name) {
						flush()
					}
					work += time.Duration(nsPer * float64(ps[i].Len))
					pending = append(pending, i)
				}
				if mode == "plain" {
					time.Sleep(work)
					tb := time.Now()
					var opts []collective.CallOption
					if comp == collective.CompressFP16 {
						opts = append(opts, collective.WithWire(collective.Float16))
					}
					s0 := sentBytes(ts[r])
					g := collective.Float32Bytes(grads[r])
					if err := c.Allreduce(context.Background(), g, g, collective.Float32, collective.Average, opts...); err != nil {
						errs[r] = err
						return
					}
					if r == 0 {
						d := time.Since(tb)
						step += time.Since(t0)
						comm += d
						exposed += d
						sent += sentBytes(ts[r]) - s0
						nbuckets = 1
					}
					continue
				}
				flush()
				bk.BackwardDone()
				st, err := bk.Wait()
				if err != nil {
					errs[r] = err
					return
				}
				if r == 0 {
					step += time.Since(t0)
					comm += st.CommTime
					exposed += st.Exposed
					hidden += st.Hidden
					sent += st.BytesSent
					nbuckets = len(st.Buckets)
				}
			}
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			b.Fatalf("rank %d: %v", r, err)
		}
	}
	n := float64(b.N)
	b.ReportMetric(step.Seconds()*1e3/n, "step-ms")
	b.ReportMetric(comm.Seconds()*1e3/n, "comm-ms")
	b.ReportMetric(exposed.Seconds()*1e3/n, "exposed-ms")
	b.ReportMetric(100*hidden/n, "hidden-%")
	b.ReportMetric(float64(sent)/n/1e6, "MB-sent")
	b.ReportMetric(float64(nbuckets), "buckets")
}

func sentBytes(t rank.Transport) (n uint64) {
	for _, p := range t.Stats() {
		n += p.BytesSent
	}
	return n
}

// warmUp runs a few 64 MiB allreduces so that the first measured mode does
// not pay for the connections' flow-control windows growing.
func warmUp(b *testing.B, ts []rank.Transport) {
	var wg sync.WaitGroup
	errs := make([]error, len(ts))
	for r := range ts {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			c, err := collective.New(ts[r], collective.Config{Timeout: 120 * time.Second})
			if err != nil {
				errs[r] = err
				return
			}
			defer c.Close()
			buf := make([]byte, 64<<20)
			for i := 0; i < 3 && errs[r] == nil; i++ {
				errs[r] = c.Allreduce(context.Background(), buf, buf, collective.Float32, collective.Sum)
			}
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			b.Fatalf("warm-up, rank %d: %v", r, err)
		}
	}
}
