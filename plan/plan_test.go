package plan

import (
	"context"
	"math"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/rank/choice"
	"github.com/gorun/gorun/rank/ranktest"
)

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.9g, want %.9g", what, got, want)
	}
}

// baseWorkload is Transformer-small-like: 5.6 M parameters in the
// Bucketer's layout, 0.4 s of compute.
func baseWorkload() Workload {
	return Workload{Params: 5626624, Buckets: []int{1 << 20, 21 << 20, 1 << 20}, HeadBytes: 4 << 20,
		ComputeS: 0.4, ComputeSD: 0.05, BackwardS: 0.25, Threads: 1, TokensPerRank: 2000,
		Wire: dtype.Float16, Overlap: true}
}

// A hand-computed case: 2 hosts, one rank each, 1 Gbit/s, TLS/TCP, one
// bucket of 4 MB (2 MB of fp16 on the wire) sent after backward, no
// spread. Ring on 2 ranks: 2 steps + 2 MB / 125 MB/s; the token count:
// the ring's 2 steps + 16 B.
func TestPredictByHand(t *testing.T) {
	w := Workload{Params: 1e6, Buckets: []int{4e6}, ComputeS: 0.1, TokensPerRank: 1000, Wire: dtype.Float16}
	c := Cluster{Hosts: 2, PerHost: 1, LinkGbps: 1, LatencyUs: 40, Transport: "tcp"}
	p, err := Predict(c, w)
	if err != nil {
		t.Fatal(err)
	}
	step := (TLSTCP.StepUs + 40) / 1e6
	comm := 2*step + 2e6/125e6
	sync := 2*step + 16/125e6
	near(t, "CommS", p.CommS, comm)
	near(t, "ExposedS", p.ExposedS, comm)
	near(t, "SyncS", p.SyncS, sync)
	near(t, "StepS", p.StepS, 0.1+sync+comm)
	near(t, "TokensPerSec", p.TokensPerSec, 2*1000/p.StepS)
	near(t, "Efficiency", p.Efficiency, 0.1/p.StepS)
	if p.Hidden > 1e-12 || p.WaitS != 0 || p.Verdict != "compute-bound" || !p.LinkBound || p.Transport != "tcp" {
		t.Errorf("%+v", p)
	}
	if len(p.Buckets) != 1 || p.Buckets[0].Algorithm != "ring" || p.Buckets[0].WireBytes != 2e6 {
		t.Errorf("buckets %+v", p.Buckets)
	}
	// 100 Gbit/s: the transport's cap limits, not the link
	c.LinkGbps = 100
	p, _ = Predict(c, w)
	near(t, "capped CommS", p.CommS, 2*step+2e6/(TLSTCP.CapGBs*1e9))
	if p.LinkBound || p.RateGBs != TLSTCP.CapGBs {
		t.Errorf("100 Gbit/s: link-bound %v at %v GB/s, want the transport's cap", p.LinkBound, p.RateGBs)
	}
	// the transport's constants given: 2 GB/s each way, 10 µs a step
	c.CapGBs, c.StepUs = 2, 10
	p, _ = Predict(c, w)
	near(t, "given transport", p.CommS, 2*50e-6+2e6/2e9)
	c.CapGBs, c.StepUs = 0, 0
	// compute 10 ms: the same allreduce is now more than the compute
	w.ComputeS = 0.01
	c.LinkGbps = 1
	if p, _ = Predict(c, w); p.Verdict != "network-bound" {
		t.Errorf("16 ms of allreduce on 10 ms of compute: %q", p.Verdict)
	}
}

