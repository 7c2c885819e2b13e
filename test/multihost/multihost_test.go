package multihost

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// gorun -np 4 -hostfile H ring across two hosts over ssh: every rank runs,
// two on each host (slots=2, filled in order), tagged output, exit 0.
func TestRingAcrossHosts(t *testing.T) {
	e := need(t)
	out, code := e.run(t, 60*time.Second, "-np", "4", e.ring)
	if code != 0 {
		t.Fatalf("gorun -np 4 ring across 2 hosts: exit status %d, want 0; output:\n%s", code, out)
	}
	if !strings.Contains(out, "[0] ring: token of 8 bytes went 3 times around 4 ranks (sum 6 ok)") {
		t.Errorf("rank 0 did not report the token's sum; output:\n%s", out)
	}
	re := regexp.MustCompile(`(?m)^\[(\d)\] rank (\d) of 4 \(local (\d), host ([0-9.]+), launcher gorun\): barrier passed$`)
	host := map[int]string{}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		tag, _ := strconv.Atoi(m[1])
		r, _ := strconv.Atoi(m[2])
		local, _ := strconv.Atoi(m[3])
		if tag != r {
			t.Errorf("line of rank %d tagged [%d]", r, tag)
		}
		if want := r % 2; local != want {
			t.Errorf("rank %d has local rank %d, want %d", r, local, want)
		}
		host[r] = m[4]
	}
	if len(host) != 4 {
		t.Fatalf("barrier lines from %d ranks, want 4; output:\n%s", len(host), out)
	}
	// Slots fill in order: ranks 0,1 on the first host, 2,3 on the second;
	// the names are the ones each rank registered (Mesh.HostNames).
	for r := 0; r < 4; r++ {
		if want := e.ips[r/2]; host[r] != want {
			t.Errorf("rank %d on host %s, want %s", r, host[r], want)
		}
	}
	e.noneLeft(t, 10*time.Second)
}

// The training program across the two hosts over ssh, one rank each: a few
// tiny-preset steps, the link probe between the hosts and the bottleneck
// verdict at the end.
func TestTrainAcrossHosts(t *testing.T) {
	e := need(t)
	dir := t.TempDir()
	out, code := e.run(t, 120*time.Second, "-np", "2", "--map-by", "node", e.train, "train", "--preset", "tiny",
		"--synthetic-lines", "2000", "--max-steps", "10", "--log-every", "5", "--eval-every", "0", "--checkpoint-every", "0",
		"--run-dir", dir)
	if code != 0 {
		t.Fatalf("nmt-train on 2 hosts: exit status %d; output:\n%s", code, out)
	}
	for _, want := range []string{
		fmt.Sprintf("2 rank(s) on %s, %s", e.ips[0], e.ips[1]),
		fmt.Sprintf("link probe rank 0 -> rank 1 (%s)", e.ips[1]),
		"nmt-train: transport ",
		fmt.Sprintf(" (auto: start-up probe rank 0 <-> rank 1 (%s): TLS/TCP ", e.ips[1]),
		"step 10/10 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("nmt-train's output lacks %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "probe") || strings.Contains(l, "verdict") || strings.Contains(l, "step 10/10 |") {
			t.Log(l)
		}
	}
	checkVerdict(t, out, dir)
	e.noneLeft(t, 10*time.Second)
}

