package report

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/plan"
)

func TestReportAnswersEveryQuestion(t *testing.T) {
	dir := t.TempDir()
	ri := metrics.RunInfo{Preset: "tiny", Params: 60880896, DModel: 512, WorldSize: 4, Hosts: []string{"a", "a", "b", "b"},
		BatchTokens: 4096, LRPolicy: "transformer", LearningRate: 2, Warmup: 8000, LinkGbps: 1, LinkSource: "flag",
		Dataset: metrics.Dataset{Name: "wmt16", MB: 1891.2, Lines: 4524868, SrcTokens: 1e8, TgtTokens: 1.1e8, Dropped: 12}}
	if err := metrics.WriteRunInfo(dir, ri); err != nil {
		t.Fatal(err)
	}
	r, err := metrics.OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	for s := int64(100); s <= 2000; s += 100 {
		st := 1.9 + 0.1*math.Sin(float64(s))
		r.Log("train", s, map[string]float64{"loss": 5 / math.Sqrt(float64(s)), "loss_raw": 6 / math.Sqrt(float64(s)), "lr": 1e-4,
			"step_time_s": st, "tokens_per_s": 38400, "net_out_MBps": 300 / st, "net_in_MBps": 290 / st,
			"comm_exposed_ms": 12, "comm_hidden_pct": 94, "compute_s": 1.8, "cpu_util_pct": 97}, nil)
		if s%500 == 0 {
			r.Log("eval", s, map[string]float64{"loss": 6 / math.Sqrt(float64(s)), "loss_raw": 7 / math.Sqrt(float64(s)), "bleu": float64(s) / 100}, nil)
		}
	}
	r.Close()
	ck := filepath.Join(dir, "ckpt-2000")
	os.MkdirAll(ck, 0o755)
	os.WriteFile(filepath.Join(ck, "model.safetensors"), make([]byte, 1000), 0o644)
	os.WriteFile(filepath.Join(ck, "state.json"), []byte("{}"), 0o644)
	os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-2000\n"), 0o644)

	path, err := Write(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	rep := string(b)
	sections := strings.Split(rep, "\n## ")[1:]
	questions := []string{"How long", "learning-rate", "fully trained", "overfitting", "devices busy", "network the bottleneck", "step time relate", "training set", "checkpoint", "What if"}
	if len(sections) != len(questions) {
		t.Fatalf("want %d sections, got %d:\n%s", len(questions), len(sections), rep)
	}
	num := regexp.MustCompile(`[0-9]`)
	for i, q := range questions {
		if !strings.Contains(sections[i], q) {
			t.Errorf("section %d is not about %q", i, q)
		}
		if !num.MatchString(strings.SplitN(sections[i], "\n", 2)[1]) || strings.Contains(sections[i], "n/a") {
			t.Errorf("section %q has no number or an n/a:\n%s", q, sections[i])
		}
	}
	// 4 ranks on 2 hosts: the least fp16 allreduce time is 2(2-1)/2 x 2 B x
	// 60.88e6 / 125e6 B/s = 0.974 s (each host's link carries the buffer
	// once, however the ranks share it)
	for _, want := range []string{"9.882e-04", "2,000 steps", "4,524,868 lines", "model.safetensors", "still falling", "0.974 s with fp16", "loss.png", "*Prediction* for twice the hosts (4 hosts x 2 ranks"} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, png := range []string{"loss.png", "lr.png", "bleu.png", "network.png", "step_time.png"} {
		if _, err := os.Stat(filepath.Join(dir, png)); err != nil {
			t.Errorf("plot %s: %v", png, err)
		}
	}
}

// The devices section names the device: GPU utilization and memory from
// NVML when a GPU trained, and plainly that no GPU was used on the CPU.
func TestReportDevices(t *testing.T) {
	for _, gpu := range []bool{false, true} {
		dir := t.TempDir()
		ri := metrics.RunInfo{Preset: "tiny", WorldSize: 1, Device: "cpu", CPUModel: "AMD EPYC 7B13", CPUs: 8, Threads: 8}
		vals := map[string]float64{"loss": 1, "loss_raw": 1, "step_time_s": 1, "cpu_util_pct": 90, "compute_s": 1}
		if gpu {
			ri.Device = "cuda:0 (NVIDIA H100 80GB HBM3, compute capability 9.0)"
			vals["gpu_util_pct"], vals["gpu_mem_used_MiB"], vals["gpu_mem_peak_MiB"] = 87, 20480, 15000
		}
		if err := metrics.WriteRunInfo(dir, ri); err != nil {
			t.Fatal(err)
		}
		r, err := metrics.OpenRun(dir)
		if err != nil {
			t.Fatal(err)
		}
		r.Log("train", 10, vals, nil)
		r.Close()
		path, err := Write(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(path)
		rep := string(b)
		want := []string{"Trained on the CPU of one host (localhost: AMD EPYC 7B13, 8 logical CPUs); 1 rank there, 8 compute threads each. No GPU was used."}
		if gpu {
			want = []string{"Trained on GPUs: rank 0's is cuda:0 (NVIDIA H100", "GPU utilization (NVML, the share of time a kernel ran): **87 %**", "20480 MiB in use", "peaked at 15000 MiB"}
		}
		for _, w := range want {
			if !strings.Contains(rep, w) {
				t.Errorf("gpu %v: report lacks %q:\n%s", gpu, w, rep)
			}
		}
		if !gpu && strings.Contains(rep, "GPU utilization") {
			t.Errorf("a CPU run's report speaks of GPU utilization")
		}
	}
}

// transformerLR is the transformer policy of run.json's lr 2, d_model 64
// and warmup 200 (0-based steps, as Schedule).
func transformerLR(step int) float64 {
	s := float64(step + 1)
	return 2 / math.Sqrt(64) * math.Min(s*math.Pow(200, -1.5), 1/math.Sqrt(s))
}

// reportFixture copies the fixture testdata/name into a new
// directory, lets edit change its run.json and records, and writes its
// report there; it returns the report.
func reportFixture(t *testing.T, name string, lr Schedule, edit func(*metrics.RunInfo, []metrics.Record)) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join("testdata", name)
	ri, err := metrics.ReadRunInfo(src)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := metrics.ReadJSONL(filepath.Join(src, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&ri, recs)
	}
	if err := metrics.WriteRunInfo(dir, ri); err != nil {
		t.Fatal(err)
	}
	var b []byte
	for _, r := range recs {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b = append(append(b, line...), '\n')
	}
	if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	path, err := Write(dir, lr)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(rep)
}

// setValues sets values of the train records.
func setValues(recs []metrics.Record, f func(v map[string]float64)) {
	for _, r := range recs {
		if r.Kind == "train" {
			f(r.Values)
		}
	}
}

// The report's sentences, from fixed run directories (testdata,
// made to these numbers; each number below follows from them as the
// comment says), for the cases the lab's students met: one host where
// shared memory carries the gradients, a network-bound and a
// compute-bound job across hosts, two evaluations against many, the eval
// loss below the train loss, rising, levelling off and flat, a run
// stopped and resumed an hour later, the built-in corpus made in memory,
// one rank with one evaluation, and a run directory from before the
// start records and shared-memory counts. Each verdict must come with
// the numbers and the amount of evidence behind it, and a wrong one must
// be absent.
func TestReportFixtures(t *testing.T) {
	// the least fp16 allreduce time across n hosts, 2(n-1)/n x 2 bytes x
	// params / link
	fp16 := func(params float64, n int, gbps float64) float64 {
		return 2 * float64(n-1) / float64(n) * 2 * params / (gbps * 125e6)
	}
	// the planner's: a run from before run.json recorded its buckets is
	// one allreduce of every gradient; on 2 hosts of one rank a ring, 2
	// steps of the transport the start-up probe would choose (TLS/TCP
	// where it moves more than 1.1 times QUIC's rate: at 10 Gbit/s; at 1
	// Gbit/s both move the link's rate, and it is QUIC) and the bytes at
	// the link's rate or the transport's cap, whichever is lower
	ring2 := func(bytes, gbps float64) float64 {
		tr := plan.QUIC
		if math.Min(gbps/8, plan.TLSTCP.CapGBs) > 1.1*math.Min(gbps/8, plan.QUIC.CapGBs) {
			tr = plan.TLSTCP
		}
		return 2*tr.StepUs/1e6 + bytes/(math.Min(gbps/8, tr.CapGBs)*1e9)
	}
	for _, c := range []struct {
		name, fixture string
		lr            Schedule
		edit          func(*metrics.RunInfo, []metrics.Record)
		want, not     []string
	}{{
		// 2 ranks on host vm, step times 0.105 + 0.003 x (0,1,2,3,0,1,...)
		// (mean 0.1089 s), compute 6 ms less, 4.5 MB a step through shared
		// memory, none over the network; evals at 250 and 500.
		name: "one host, shared memory, two evaluations, eval below train", fixture: "onehost-shm", lr: transformerLR,
		want: []string{
			"2 rank(s) on vm, the CPU (AMD EPYC)",
			"Training time: **56s** for **500 steps** (from the start to the last record, in one go)", // 500 steps of 0.1089 s and two evals of 1 s
			"In this run the rate went from 8.839e-05 (step 1) to 1.118e-02 (step 500).",              // 2/8 x 200^-1.5; 2/8 x 500^-0.5
			"peak **1.768e-02** at step 200, then decays as 1/sqrt(s): half the peak at step 800, a quarter at step 3,200",
			// (0.184 - 0.385) / 250 x 1000; the raw eval loss 1.684
			"Slope over the last 2 evaluations (steps 250-500): **-0.8040 nats per 1000 steps**, -47.7 % of the raw eval loss (1.684) per 1000 steps; within ±1 % would count as flat.",
			"- **No**: the eval loss is still falling; more steps would help. Two evaluations are one interval",
			"BLEU (2 evaluations): 86.44 at step 250, **99.20** at step 500.",
			"): -0.310 at step 250, -0.200 at step 500.",
			"- **No**: the eval loss is below the train loss and not rising. Two evaluations are one interval",
			"Trained on the CPU of one host (vm: AMD EPYC, 2 logical CPUs); 2 ranks there, 1 compute thread each. No GPU was used.",
			"CPU use: **88 %** of the cores given to each rank on average (rank 0 89 %, rank 1 87 %).",
			"Exposed communication is **5.5 %** of the step time.",                         // 6 ms of 0.1089 s
			"network 0.0 MB/s out, 0.0 MB/s in; shared memory 41.4 MB/s out, 41.4 MB/s in", // mean of 4.5 / step time
			"All ranks ran on one host (vm): no gradient crossed a network; shared memory carried them.",
			"1 Gbit/s link (unknown: the lab's link assumed; set --link-gbps)",
			fmt.Sprintf("%.3f s with fp16", fp16(258496, 2, 1)),
			"measured compute per step:     0.103 s",
			// ring2(516,992 B, 1 Gbit/s) = 4.35 ms of 0.103 s
			fmt.Sprintf("verdict: compute-bound (communication needs at least 4 %% of the compute time with fp16, 8 %% with fp32; this run sent fp16, predicted to take %.0f %% of the compute time)", 100*ring2(516992, 1)/0.103),
			"- **No**: no network was used, and the ranks waited for communication 5.5 % of the step (6.0 ms); on the assumed 1 Gbit/s link the fp16 gradients would take 4 % of the compute time by gorun's cost model: compute-bound across hosts too.",
			// MB/s = bytes a step / step time: r = -1 over 10 intervals; tanh(1.96/sqrt(7))
			"Step time and outgoing MB/s (network and shared memory) over 10 intervals: Pearson r = **-1.00** (unrelated numbers give |r| up to 0.63, 19 times in 20). Slower steps move fewer MB/s",
			"Step time and exposed communication (ms per step): **not enough data**: exposed communication (ms per step) hardly varied (coefficient of variation 0.0 %)",
			"`built-in synthetic corpus (40,000 pairs)`: made in memory at start (no file; 4.7 MB of text), **40,000 lines**",
		},
		not: []string{"growing", "watch", "on disk", "of capacity", "network-bound", "Not here", "Prediction* for a link ten times faster (1 host"},
	}, {
		// the same with Transformer-base's parameters: on the lab's link
		// its fp16 gradients need 0.974 s, more than the 0.103 s of compute
		name: "one host, network-bound on the assumed link", fixture: "onehost-shm",
		edit: func(ri *metrics.RunInfo, _ []metrics.Record) { ri.Params, ri.Buckets = 60880896, nil },
		want: []string{
			"verdict: network-bound",
			fmt.Sprintf("- **Not here, but it would be across hosts**: on one host the ranks waited for communication 5.5 %% of the step (6.0 ms); on the assumed 1 Gbit/s link the fp16 gradients would take %.3f s by gorun's cost model (at least %.3f s at the link's rate), longer than the 0.103 s a step computes",
				ring2(2*60880896, 1), fp16(60880896, 2, 1)),
		},
		not: []string{"**Yes**", "verdict: compute-bound"},
	}, {
		// shared memory off: the same bytes over loopback sockets
		name: "one host, shared memory off", fixture: "onehost-shm",
		edit: func(_ *metrics.RunInfo, recs []metrics.Record) {
			setValues(recs, func(v map[string]float64) {
				v["net_out_MBps"], v["net_in_MBps"], v["shm_out_MBps"], v["shm_in_MBps"] = v["shm_out_MBps"], v["shm_in_MBps"], 0, 0
			})
		},
		want: []string{"network 41.4 MB/s out, 41.4 MB/s in; shared memory 0.0 MB/s out, 0.0 MB/s in", "no gradient crossed a network; the loopback interface (shared memory was off) carried them"},
		not:  []string{"of capacity"},
	}, {
		// 4 ranks on hosts a and b (1 Gbit/s, probed), compute 0.5 s, step
		// 1.9 + 0.1 sin(k) s; eval loss 1 + 2 exp(-(s-250)/300) at s =
		// 250..2000, train loss below it by 0.05 + 0.35 (s-250)/1750.
		name: "network-bound across hosts, eight evaluations levelling off, gap growing", fixture: "network-bound",
		want: []string{
			"4 rank(s) on a, b, cuda:0 (NVIDIA H100 80GB HBM3, compute capability 9.0)",
			"Slope over the last 3 evaluations (steps 1,500-2,000): **-0.0503 nats per 1000 steps**, -2.0 % of the raw eval loss (2.506) per 1000 steps",
			// -0.0503 against (1.0059 - 3) / 1750 x 1000
			"- **Nearly**: the eval loss still falls, but at 4 % of its average rate since step 250 (-1.1395 per 1000 steps): it is levelling off",
			"This rests on 8 evaluations.",
			"): +0.050 at step 250, +0.400 at step 2,000.",
			"- **Not yet**: the eval loss is above the train loss and the gap grew by 0.350, but the eval loss is not rising",
			"Trained on GPUs: rank 0's is cuda:0 (NVIDIA H100 80GB HBM3",
			"**25 %** on average (rank 0 26 %, rank 1 25 %, rank 2 24 %, rank 3 25 %)",
			// 174 MB a step out over the network: mean of 174 / step time against 125 MB/s
			"network 91.2 MB/s out, 89.1 MB/s in against a link of 1 Gbit/s = 125 MB/s (probe): **73.0 %** of capacity; shared memory 31.5 MB/s out",
			"4 ranks, 1 Gbit/s link (probed at start between rank 0 and a rank on another host)",
			// 2 hosts: each host's link carries the buffer once
			fmt.Sprintf("%.3f s with fp16", fp16(60880896, 2, 1)),
			"verdict: network-bound (communication needs at least 195 % of the compute time with fp16",
			// hierarchical: the group segment's reduce-scatter and
			// allgather on each host (one shm allreduce of 2: 2 x 3 µs +
			// 121.76 MB / 3.0 GB/s) and a tree of the 2 hosts (2 hops) on
			// each local rank's half at half the link, 0.0625 GB/s
			fmt.Sprintf("- **Yes**: on the 1 Gbit/s link the fp16 gradients take %.3f s by gorun's cost model (at least %.3f s at the link's rate), longer than the 0.500 s a step computes, so no overlap can hide them; the ranks waited for communication 73.8 %% of the step (1410.3 ms).",
				(2*plan.ShmGroup.StepUs+2*plan.TLSTCP.StepUs)/1e6+121761792/(plan.ShmGroup.CapGBs*1e9)+60880896/62.5e6, fp16(60880896, 2, 1)),
			// exposed = step time - 0.5 s: r = +1 over 16 intervals; tanh(1.96/sqrt(13))
			"Step time and exposed communication (ms per step) over 16 intervals: Pearson r = **+1.00** (unrelated numbers give |r| up to 0.50, 19 times in 20). Steps are slower when more communication is exposed",
			"`data/wmt16`: **1891.2 MB** on disk",
			// a run.json without its vocabulary: the one that gives base its
			// parameters, 32,768 (the PowerSGD bytes of the case below)
			"- *Prediction* with `--compression powersgd` at the default rank 16: the gradients would be 10.908 MB a step on the wire instead of 121.762 MB with fp16",
		},
		not: []string{"No GPU", "All ranks ran on one host", "Two evaluations", "still falling; more steps would help", "**Yes**: the eval"},
	}, {
		// 2 ranks on hosts a and b, 10 Gbit/s (--link-gbps), compute 1.9
		// s, 12 ms exposed; five evaluations, the eval loss lowest at step
		// 600 and rising, the train loss falling 0.0015 a step from 3.6
		name: "compute-bound across hosts, the eval loss rising", fixture: "compute-bound", lr: func(int) float64 { return 0.001 },
		want: []string{
			"In this run the rate went from 1.000e-03 (step 1) to 1.000e-03 (step 1000).",
			"**+0.7500 nats per 1000 steps**", // (1.3, 1.4, 1.6) at steps 600, 800, 1000
			"- **Past its best**: the eval loss is rising; its lowest was 1.3000 at step 600 (see overfitting). This rests on 5 evaluations.",
			"): -0.100 at step 200, +0.700 at step 1,000.",
			"- **Yes**: the eval loss rises while the gap to the train loss grows (by 0.800). This rests on 5 evaluations.",
			"Trained on the CPU of rank 0's host (a: Intel Xeon Gold 6230, 40 logical CPUs); 1 rank there, 20 compute threads each. No GPU was used.",
			"network 97.0 MB/s out, 97.0 MB/s in against a link of 10 Gbit/s = 1250 MB/s (flag): **7.8 %** of capacity",
			"2 ranks, 10 Gbit/s link (given with --link-gbps)",
			fmt.Sprintf("%.3f s with fp16", fp16(60880896, 2, 10)),
			// at 10 Gbit/s TLS/TCP's cap, not the link, sets the rate
			fmt.Sprintf("- **No** (compute-bound): the 10 Gbit/s link carries the fp16 gradients in %.0f %% of the compute time by gorun's cost model, and the ranks waited for communication only 0.6 %% of the step (12.0 ms).", 100*ring2(2*60880896, 10)/1.9),
			"Step time and outgoing MB/s (network and shared memory): **not enough data**: 5 logged interval(s); a correlation needs at least 8",
		},
		not: []string{"Pearson", "**No**: the eval", "Nearly", "assumed"},
	}, {
		// the same with 500 ms exposed and 1.7 s of compute: the network
		// is fast enough (277 ms for the gradients), yet the ranks wait
		name: "compute-bound, but waiting", fixture: "compute-bound",
		edit: func(_ *metrics.RunInfo, recs []metrics.Record) {
			setValues(recs, func(v map[string]float64) { v["comm_exposed_ms"], v["compute_s"] = 500, 1.7 })
		},
		want: []string{fmt.Sprintf("- **Not the network's speed** (compute-bound), yet the ranks waited for communication 25.3 %% of the step (500.0 ms), more than the %.1f ms gorun's cost model gives the fp16 gradients on the 10 Gbit/s link (%.0f %% of the compute time): the rest is latency, synchronization",
			1000*ring2(2*60880896, 10), 100*ring2(2*60880896, 10)/1.7)},
		not: []string{"**No** (compute-bound)", "little of the transfer was hidden"},
	}, {
		// on 1 Gbit/s the fp16 gradients need 974 ms, still less than
		// 1.7 s of compute; the ranks wait 1000 ms: the transfer itself,
		// not hidden
		name: "compute-bound, the transfer not hidden", fixture: "compute-bound",
		edit: func(ri *metrics.RunInfo, recs []metrics.Record) {
			ri.LinkGbps = 1
			setValues(recs, func(v map[string]float64) { v["comm_exposed_ms"], v["compute_s"] = 1000, 1.7 })
		},
		want: []string{"verdict: compute-bound", fmt.Sprintf("- **Not the network's speed** (compute-bound), but little of the transfer was hidden: the ranks waited for communication 50.5 %% of the step (1000.0 ms), about the %.1f ms gorun's cost model gives the fp16 gradients on the 1 Gbit/s link", 1000*ring2(2*60880896, 1))},
		not:  []string{"**No** (compute-bound)", "latency"},
	}, {
		// stopped at step 500 (after 89 s), resumed at unix 5000 and run
		// to 520 in 9 s; eval loss 0.2501, 0.2500, 0.2499 at steps 400,
		// 500, 520; fp32 on the wire (compression none)
		name: "resumed: two segments, the eval loss flat", fixture: "resumed", lr: transformerLR,
		want: []string{
			"Training time: **1m38s** for **520 steps**, the sum of 2 segments: steps 1-500 in 1m29s (started fresh); steps 501-520 in 9s (resumed from the checkpoint of step 500).",
			"From the first start to the last record: 1h6m49s, of which 1h5m11s passed between the segments", // 5009 - 1000 s; less 98 s
			"over 11 logged intervals, from every segment",
			"Stopped by interrupt after step 500 (checkpoint ckpt-500 written).",
			"to 1.096e-02 (step 520)",
			"**-0.0015 nats per 1000 steps**, -0.1 % of the raw eval loss (1.750) per 1000 steps; within ±1 % would count as flat.",
			"- **Yes, as far as this learning rate takes it**: the eval loss has stopped falling. This rests on 6 evaluations.",
			"- **No**: the eval loss is close to (within 5 % of) the train loss and not rising.",
			"this run sent fp32",
			"- **No**: no network was used, and the ranks waited for communication 5.1 % of the step (9.0 ms); on the assumed 1 Gbit/s link the fp32 gradients would take 5 % of the compute time by gorun's cost model", // ring2(4 B x 258,496, 1 Gbit/s) against 0.169 s
			"Step time and outgoing MB/s (network and shared memory): **not enough data**: the step time hardly varied",
		},
		not: []string{"for **20 steps**", "9s for", "Pearson"},
	}, {
		// one rank, two log lines and one evaluation; no start record (run
		// started at unix 100 by run.json, last record at 126) and no
		// shared-memory counts
		name: "one rank, one evaluation, an old run directory", fixture: "one-rank",
		want: []string{
			"Training time: **26s** for **20 steps**",
			"- One evaluation (eval loss 2.5000 at step 20): a single point shows no trend; not enough data to say.",
			"- BLEU: **1.50** at step 20 (one evaluation).",
			"- The eval loss is above the train loss, but one evaluation shows no trend: not enough data to say.",
			"Trained on the CPU of one host (localhost: CPU model unknown); 1 rank there, 2 compute threads each. No GPU was used.",
			"- One rank: no gradients were exchanged",
			"Step time and outgoing network MB/s: **not enough data**: 2 logged interval(s)",
			"`data/small`: **0.5 MB** on disk",
		},
		not: []string{"Slope", "bottleneck analysis", "**No**", "**Yes"},
	}, {
		// a real 3-step run (2 ranks, --log-every 1): step 1 warms up, and
		// 2 steps after it are too few to predict from, as 3 intervals are
		// too few for a correlation: the same rule says so for both
		name: "three steps: not enough data to predict from", fixture: "three-steps",
		want: []string{
			"Step time and outgoing MB/s (network and shared memory): **not enough data**: 3 logged interval(s); a correlation needs at least 8 (--log-every logs more often).",
			"- Predictions: **not enough data**: 2 step(s) timed after the first logged interval (the warm-up); a prediction needs at least 8 (a longer run: --max-steps).",
		},
		not: []string{"*Prediction*", "scaling efficiency"},
	}, {
		// a real run stopped by SIGTERM at step 90 (its last log line at
		// step 80), resumed and stopped again at step 142 before its first
		// log line: each stop's checkpoint holds the steps since the last
		// log line, and the time up to it counts
		name: "stopped between log lines, twice", fixture: "stopped-between-logs",
		want: []string{
			"Training time: **11s** for **142 steps**, the sum of 2 segments: steps 1-90 in 6.015s (started fresh); steps 91-142 in 5.257s (resumed from the checkpoint of step 90).",
			"Stopped by terminated after step 90 (checkpoint ckpt-90 written).",
			"Stopped by terminated after step 142 (checkpoint ckpt-142 written).",
		},
		not: []string{"in one go", "6.015s for"},
	}, {
		// the same without its log lines: the stops alone give the steps
		// and the time
		name: "stopped before any log line", fixture: "stopped-between-logs",
		edit: func(_ *metrics.RunInfo, recs []metrics.Record) {
			for i := range recs {
				if recs[i].Kind == "train" {
					recs[i].Kind = "removed"
				}
			}
		},
		want: []string{
			"Training time: **11s** for **142 steps**, the sum of 2 segments: steps 1-90 in 6.015s",
			"- Step time and throughput: **not enough data**: no log line was written (--log-every logs more often).",
			"- Predictions: **not enough data**: 0 step(s) timed; a prediction needs at least 8 (a longer run: --max-steps).",
		},
		not: []string{"No training step was logged", "Average step time"},
	}, {
		// Transformer-base on the lab's cluster with GPUs: 2 hosts x 2
		// ranks, 1 Gbit/s, fp16, compute 0.26 s, step 1.15 s (made up as
		// such a run would log it, its buckets as the Bucketer cuts them).
		// PowerSGD at rank 4 would send P and Q of its 97 matrices, 4 B x
		// 4 x the sum of their n + m (168,448) = 2,695,168 B, and its
		// 63,488 other parameters in fp16, 126,976 B: 10,907,648 B a step
		// against 121,761,792; its compressor's 6nmr + 3nm + 2(n+m)r²
		// over the 60,817,408 elements, 100,352 rows and 68,096 columns,
		// 6.107 GFLOP
		name: "network-bound on the lab's cluster: what PowerSGD would give", fixture: "network-bound-2x2",
		want: []string{
			"verdict: network-bound",
			"- *Prediction* with `--compression powersgd` at the default rank 16: the gradients would be 10.908 MB a step on the wire instead of 121.762 MB with fp16 (11x less), their allreduces ",
			"(from FLOPs: 6.11 GFLOP of the compressor at the rate of the step's 6 x 60,880,896 parameters x 4096 padded batch tokens = 1.496 TFLOP in 0.260 s; a lower bound",
			"predicted for this run: compute-bound.",
		},
		not: []string{"**not enough data**: 3", "PowerSGD (rank", "with powersgd"},
	}, {
		// a run too short to measure gets report.md's "not enough data" for
		// the PowerSGD prediction too (the same rule as the what-if lines)
		name: "network-bound, too short to predict PowerSGD from", fixture: "three-steps",
		edit: func(ri *metrics.RunInfo, _ []metrics.Record) { ri.Params, ri.Buckets = 60880896, nil },
		want: []string{
			"verdict: network-bound",
			"- *Prediction* with `--compression powersgd` at the default rank 16: **not enough data**: 3 step(s) timed; a prediction needs at least 8 (a longer run: --max-steps).",
		},
		not: []string{"the gradients would be"},
	}, {
		// compute-bound: no PowerSGD line
		name: "compute-bound: no compression prediction", fixture: "compute-bound",
		not: []string{"powersgd", "PowerSGD"},
	}, {
		// FABRICATED values (powersgd-fabricated: no PowerSGD run has been
		// made yet): the same cluster with --compression powersgd
		// --powersgd-rank 4 --powersgd-start-step 200; steps 1-200 fp16 (1.15
		// s), then 16 intervals of 50 steps at 0.262 s logging P and Q's
		// 2,695,168 B, the matrices' 121,634,816 B in fp16 and 3.1 ms of
		// compressor a step. Saved: 118,939,648 B (45.1x); 3.1 ms of the
		// 0.260 s compute is 1.2 %.
		name: "a PowerSGD run (fabricated values): what it saved and cost", fixture: "powersgd-fabricated",
		want: []string{
			"- Exposed communication (after backward finished; over the 16 logged intervals PowerSGD compressed throughout, not the 4 before): **2.1 ms** per step",
			"0.023 s with powersgd (2(n-1)/n x bytes / bandwidth, n hosts)", // 10,907,648 B / 125 MB/s
			"this run sent powersgd, predicted to take",
			"- **No** (compute-bound): the 1 Gbit/s link carries the powersgd gradients in",
			"- **PowerSGD (rank 4, from step 200)** all-reduced P and Q of 97 matrices, 2.695 MB a step (powersgd_bytes, the mean of 800 steps), where fp16 sends 121.635 MB for them (powersgd_fp16_bytes): 118.940 MB a step saved (45.1x less); the planner gives P and Q 2.695 MB, and with the tensors left in fp16 a step's allreduces 2.822 MB against 121.762 MB with fp16 alone; its compute held the buckets up 3.1 ms a step (powersgd_compute_ms), 1.2 % of the 0.260 s a step computed.",
			"it measured 0.401 s, 0.262 s over the 800 steps PowerSGD compressed (the plan is of those).",
		},
		not: []string{"*Prediction* with `--compression powersgd`", "**Yes**", "not enough data**: 3"},
	}, {
		// the trainer averages over all of an interval's steps: the one
		// that holds the start step (here steps 201-250, 10 of them
		// compressed) logs a fifth of a step's bytes and is left out of
		// PowerSGD's numbers (the mean of the other 15 intervals: 750
		// steps)
		name: "a PowerSGD run whose start step falls inside an interval", fixture: "powersgd-fabricated",
		edit: func(ri *metrics.RunInfo, recs []metrics.Record) {
			ri.PowerSGDStartStep = 240
			for _, r := range recs {
				if r.Kind == "train" && r.Step == 250 {
					for _, k := range []string{"powersgd_bytes", "powersgd_fp16_bytes", "powersgd_compute_ms"} {
						r.Values[k] /= 5
					}
				}
			}
		},
		want: []string{"**PowerSGD (rank 4, from step 240)** all-reduced P and Q of 97 matrices, 2.695 MB a step (powersgd_bytes, the mean of 750 steps), where fp16 sends 121.635 MB for them",
			"over the 15 logged intervals PowerSGD compressed throughout, not the 5 before"},
	}, {
		// the same run's compressor not logged: the planner's count of the
		// matrices' fp16 bytes stands in
		name: "a PowerSGD run without its fp16 bytes and compute logged", fixture: "powersgd-fabricated",
		edit: func(_ *metrics.RunInfo, recs []metrics.Record) {
			setValues(recs, func(v map[string]float64) { delete(v, "powersgd_fp16_bytes"); delete(v, "powersgd_compute_ms") })
		},
		want: []string{"where fp16 sends 121.635 MB for them (the planner's count of them): 118.940 MB a step saved", "; its compute was not logged (powersgd_compute_ms)."},
	}, {
		// three steps with PowerSGD on: too few to say what it saved
		name: "a PowerSGD run too short to measure", fixture: "three-steps",
		edit: func(ri *metrics.RunInfo, recs []metrics.Record) {
			ri.Compression = "powersgd"
			setValues(recs, func(v map[string]float64) {
				v["powersgd_bytes"], v["powersgd_fp16_bytes"], v["powersgd_compute_ms"] = 38912, 480256, 1.5
			})
		},
		want: []string{"- **PowerSGD (rank 16)**: **not enough data**: 3 step(s) timed with PowerSGD on; a measure of what it saved needs at least 8 (a longer run: --max-steps, or an earlier --powersgd-start-step)."},
		not:  []string{"a step saved"},
	}} {
		t.Run(c.name, func(t *testing.T) {
			rep := reportFixture(t, c.fixture, c.lr, c.edit)
			for _, w := range c.want {
				if !strings.Contains(rep, w) {
					t.Errorf("report lacks %q", w)
				}
			}
			for _, n := range c.not {
				if strings.Contains(rep, n) {
					t.Errorf("report says %q", n)
				}
			}
			if strings.Contains(rep, "n/a") {
				t.Errorf("report has an n/a")
			}
			if t.Failed() {
				t.Logf("report.md:\n%s", rep)
			}
		})
	}
}