// Two ranks on one core (2 ranks x 1 thread, 1 core per host): each
// computes twice as long; the wait is then for the slower host's summed
// work, sd x 2 / sqrt(2) x E[max of 2 hosts].
func TestOversubscribed(t *testing.T) {
	w := baseWorkload()
	c := Cluster{Hosts: 2, PerHost: 2, LinkGbps: 10, CoresPerHost: 1, ThreadsPerRank: 1}
	p, err := Predict(c, w)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "Oversubscribed", p.Oversubscribed, 2)
	near(t, "ComputeS", p.ComputeS, 0.8)
	near(t, "WaitS", p.WaitS, ExpectedMax(2)*0.05*2/math.Sqrt2)
	if p.StolenS <= 0 {
		t.Errorf("busy cores under overlapped buckets: no transport CPU charged (%+v)", p)
	}
	// enough cores: no sharing, the wait for the slowest of 4 ranks
	c.CoresPerHost = 4
	p, _ = Predict(c, w)
	near(t, "ComputeS with cores", p.ComputeS, 0.4)
	near(t, "WaitS with cores", p.WaitS, ExpectedMax(4)*0.05)
	if p.StolenS != 0 {
		t.Errorf("free cores: %v s of transport CPU charged", p.StolenS)
	}
	// two threads per rank where the measurement had one: half the compute
	c.ThreadsPerRank = 2
	p, _ = Predict(c, w)
	near(t, "ComputeS with 2 threads", p.ComputeS, 0.2)
	near(t, "SingleS with 2 threads", p.SingleS, 0.2)
}

func TestOneRankHasNoCommunication(t *testing.T) {
	w := baseWorkload()
	w.DataS = 0.01
	for _, ov := range []bool{true, false} {
		w.Overlap = ov
		p, err := Predict(Cluster{Hosts: 1, PerHost: 1, LinkGbps: 1}, w)
		if err != nil {
			t.Fatal(err)
		}
		if p.CommS != 0 || p.ExposedS != 0 || p.SyncS != 0 || p.WaitS != 0 || p.StolenS != 0 || len(p.Buckets) != 0 {
			t.Errorf("overlap %v: one rank communicates: %+v", ov, p)
		}
		near(t, "StepS", p.StepS, 0.41)
		near(t, "Efficiency", p.Efficiency, 1)
		if !strings.Contains(p.Verdict, "one rank") {
			t.Errorf("verdict %q", p.Verdict)
		}
	}
}

// randomCase draws a cluster and a workload.
func randomCase(r *rand.Rand) (Cluster, Workload) {
	c := Cluster{Hosts: 1 << r.Intn(10), PerHost: 1 + r.Intn(8), LinkGbps: math.Pow(10, r.Float64()*3-1),
		LatencyUs: r.Float64() * 100, Transport: []string{"auto", "quic", "tcp"}[r.Intn(3)], GPU: r.Intn(2) == 0}
	if r.Intn(2) == 0 {
		c.CoresPerHost, c.ThreadsPerRank = 1+r.Intn(64), 1+r.Intn(8)
	}
	w := Workload{Params: 1e6, ComputeS: 0.01 + r.Float64(), Wire: []dtype.DType{dtype.Float32, dtype.Float16, dtype.BFloat16}[r.Intn(3)],
		TokensPerRank: 4096, Threads: 1 + r.Intn(4), Overlap: r.Intn(2) == 0}
	w.ComputeSD = r.Float64() * w.ComputeS / 2
	w.BackwardS = r.Float64() * w.ComputeS
	for k := 1 + r.Intn(10); k > 0; k-- {
		w.Buckets = append(w.Buckets, 4*(1+r.Intn(20<<20)))
	}
	w.HeadBytes = r.Intn(w.Buckets[len(w.Buckets)-1] + 1)
	return c, w
}

// More bandwidth is never slower, for any cluster and workload: every
// part of the step can only shrink.
func TestMoreBandwidthNeverSlower(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 2000; i++ {
		c, w := randomCase(r)
		p1, err := Predict(c, w)
		if err != nil {
			t.Fatalf("%+v %+v: %v", c, w, err)
		}
		c.LinkGbps *= 1 + 10*r.Float64()
		p2, err := Predict(c, w)
		if err != nil {
			t.Fatal(err)
		}
		if p2.StepS > p1.StepS*(1+1e-12) || p2.CommS > p1.CommS*(1+1e-12) {
			t.Fatalf("%+v %+v: a faster link gave %.6f s (comm %.6f) against %.6f s (comm %.6f)", c, w, p2.StepS, p2.CommS, p1.StepS, p1.CommS)
		}
	}
}