// checkVerdict checks nmt-train's link probe and bottleneck analysis (rank
// 0's lines in gorun's output) against the shaped link, run.json's
// parameter count and metrics.jsonl's compute times: the probe no faster
// than the link, the analysis on the probed rate, the least allreduce
// times 2(n-1)/n x gradient bytes / rate for fp32 and fp16, the measured
// compute the mean of the logged compute_s, the verdict the one those
// numbers give, and the percentages their ratios.
func checkVerdict(t *testing.T, out, dir string) {
	t.Helper()
	num := func(re string) float64 {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("nmt-train's output has no line matching %s:\n%s", re, out)
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatalf("%q: %v", m[0], err)
		}
		return v
	}
	near := func(what string, got, want, tol float64) {
		t.Helper()
		if !(math.Abs(got-want) <= tol) {
			t.Errorf("%s: nmt-train printed %v, want %.4g (within %.2g)", what, got, want, tol)
		}
	}
	var ri struct {
		Params    int64   `json:"params"`
		WorldSize int     `json:"world_size"`
		LinkGbps  float64 `json:"link_gbps"`
		Source    string  `json:"link_source"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "run.json"))
	if err != nil || json.Unmarshal(b, &ri) != nil || ri.Params <= 0 || ri.WorldSize != 2 {
		t.Fatalf("run.json: %v %+v\n%s", err, ri, b)
	}
	var compute []float64
	mb, err := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatalf("no metrics.jsonl in the run directory: %v", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(mb)), "\n") {
		var r struct {
			Kind   string             `json:"kind"`
			Values map[string]float64 `json:"values"`
		}
		if json.Unmarshal([]byte(l), &r) == nil && r.Kind == "train" {
			compute = append(compute, r.Values["compute_s"])
		}
	}
	if len(compute) != 2 { // steps 5 and 10
		t.Fatalf("metrics.jsonl: %d train records, want 2:\n%s", len(compute), mb)
	}
	link := linkRateBps / 1e9
	probe := num(`link probe rank 0 -> rank 1 \([0-9.]+\): ([0-9.]+) Gbit/s point to point`)
	if probe <= 0 || probe > 1.1*link {
		t.Errorf("link probe %.2f Gbit/s on the %s link: want more than 0 and at most 110 %% of it (the 1 MB token bucket is 4 %% of the probe's 24 MiB)", probe, baseLink)
	}
	near("run.json's link_gbps (the probed rate)", ri.LinkGbps, probe, 0.005)
	if ri.Source != "probe" {
		t.Errorf("run.json's link_source %q, want probe", ri.Source)
	}
	gbps := num(`bottleneck analysis: [0-9.]+ M parameters, 2 ranks, ([0-9.]+) Gbit/s link`)
	near("the analysis' link rate", gbps, ri.LinkGbps, 0.005*ri.LinkGbps)
	near("the analysis' parameters (M)", num(`bottleneck analysis: ([0-9.]+) M parameters`), float64(ri.Params)/1e6, 0.05)
	bytesPerSec := ri.LinkGbps * 1e9 / 8
	fp32, fp16 := 4*float64(ri.Params)/bytesPerSec, 2*float64(ri.Params)/bytesPerSec // 2(n-1)/n = 1 for 2 ranks
	near("least allreduce time with fp32 (s)", num(`least allreduce time per step: ([0-9.]+) s with fp32`), fp32, 0.0005)
	near("least allreduce time with fp16 (s)", num(`s with fp32 gradients, ([0-9.]+) s with fp16`), fp16, 0.0005)
	c := num(`measured compute per step: +([0-9.]+) s`)
	near("measured compute per step (s), against the mean compute_s of metrics.jsonl", c, (compute[0]+compute[1])/2, 0.0005)
	verdict := "compute-bound"
	if fp16 > c {
		verdict = "network-bound"
	}
	if !strings.Contains(out, "verdict: "+verdict+" (communication needs at least ") {
		t.Errorf("want the verdict %q (fp16 allreduce %.4f s against compute %.3f s):\n%s", verdict, fp16, c, out)
	}
	// c is printed to 1 ms: the ratios are good to that
	rel := 0.0005 / c
	near("fp16 share of compute (%)", num(`needs at least ([0-9]+) % of the compute time with fp16`), 100*fp16/c, 100*fp16/c*rel+0.5)
	near("fp32 share of compute (%)", num(`with fp16, ([0-9]+) % with fp32`), 100*fp32/c, 100*fp32/c*rel+0.5)
}

// Allreduce across the 1 Gbit/s tbf-shaped link: ring and tree correct on
// 4 ranks (bin/allreduce-perf -c 1, an odd element count included), and
// on 2 hosts, with each transport, correct results at 64 MiB whose bus
// bandwidth is logged and at most 105 % of the link's (the 1 MB token
// bucket is 1.5 % of 64 MiB): a number above the rate means the link was
// not shaped. The shapers themselves must have carried the traffic: each
// host's egress qdisc is at the link's rate and counted at least the bytes
// its rank sent. How much of the link gorun fills (issue 18's "at least
// 90 %") is a timing, and timings are the benchmark's to measure
// (bench/peers/multihost_busbw.sh, numbers in docs/performance.md), not a
// test's to assert: on CI's two shared cores a loaded moment took QUIC,
// which needs most of a core per side at 1 Gbit/s, to 88 %.
func TestAllreduceShapedLink(t *testing.T) {
	e := need(t)
	for _, algo := range []string{"ring", "tree"} {
		t.Run(algo+"/np4", func(t *testing.T) {
			// 999996 bytes: an odd element count (249999 floats).
			out, code := e.run(t, 90*time.Second, "-np", "4", "-x", "GORUN_ALLREDUCE="+algo,
				e.perf, "-b", "999996", "-e", "3999984", "-f", "4", "-n", "2", "-w", "1", "-c", "1")
			if code != 0 {
				t.Fatalf("allreduce-perf %s on 4 ranks: exit status %d; output:\n%s", algo, code, out)
			}
			checkPerf(t, out, algo, []int{999996, 3999984})
			// two ranks on each host: the phases within a host in its
			// group segment (shared memory between the namespaces' ranks)
			if !strings.Contains(out, "hierarchical allreduce: 2 hosts x 2 ranks, within rank 0's host through the group segment") {
				t.Errorf("allreduce-perf %s on 4 ranks: not hierarchical through the group segment; output:\n%s", algo, out)
			}
		})
	}
	// Auto on 4 ranks across the hosts, flat: it chooses on the link the
	// start-up probe measured (collective.Config.Across), which at 1 Gbit/s
	// gives these sizes to the ring (the tree sends 2 buffers through its
	// busiest rank's link, the ring 1.5); the cost model fitted on one
	// host's cores would take the tree
	t.Run("auto/np4-flat", func(t *testing.T) {
		out, code := e.run(t, 90*time.Second, "-np", "4", "-x", "GORUN_HIERARCHICAL=0",
			e.perf, "-b", "999996", "-e", "3999984", "-f", "4", "-n", "2", "-w", "1", "-c", "1")
		if code != 0 {
			t.Fatalf("allreduce-perf auto on 4 ranks: exit status %d; output:\n%s", code, out)
		}
		if !strings.Contains(out, "# auto chooses with the cost model of the link across hosts: ") {
			t.Errorf("allreduce-perf auto on 4 ranks across hosts: no word of the link's cost model; output:\n%s", out)
		}
		checkPerf(t, out, "ring", []int{999996, 3999984})
	})
	// One rank per host, 64 MiB, 4 timed allreduces (archeck reports the
	// best). The default transport (auto: the probe's choice, which rank 0
	// states with both rates) with both algorithms, and each transport set
	// by hand: at 1 Gbit/s the probe may pick either, so auto alone would
	// not always try both.
	link := linkRateBps / 8 / 1e9 // GB/s
	for _, c := range []struct{ algo, transport string }{{"ring", "auto"}, {"tree", "auto"}, {"ring", "quic"}, {"tree", "tcp"}} {
		algo := c.algo
		t.Run(algo+"/"+c.transport+"/busbw", func(t *testing.T) {
			sent0 := shaperSent(t, e)
			out, code := e.run(t, 90*time.Second, "-np", "2", "--map-by", "node", "-x", "GORUN_ALLREDUCE="+algo, "-x", "GORUN_TRANSPORT="+c.transport, e.archeck, "-bytes", "64M", "-iters", "4")
			if code != 0 {
				t.Fatalf("allreduce %s of 64 MiB on 2 hosts: exit status %d; output:\n%s", algo, code, out)
			}
			line, bus, _ := archeckResult(t, out)
			if field(line, "wrong") != "0" {
				t.Fatalf("wrong results: %q", line)
			}
			checkChoice(t, out, c.transport, field(line, "transport"))
			t.Logf("%s allreduce 64 MiB, np 2 across 2 hosts, link %s: best busbw %.4f GB/s = %.1f %% of %.3f GB/s",
				algo, baseLink, bus, 100*bus/link, link)
			if bus > 1.05*link {
				t.Errorf("%s allreduce busbw %.4f GB/s is %.1f %% of the %s link (%.3f GB/s), want <= 105 %%: faster than the link, which is then not shaped",
					algo, bus, 100*bus/link, baseLink, link)
			}
			// every timed and warm-up allreduce: each rank sends 64 MiB
			const want = (4 + 1) * (64 << 20)
			for i, s := range shaperSent(t, e) {
				if d := s - sent0[i]; d < want {
					t.Errorf("host %d: its %s shaper counted %d bytes sent during the run, want >= %d: the traffic did not cross the shaped link", i+1, baseLink, d, want)
				}
			}
		})
	}
}

// checkChoice checks what rank 0 said of the transport: with auto, the
// probe between the two hosts, both rates, and TLS/TCP chosen only where
// it moved more than 1.1 times QUIC's rate; set by hand, that.
func checkChoice(t *testing.T, out, asked, got string) {
	t.Helper()
	var why string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "[0] archeck: transport ") {
			why = l
		}
	}
	if asked != "auto" {
		if got != asked || !strings.Contains(why, "set with GORUN_TRANSPORT") {
			t.Errorf("GORUN_TRANSPORT=%s: transport %q, rank 0 says %q", asked, got, why)
		}
		return
	}
	m := regexp.MustCompile(`auto: start-up probe rank 0 <-> rank 1 \(\S+\): TLS/TCP ([0-9.]+) GB/s, QUIC ([0-9.]+) GB/s each way; (.+)\)$`).FindStringSubmatch(why)
	if m == nil {
		t.Fatalf("auto across 2 hosts: rank 0 does not say which transport the probe chose and why: %q", why)
	}
	t.Log(why)
	tcp, _ := strconv.ParseFloat(m[1], 64)
	quic, _ := strconv.ParseFloat(m[2], 64)
	want := "quic"
	if tcp > 1.1*quic {
		want = "tcp"
	}
	if math.Abs(tcp/quic-1.1) < 0.01 { // at the margin as printed: either
		want = got
	}
	if tcp <= 0 || quic <= 0 || got != want {
		t.Errorf("auto: probe TLS/TCP %v GB/s, QUIC %v GB/s, transport %q, want %q: %q", tcp, quic, got, want, why)
	}
}

// shaperSent checks that every host's egress qdisc (eth0 in its namespace)
// shapes at baseLink's rate and returns the bytes each has sent.
func shaperSent(t *testing.T, e *env) []uint64 {
	t.Helper()
	re := regexp.MustCompile(`(?s)qdisc (tbf|netem) .*?rate (\S+).*?Sent (\d+) bytes`)
	var out []uint64
	for i := 1; i <= hostsPerTest; i++ {
		b, err := exec.Command("ip", "netns", "exec", e.ns(i), "tc", "-s", "qdisc", "show", "dev", "eth0").CombinedOutput()
		if err != nil {
			t.Fatalf("host %d: tc -s qdisc show dev eth0: %v\n%s", i, err, b)
		}
		m := re.FindStringSubmatch(string(b))
		if m == nil || !strings.EqualFold(m[2], strings.Fields(baseLink)[1]) {
			t.Fatalf("host %d: eth0 is not shaped to %s (tbf or netem); tc -s qdisc show dev eth0:\n%s", i, baseLink, b)
		}
		n, _ := strconv.ParseUint(m[3], 10, 64)
		out = append(out, n)
	}
	return out
}

// 1 % packet loss (and 5 ms delay where the kernel has netem): allreduce
// results stay correct, and the slowdown against the lossless link is
// reported (lossless and lossy runs alternate, so that both see the same
// load on the shared cores).
func TestLossyLink(t *testing.T) {
	e := need(t)
	if !e.netem && !e.nft {
		t.Skip("packet loss needs sch_netem or nftables (apt-get install nftables); neither is here")
	}
	const size = "16M"
	lossy := baseLink + " delay 5ms loss 1%"
	t.Cleanup(func() { e.link(t, baseLink) })
	measure := func(t *testing.T, what string) (best, median float64) {
		out, code := e.run(t, 120*time.Second, "-np", "2", "--map-by", "node", "-x", "GORUN_ALLREDUCE=ring", e.archeck, "-bytes", size, "-iters", "5")
		if code != 0 {
			t.Fatalf("allreduce of %s on %s: exit status %d; output:\n%s", size, what, code, out)
		}
		line, _, _ := archeckResult(t, out)
		if field(line, "wrong") != "0" {
			t.Fatalf("wrong results on %s: %q", what, line)
		}
		best, _ = strconv.ParseFloat(field(line, "best_s"), 64)
		median, _ = strconv.ParseFloat(field(line, "median_s"), 64)
		return best, median
	}
	var clean, lost []float64 // medians, ms
	var cleanBest, lostBest float64
	for round := 0; round < 2; round++ {
		e.link(t, baseLink)
		b, m := measure(t, "the lossless link")
		clean = append(clean, m*1e3)
		if cleanBest == 0 || b < cleanBest {
			cleanBest = b
		}
		msg := e.link(t, lossy)
		if round == 0 && !e.netem {
			t.Logf("LINK=%q: this kernel has no sch_netem, so the 5 ms delay is left out (loss is an nftables rule): %s", lossy, strings.TrimSpace(msg))
		}
		if round == 0 {
			for _, algo := range []string{"ring", "tree"} {
				out, code := e.run(t, 120*time.Second, "-np", "4", "-x", "GORUN_ALLREDUCE="+algo,
					e.perf, "-b", "4M", "-e", "4M", "-n", "2", "-w", "1", "-c", "1")
				if code != 0 {
					t.Fatalf("allreduce-perf %s on 4 ranks with loss: exit status %d; output:\n%s", algo, code, out)
				}
				checkPerf(t, out, algo, []int{4 << 20})
			}
		}
		b, m = measure(t, "the lossy link")
		lost = append(lost, m*1e3)
		if lostBest == 0 || b < lostBest {
			lostBest = b
		}
	}
	if !e.netem {
		// The nftables rule counts what it dropped: proof that loss happened.
		var drops []string
		for i := 1; i <= hostsPerTest; i++ {
			out, _ := exec.Command("ip", "netns", "exec", e.ns(i), "nft", "list", "table", "inet", "gorunloss").Output()
			m := regexp.MustCompile(`counter packets (\d+)`).FindStringSubmatch(string(out))
			if m == nil || m[1] == "0" {
				t.Errorf("host %d: the loss rule dropped nothing (nft list: %q)", i, out)
				continue
			}
			drops = append(drops, fmt.Sprintf("host %d dropped %s packets", i, m[1]))
		}
		t.Logf("loss rule: %s (in the last lossy run)", strings.Join(drops, ", "))
	}
	avg := func(v []float64) float64 { return (v[0] + v[1]) / 2 }
	t.Logf("allreduce ring %s, np 2 across 2 hosts, median of 5 per run: lossless %.1f, %.1f ms (best %.1f ms); %s: %.1f, %.1f ms (best %.1f ms); slowdown x%.2f (medians), x%.2f (best)",
		size, clean[0], clean[1], cleanBest*1e3, lossy, lost[0], lost[1], lostBest*1e3, avg(lost)/avg(clean), lostBest/cleanBest)
}

// One host lost mid-run (its link cut, or its ranks killed with SIGKILL):
// gorun and every other rank exit with an error naming a rank of the lost
// host within the timeout, and no process of the job is left anywhere.
func TestHostLost(t *testing.T) {
	e := need(t)
	const timeout = 10 * time.Second // GORUN_TIMEOUT of the ranks
	lostIP := e.ips[1]
	start := func(t *testing.T) *job {
		j := e.start(t, "-np", "4", "--grace", "2s", "-x", "GORUN_TIMEOUT="+timeout.String(), e.archeck, "-bytes", "1M", "-iters", "1", "-duration", "60s")
		j.waitLine(t, "running until", 60*time.Second)
		time.Sleep(300 * time.Millisecond) // well inside the allreduce loop
		return j
	}
	check := func(t *testing.T, j *job, fault time.Time, limit time.Duration) {
		out, code := j.wait(t, limit+30*time.Second)
		took := j.end.Sub(fault)
		t.Logf("gorun exited with status %d %.1fs after the fault:\n%s", code, took.Seconds(), out)
		if code == 0 {
			t.Errorf("gorun exited 0 after host 2 was lost")
		}
		if took > limit {
			t.Errorf("gorun took %.1fs after the fault to exit, want <= %v", took.Seconds(), limit)
		}
		if strings.Contains(out, "archeck: np ") {
			t.Errorf("a rank finished as if nothing happened")
		}
		named := false
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, lostIP) && regexp.MustCompile(`rank [23]\b`).MatchString(l) {
				named = true
			}
		}
		if !named {
			t.Errorf("no error line names rank 2 or 3 on the lost host %s; output:\n%s", lostIP, out)
		}
	}

	t.Run("link-cut", func(t *testing.T) {
		j := start(t)
		e.cut(t, 2, "down")
		fault := time.Now()
		restored := false
		defer func() {
			if !restored {
				e.cut(t, 2, "up")
			}
		}()
		// The ranks on host 1 wait timeout for host 2, then the launcher
		// stops the rest (grace 2s).
		check(t, j, fault, timeout+10*time.Second)
		// The ranks on the cut-off host stop by themselves (their own
		// timeout), though nobody can tell them to.
		deadline := time.Now().Add(timeout + 10*time.Second)
		for {
			var ranks []string
			for _, p := range e.jobProcs(2) {
				if strings.HasPrefix(p.exe, e.bin+"/") {
					ranks = append(ranks, p.String())
				}
			}
			if len(ranks) == 0 {
				t.Logf("the ranks of the cut-off host ended %.1fs after the cut", time.Since(fault).Seconds())
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("ranks still running on the cut-off host %.0fs after the cut:\n  %s", time.Since(fault).Seconds(), strings.Join(ranks, "\n  "))
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Its sshd sessions can only learn that the client is gone once
		// the link is back.
		e.cut(t, 2, "up")
		restored = true
		e.noneLeft(t, 15*time.Second)
	})

	t.Run("kill-9", func(t *testing.T) {
		j := start(t)
		var killed []int
		for _, p := range e.procs(2) {
			if p.exe == e.archeck {
				if err := syscallKill(p.pid); err == nil {
					killed = append(killed, p.pid)
				}
			}
		}
		fault := time.Now()
		if len(killed) != 2 {
			t.Errorf("killed %d archeck processes on host 2, want 2", len(killed))
		}
		check(t, j, fault, timeout+5*time.Second)
		e.noneLeft(t, 15*time.Second)
	})
}

// A process on another test host without the job secret can neither join
// the rendezvous nor hand data to a rank, and the job is not disturbed.
func TestStrangerCannotJoin(t *testing.T) {
	e := need(t)
	j := e.start(t, "-np", "4", e.ring, "-hold", "6s")
	// Rank 0 (host 1): its rendezvous address, job id and mesh port.
	var rank0 proc
	var rdv, jobID, meshAddr string
	deadline := time.Now().Add(30 * time.Second)
	for meshAddr == "" {
		if time.Now().After(deadline) {
			t.Fatalf("rank 0 of the job did not show up on host 1 with a mesh port; output:\n%s", j.output())
		}
		time.Sleep(100 * time.Millisecond)
		for _, p := range e.procs(1) {
			if p.exe != e.ring {
				continue
			}
			env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.pid))
			if err != nil || !strings.Contains(string(env), "\x00GORUN_RANK=0\x00") {
				continue
			}
			rank0 = p
			for _, kv := range strings.Split(string(env), "\x00") {
				if v, ok := strings.CutPrefix(kv, "GORUN_RENDEZVOUS="); ok {
					rdv = v
				}
				if v, ok := strings.CutPrefix(kv, "GORUN_JOB_ID="); ok {
					jobID = v
				}
			}
			meshAddr = udpListenAddr(e.ns(1), rank0.pid)
		}
	}
	t.Logf("rank 0: %v, rendezvous %s, job %s, mesh %s", rank0, rdv, jobID, meshAddr)

	// 1. A would-be rank 1 with the job's public facts but another secret.
	other := make([]byte, 32)
	for i := range other {
		other[i] = byte(i*7 + 1)
	}
	stranger := exec.Command("ip", "netns", "exec", e.ns(2), "env", "-i",
		"GORUN_RANK=1", "GORUN_SIZE=4", "GORUN_RENDEZVOUS="+rdv, "GORUN_JOB_ID="+jobID,
		"GORUN_SECRET="+hex.EncodeToString(other), "GORUN_TIMEOUT=10s", e.ring)
	out, err := testenv.RunTimeout(stranger, 30*time.Second)
	t.Logf("ring without the secret on host 2: %v: %s", err, strings.TrimSpace(out))
	if err == nil {
		t.Errorf("a ring rank without the job secret joined the job and exited 0:\n%s", out)
	} else if !strings.Contains(out, "secret") {
		t.Errorf("the stranger's error does not say the secret is wrong: %s", out)
	}

	// 2. A raw QUIC client with a certificate of its own, against the
	// rendezvous and against rank 0's mesh port.
	for _, addr := range []string{rdv, meshAddr} {
		c := exec.Command("ip", "netns", "exec", e.ns(2), e.intruder, "-addr", addr)
		out, err := testenv.RunTimeout(c, 30*time.Second)
		t.Logf("intruder -> %s: %v: %s", addr, err, strings.TrimSpace(out))
		if err != nil || !strings.Contains(out, "handshake refused") {
			t.Errorf("intruder against %s was not refused (%v):\n%s", addr, err, out)
		}
	}

	out, code := j.wait(t, 60*time.Second)
	if code != 0 {
		t.Fatalf("the job with strangers around: exit status %d, want 0; output:\n%s", code, out)
	}
	if !strings.Contains(out, "(sum 6 ok)") || strings.Count(out, "barrier passed") != 4 {
		t.Errorf("the job's token or barrier went wrong with strangers around:\n%s", out)
	}
	e.noneLeft(t, 10*time.Second)
}

// udpListenAddr returns the UDP address process pid listens on inside
// namespace ns ("" if none yet).
func udpListenAddr(ns string, pid int) string {
	out, err := exec.Command("ip", "netns", "exec", ns, "ss", "-Hunap").Output()
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 4 && strings.Contains(l, fmt.Sprintf("pid=%d,", pid)) {
			return f[3]
		}
	}
	return ""
}

// checkPerf checks allreduce-perf's table (rank 0's lines in gorun's
// output): one row per size, each with the algorithm asked for and 0 wrong
// elements out of place and in place, and the final "0 OK".
func checkPerf(t *testing.T, out, algo string, sizes []int) {
	t.Helper()
	rows := map[int]bool{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(strings.TrimPrefix(l, "[0]"))
		if len(f) < 13 || strings.HasPrefix(f[0], "#") {
			continue
		}
		size, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		// size count type redop algo | time algbw busbw #wrong | time algbw busbw #wrong
		if f[4] != algo || f[8] != "0" || f[12] != "0" {
			t.Errorf("allreduce-perf row %q: want algo %s and #wrong 0 (out of place and in place)", l, algo)
		}
		rows[size] = true
	}
	for _, s := range sizes {
		if !rows[s] {
			t.Errorf("allreduce-perf printed no row for %d bytes; output:\n%s", s, out)
		}
	}
	if !strings.Contains(out, "Out of bounds values : 0 OK") {
		t.Errorf("allreduce-perf did not report 0 wrong values; output:\n%s", out)
	}
}
