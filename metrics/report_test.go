package metrics

import (
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestReportAnswersEveryQuestion(t *testing.T) {
	dir := t.TempDir()
	ri := RunInfo{Preset: "tiny", Params: 60880896, DModel: 512, WorldSize: 4, Hosts: []string{"a", "a", "b", "b"},
		BatchTokens: 4096, LRPolicy: "transformer", LearningRate: 2, Warmup: 8000, LinkGbps: 1, LinkSource: "flag",
		Dataset: Dataset{Name: "wmt16", MB: 1891.2, Lines: 4524868, SrcTokens: 1e8, TgtTokens: 1.1e8, Dropped: 12}}
	if err := WriteRunInfo(dir, ri); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRun(dir)
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

	path, err := WriteReport(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	rep := string(b)
	sections := strings.Split(rep, "\n## ")[1:]
	questions := []string{"How long", "learning-rate", "fully trained", "overfitting", "devices busy", "network the bottleneck", "step time relate", "training set", "checkpoint"}
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
	for _, want := range []string{"9.882e-04", "2,000 steps", "4,524,868 lines", "model.safetensors", "still falling", "1.461 s with fp16", "loss.png"} {
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
		ri := RunInfo{Preset: "tiny", WorldSize: 1, Device: "cpu"}
		vals := map[string]float64{"loss": 1, "loss_raw": 1, "step_time_s": 1, "cpu_util_pct": 90, "compute_s": 1}
		if gpu {
			ri.Device = "cuda:0 (NVIDIA H100 80GB HBM3, compute capability 9.0)"
			vals["gpu_util_pct"], vals["gpu_mem_used_MiB"], vals["gpu_mem_peak_MiB"] = 87, 20480, 15000
		}
		if err := WriteRunInfo(dir, ri); err != nil {
			t.Fatal(err)
		}
		r, err := OpenRun(dir)
		if err != nil {
			t.Fatal(err)
		}
		r.Log("train", 10, vals, nil)
		r.Close()
		path, err := WriteReport(dir)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(path)
		rep := string(b)
		want := []string{"Trained on the CPU (cpu): no GPU was used"}
		if gpu {
			want = []string{"GPU utilization (NVML): **87 %**", "NVIDIA H100", "20480 MiB in use", "peaked at 15000 MiB"}
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