// Overlap never costs more than what it adds: its buckets pay one call's
// steps each where the plain reducer pays once, and on busy cores the
// transport's CPU under backward (StolenS). Without those it is never
// slower, and with a gradient bucket ready before the end of backward on
// a slow link it is faster.
func TestOverlapNeverSlower(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	for i := 0; i < 2000; i++ {
		c, w := randomCase(r)
		w.Overlap = false
		plain, err := Predict(c, w)
		if err != nil {
			t.Fatal(err)
		}
		w.Overlap = true
		ov, err := Predict(c, w)
		if err != nil {
			t.Fatal(err)
		}
		// each extra call's latency: at most the token-count call's steps
		// on this cluster, which has the most steps of any call (16 bytes)
		extra := float64(len(w.Buckets)-1) * ov.SyncS
		if ov.StepS-ov.StolenS > plain.StepS+extra+1e-12 {
			t.Fatalf("%+v %+v: overlap %.6f s (%.6f of transport CPU) against %.6f s without, more than %d buckets' latency %.6f", c, w, ov.StepS, ov.StolenS, plain.StepS, len(w.Buckets), extra)
		}
	}
	w := baseWorkload()
	c := Cluster{Hosts: 4, PerHost: 1, LinkGbps: 1, GPU: true}
	w.Overlap = false
	plain, _ := Predict(c, w)
	w.Overlap = true
	ov, _ := Predict(c, w)
	if !(ov.StepS < plain.StepS) || !(ov.Hidden > 0) {
		t.Errorf("1 Gbit/s, 3 buckets: overlap %.4f s (%.0f %% hidden) against %.4f s without", ov.StepS, 100*ov.Hidden, plain.StepS)
	}
}

func TestExpectedMax(t *testing.T) {
	// closed forms: 1/sqrt(pi), 3/(2 sqrt(pi)); 4 and 512 from tables
	for n, want := range map[int]float64{1: 0, 2: 1 / math.Sqrt(math.Pi), 3: 1.5 / math.Sqrt(math.Pi), 4: 1.029375, 512: 3.0439} {
		if got := ExpectedMax(n); math.Abs(got-want) > 1e-4 {
			t.Errorf("ExpectedMax(%d) = %.6f, want %.6f", n, got, want)
		}
	}
}

func TestBadInput(t *testing.T) {
	w := baseWorkload()
	for _, k := range []struct {
		c    Cluster
		w    func(*Workload)
		want string
	}{
		{Cluster{Hosts: 0, PerHost: 1, LinkGbps: 1}, nil, "0 hosts"},
		{Cluster{Hosts: 2, PerHost: 0, LinkGbps: 1}, nil, "0 per host"},
		{Cluster{Hosts: 2, PerHost: 1}, nil, "a link of 0 Gbit/s"},
		{Cluster{Hosts: 2, PerHost: 1, LinkGbps: 1, Transport: "pigeon"}, nil, "pigeon"},
		{Cluster{Hosts: 2, PerHost: 1, LinkGbps: 1}, func(w *Workload) { w.ComputeS = 0 }, "compute 0 s"},
		{Cluster{Hosts: 2, PerHost: 1, LinkGbps: 1}, func(w *Workload) { w.BackwardS = 1 }, "backward 1 s"},
		{Cluster{Hosts: 2, PerHost: 1, LinkGbps: 1}, func(w *Workload) { w.Buckets = []int{-4} }, "bucket 0 has -4 bytes"},
		{Cluster{Hosts: 2, PerHost: 1, LinkGbps: 1}, func(w *Workload) { w.Wire = 9 }, "wire type"},
	} {
		ww := w
		if k.w != nil {
			k.w(&ww)
		}
		if _, err := Predict(k.c, ww); err == nil || !strings.Contains(err.Error(), k.want) {
			t.Errorf("%+v: error %v, want one saying %q", k.c, err, k.want)
		}
	}
}

// hosted gives an in-process transport a host per rank, as rank.Mesh
// does (the communicator reads it for its hierarchical layout).
type hosted struct {
	rank.Transport
	hosts []string
}

func (h hosted) Hosts() []string { return h.hosts }

