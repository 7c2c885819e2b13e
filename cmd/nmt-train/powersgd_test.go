package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/cudaemu"
	"github.com/gorun/gorun/metrics"
)

// Ranks started with another --powersgd-rank are refused, every rank with
// the same one line naming it.
func TestPowerSGDRankDiffersBetweenRanks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	j := startJobRanks(t, 2, nil, func(r int) []string {
		a := append(append([]string{}, tinyArgs...), "--batch-tokens", "1024", "--max-steps", "3", "--run-dir", dir,
			"--compression", "powersgd")
		if r == 1 {
			a = append(a, "--powersgd-rank", "2")
		}
		return a
	})
	want := "settings differ between ranks: --powersgd-rank is 16 on rank 0 and 2 on rank 1"
	for r, err := range j.wait() {
		out := strings.TrimSpace(j.outs[r].String())
		if err == nil || !strings.Contains(out, want) || strings.Count(out, "settings differ") != 1 {
			t.Errorf("rank %d: err %v, want one line with %q, got:\n%s", r, err, want, out)
		}
	}
}

// PowerSGD's device path on the CUDA backend (the emulator): 2 ranks with
// --device cuda compress from the first step (P and Q computed,
// orthonormalised and decompressed by the CUDA backend's ops, staged
// through pinned memory) and follow the same run on the CPU backend's
// host path; the log says what was compressed. With --precision fp16 the
// loss-scaled gradients are unscaled before compression (SetScale) and
// follow it to fp16's rounding.
func TestPowerSGDCUDAEmulator(t *testing.T) {
	lib := cudaemu.ForTest(t)
	const steps = 4
	run := func(dev, prec string) (losses, string) {
		dir := t.TempDir()
		args := append(append([]string{}, tinyArgs...), "--no-dropout", "--batch-tokens", "256", "--max-steps", fmt.Sprint(steps),
			"--checkpoint-every", "0", "--eval-every", "0", "--device", dev, "--precision", prec,
			"--compression", "powersgd", "--powersgd-rank", "2", "--powersgd-start-step", "0", "--run-dir", dir)
		j := startJobEnv(t, 2, []string{"GORUN_CUDA_LIB_DIR=" + lib, "GORUN_CUDA_EMU_DEVICES=2"}, args...)
		for r, err := range j.wait() {
			if err != nil {
				t.Fatalf("%s rank %d: %v\n%s", dev, r, err, j.outs[r])
			}
		}
		if dev == "cuda" && !strings.Contains(j.outs[0].String(), "gorun CUDA emulator") {
			t.Fatalf("did not run on the emulated GPU:\n%s", j.outs[0])
		}
		recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Kind == "train" && !(r.Values["powersgd_bytes"] > 0) {
				t.Fatalf("%s step %d: powersgd_bytes %v", dev, r.Step, r.Values["powersgd_bytes"])
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "ckpt-4", "powersgd.safetensors")); err != nil {
			t.Fatalf("%s: the final checkpoint has no PowerSGD state: %v", dev, err)
		}
		return trainLosses(t, dir), j.outs[0].String()
	}
	ref, _ := run("cpu", "fp32")
	got, out := run("cuda", "fp32")
	if len(got) != steps {
		t.Fatalf("%d logged steps, want %d\n%s", len(got), steps, out)
	}
	follow(t, "powersgd on cuda against the cpu", got, ref, 1, steps, 1e-4)
	got, _ = run("cuda", "fp16")
	follow(t, "powersgd on cuda with fp16 and loss scaling against the cpu", got, ref, 1, steps, 1e-2)
}
