package train

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/fusion/fusiontest"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/transformer"
)

// psgdArgs: 2 ranks of the tiny preset with PowerSGD from step 2 at rank
// 2, dropout off, small buckets (several of them compressed).
var psgdArgs = []string{"--preset", "tiny", "--synthetic-lines", "2000", "--max-length", "24", "--batch-tokens", "1024",
	"--learning-rate", "1", "--warmup-steps", "10", "--log-every", "1", "--eval-sentences", "0", "--eval-every", "0",
	"--quiet", "--threads", "1", "--no-dropout", "--bucket-cap-mb", "0.25", "--first-bucket-mb", "0.05",
	"--compression", "powersgd", "--powersgd-rank", "2", "--powersgd-start-step", "2"}

// modelSum is the SHA-256 of a checkpoint's weights file.
func modelSum(t *testing.T, ck string) string {
	t.Helper()
	f, err := transformer.ReadSafetensors(filepath.Join(ck, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	return f.SHA256
}

// A run checkpointed at step 3 (after PowerSGD started at step 2) and
// resumed reaches the same weights at step 6 as a run never stopped, bit
// for bit: the checkpoint holds both ranks' error feedback and Q
// (powersgd.safetensors, in SHA256SUMS), rank 0 reads them and gives each
// rank its own. On the host path and on the device path (the HostStaging
// double). The per-step PowerSGD figures are logged from step 2 on.
func TestPowerSGDResumeExact(t *testing.T) {
	defer cpu.SetThreads(cpu.SetThreads(1))
	onCPU := func(int) func(string) (kernels.Backend, string, error) { return openDefault }
	var doubles [2]*fusiontest.StagedCPU
	staged := func(r int) func(string) (kernels.Backend, string, error) {
		return func(spec string) (kernels.Backend, string, error) {
			c := cpu.New()
			c.Threads = 1
			doubles[r] = fusiontest.NewStagedCPU(c, uint64(r)+1, time.Millisecond)
			return doubles[r], "cpu behind a HostStaging test double", nil
		}
	}
	for _, tc := range []struct {
		name string
		open func(int) func(string) (kernels.Backend, string, error)
	}{{"host", onCPU}, {"device", staged}} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{}, psgdArgs...), "--checkpoint-every", "3")
			full, cut := t.TempDir(), t.TempDir()
			runRanks(t, 2, optionsFor(t, append(args, "--max-steps", "6", "--run-dir", full)...), tc.open)
			runRanks(t, 2, optionsFor(t, append(args, "--max-steps", "3", "--run-dir", cut)...), tc.open)
			out := runRanks(t, 2, optionsFor(t, append(args, "--max-steps", "6", "--resume", "--run-dir", cut)...), tc.open)
			if tc.name == "device" {
				for r, d := range doubles {
					if err := d.Err(); err != nil {
						t.Fatalf("rank %d: HostStaging contract: %v", r, err)
					}
				}
			}
			if !strings.Contains(out, "powersgd: error feedback and Q restored from ckpt-3/powersgd.safetensors") {
				t.Fatalf("the resumed run did not restore PowerSGD's state:\n%s", out)
			}
			sums, err := os.ReadFile(filepath.Join(cut, "ckpt-3", "SHA256SUMS"))
			if err != nil || !strings.Contains(string(sums), "  powersgd.safetensors\n") {
				t.Fatalf("ckpt-3/SHA256SUMS does not list powersgd.safetensors (%v):\n%s", err, sums)
			}
			f, err := checkpoint.ReadFile(filepath.Join(cut, "ckpt-3"), "powersgd.safetensors")
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(f.Names(), " "); got != "error/rank0 error/rank1 q" {
				t.Fatalf("powersgd.safetensors holds %s", got)
			}
			if a, b := modelSum(t, filepath.Join(full, "ckpt-6")), modelSum(t, filepath.Join(cut, "ckpt-6")); a != b {
				t.Fatalf("the weights at step 6 differ between the run resumed at step 3 and the run never stopped\n%s", out)
			}
			recs, err := metrics.ReadJSONL(filepath.Join(full, "metrics.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if r.Kind != "train" {
					continue
				}
				b, f16, ms := r.Values["powersgd_bytes"], r.Values["powersgd_fp16_bytes"], r.Values["powersgd_compute_ms"]
				if r.Step <= 2 && (b != 0 || f16 != 0) || r.Step > 2 && (b <= 0 || f16 <= 4*b || ms <= 0 || math.IsNaN(ms)) {
					t.Fatalf("step %d: powersgd_bytes %v, powersgd_fp16_bytes %v, powersgd_compute_ms %v", r.Step, b, f16, ms)
				}
			}
		})
	}
}

// Resumed on another number of ranks, the error feedback is dropped (each
// rank's own) and Q kept, in one line.
func TestPowerSGDResumeOtherRanks(t *testing.T) {
	defer cpu.SetThreads(cpu.SetThreads(1))
	onCPU := func(int) func(string) (kernels.Backend, string, error) { return openDefault }
	dir := t.TempDir()
	args := append(append([]string{}, psgdArgs...), "--checkpoint-every", "3", "--run-dir", dir)
	runRanks(t, 2, optionsFor(t, append(args, "--max-steps", "3")...), onCPU)
	out := runRanks(t, 3, optionsFor(t, append(args, "--max-steps", "4", "--resume")...), onCPU)
	want := "nmt-train: powersgd: the checkpoint's error feedback is of 2 ranks, this run has 3: the errors start from zero, Q is kept"
	if strings.Count(out, want) != 1 || strings.Contains(out, "restored from") {
		t.Fatalf("want one line %q:\n%s", want, out)
	}
}

// Ranks that disagree on PowerSGD's settings are refused, naming the
// setting.
func TestPowerSGDSettingsCompared(t *testing.T) {
	a := optionsFor(t, psgdArgs...)
	b := optionsFor(t, append(append([]string{}, psgdArgs...), "--powersgd-rank", "4")...)
	c := optionsFor(t, append(append([]string{}, psgdArgs...), "--powersgd-start-step", "7")...)
	ss := (&Trainer{o: a}).settings()
	per := func(os ...Options) []map[string]string {
		var out []map[string]string
		for _, o := range os {
			out = append(out, decodeSettings(encodeSettings((&Trainer{o: o}).settings())))
		}
		return out
	}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{b, "settings differ between ranks: --powersgd-rank is 2 on rank 0 and 4 on rank 1"},
		{c, "settings differ between ranks: --powersgd-start-step is 2 on rank 0 and 7 on rank 1"},
	} {
		if err := settingsDiffer(ss, per(a, tc.o)); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
	for _, bad := range [][]string{{"--powersgd-rank", "0"}, {"--powersgd-rank", "65"}, {"--powersgd-start-step", "-1"}, {"--overlap=false"}} {
		if err := optionsErr(append(append([]string{}, psgdArgs...), bad...)...); err == nil {
			t.Errorf("%v: accepted", bad)
		} else {
			t.Logf("%v: %v", bad, err)
		}
	}
}

// optionsErr is optionsFor's error: the flags' parse or Validate's.
func optionsErr(args ...string) error {
	app := &cli.App{Name: "x", Commands: []*cli.Command{{Name: "train", Flags: Flags(), Action: func(c *cli.Context) error {
		_, err := OptionsFromCLI(c)
		return err
	}}}}
	return app.Run(append([]string{"x", "train"}, args...))
}