// The algorithm the plan gives each call is what a real communicator's
// Auto picks on that layout (AlgorithmFor) given the link the plan times
// (collective.Config.Across), for flat, hierarchical and one-host jobs
// over the sizes where the choice changes (Direct's limits, recursive
// doubling and the ring on 2 ranks, the tree below and the ring above the
// link model's crossover at 3 and more).
func TestAlgorithmIsAutos(t *testing.T) {
	sizes := []int{1 << 10, 40 << 10, 64 << 10, 64<<10 + 4, 200 << 10, 1 << 20, 25 << 20}
	seen := map[algo.Algorithm]bool{}
	for _, hg := range [][2]int{{2, 1}, {3, 1}, {4, 1}, {8, 1}, {2, 2}, {3, 2}, {2, 3}} {
		h, g := hg[0], hg[1]
		n := h * g
		var hosts []string
		for r := 0; r < n; r++ {
			hosts = append(hosts, string(rune('a'+r/g)))
		}
		// the plan takes TLS/TCP on 10 Gbit/s (auto), at its cap
		across := algo.Link{Gbps: 10, StepUs: TLSTCP.StepUs, CapGBs: TLSTCP.CapGBs}
		comm, err := collective.New(hosted{ranktest.InMemory(n, 2)[0], hosts}, collective.Config{Across: across})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range checkAuto(t, comm, Cluster{Hosts: h, PerHost: g, LinkGbps: 10}, sizes) {
			seen[a] = true
		}
		comm.Close()
	}
	for _, a := range []algo.Algorithm{algo.Direct, algo.RecursiveDoubling, algo.Ring, algo.Tree} {
		if !seen[a] {
			t.Errorf("no layout and size made Auto choose %v: the comparison misses a branch", a)
		}
	}
	// one host: the shm algorithm, over a real shared-memory group
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts, err := ranktest.Loopback(ctx, 2, rank.Options{Transport: "quic", SharedMemory: "on", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ranktest.CloseAll(ts)
	comms := make([]*collective.Communicator, 2)
	var wg sync.WaitGroup
	for i := range ts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[i], _ = collective.New(ts[i], collective.Config{})
		}()
	}
	wg.Wait()
	for _, c := range comms {
		if c == nil {
			t.Fatal("no communicator on the shared-memory group")
		}
		defer c.Close()
	}
	checkAuto(t, comms[0], Cluster{Hosts: 1, PerHost: 2}, sizes)
}

// checkAuto compares the plan's algorithm for one bucket of each size
// (float32 on the wire) with the communicator's, and returns the
// communicator's.
func checkAuto(t *testing.T, comm *collective.Communicator, c Cluster, sizes []int) []algo.Algorithm {
	t.Helper()
	var chose []algo.Algorithm
	for _, b := range sizes {
		w := Workload{Params: int64(b / 4), Buckets: []int{b}, ComputeS: 1, Wire: dtype.Float32, Overlap: true}
		p, err := Predict(c, w)
		if err != nil {
			t.Fatal(err)
		}
		want := comm.AlgorithmFor(algo.Auto, b)
		chose = append(chose, want)
		hosts, per := comm.Hierarchical()
		got := p.Buckets[0]
		if got.Algo != want || got.Hierarchical != (hosts > 0) || (hosts > 0 && (hosts != c.Hosts || per != c.PerHost)) {
			t.Errorf("%d hosts x %d, %d bytes: the plan runs %v (hierarchical %v), the communicator %v (layout %d x %d)",
				c.Hosts, c.PerHost, b, got.Algo, got.Hierarchical, want, hosts, per)
		}
	}
	return chose
}

// Across: the probe's rate of the transport chosen, with its step cost;
// without a probe, the transport's cap alone.
func TestAcrossFromTransportChoice(t *testing.T) {
	for _, k := range []struct {
		c    choice.Choice
		want algo.Link
	}{
		{choice.Choice{Transport: "tcp", Peer: 1, QUICGBs: 0.2, TCPGBs: 0.5}, algo.Link{Gbps: 4, StepUs: TLSTCP.StepUs}},
		{choice.Choice{Transport: "quic", Peer: 2, QUICGBs: 0.11, TCPGBs: 0.1}, algo.Link{Gbps: 0.88, StepUs: QUIC.StepUs}},
		{choice.Choice{Transport: "quic", Peer: -1}, algo.Link{StepUs: QUIC.StepUs, CapGBs: QUIC.CapGBs}},
		{choice.Choice{Transport: "tcp", Peer: -1}, algo.Link{StepUs: TLSTCP.StepUs, CapGBs: TLSTCP.CapGBs}},
	} {
		if got := Across(k.c); math.Abs(got.Gbps-k.want.Gbps) > 1e-12 || got.StepUs != k.want.StepUs || got.CapGBs != k.want.CapGBs {
			t.Errorf("%+v: link %+v, want %+v", k.c, got, k.want)
		}
	}
}
