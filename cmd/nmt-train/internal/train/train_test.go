package train

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/fusion/fusiontest"
	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/kernels/device"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/rank"
)

// optionsFor parses train's flags (defaults included) from args.
func optionsFor(t *testing.T, args ...string) Options {
	t.Helper()
	var o Options
	app := &cli.App{Name: "x", Commands: []*cli.Command{{Name: "train", Flags: Flags(), Action: func(c *cli.Context) error {
		var err error
		o, err = OptionsFromCLI(c)
		return err
	}}}}
	if err := app.Run(append([]string{"x", "train"}, args...)); err != nil {
		t.Fatal(err)
	}
	return o
}

// runRanks trains n ranks of one job in this process (one goroutine each,
// over a real mesh on loopback), each on the backend open returns, and
// returns rank 0's output.
func runRanks(t *testing.T, n int, o Options, open func(r int) func(string) (kernels.Backend, string, error)) string {
	t.Helper()
	secret := make([]byte, 32)
	rand.Read(secret)
	rdv := net.JoinHostPort("127.0.0.1", testenv.FreeUDPPort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	outs := make([]bytes.Buffer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := rank.Identity{Rank: r, Size: n, LocalRank: r, LocalSize: n, Rendezvous: rdv, JobID: "train-test",
				Secret: secret, Launcher: "torchrun", ServeRendezvous: r == 0 && n > 1}
			errs[r] = run(ctx, o, &outs[r], id, open(r))
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, outs[r].String())
		}
	}
	return outs[0].String()
}

func lossesOf(t *testing.T, dir string) map[int64]float64 {
	t.Helper()
	recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]float64{}
	for _, r := range recs {
		if r.Kind == "train" {
			out[r.Step] = r.Values["loss_raw"]
		}
	}
	return out
}

// openDefault is device.Open with the zero Settings (none read from the
// environment): the tests' --device backend.
func openDefault(spec string) (kernels.Backend, string, error) {
	return device.Open(spec, device.Settings{})
}

// The device gradient path, forced on the CPU: a CPU backend wrapped in a
// HostStaging test double (asynchronous copies completed later on another
// goroutine) makes the trainer take every path a GPU takes — the
// Bucketer's copies out and back, the plain reducer's and the initial
// broadcast's Download/Upload — and 2 ranks must train exactly as on the
// CPU backend itself (float32 on the wire, dropout off: the same numbers),
// and with fp16 on the wire close to it. Resuming from a checkpoint on the
// device path (weights and moments broadcast through Download/Upload)
// reaches the uninterrupted run's loss.
func TestDevicePathMatchesCPU(t *testing.T) {
	defer cpu.SetThreads(cpu.SetThreads(1)) // the same GEMM threads for both backends
	const steps = 6
	base := []string{"--preset", "tiny", "--synthetic-lines", "2000", "--max-length", "24", "--batch-tokens", "1024",
		"--learning-rate", "1", "--warmup-steps", "10", "--log-every", "1", "--eval-sentences", "0", "--eval-every", "0",
		"--quiet", "--threads", "1", "--no-dropout", "--bucket-cap-mb", "0.25", "--first-bucket-mb", "0.05"}
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
	checkDoubles := func(t *testing.T, overlap bool) {
		for r, d := range doubles {
			if err := d.Err(); err != nil {
				t.Fatalf("rank %d: HostStaging contract: %v", r, err)
			}
			outs, ins, pinned := d.Counts()
			t.Logf("rank %d: %d copies out, %d in, %d pinned bytes", r, outs, ins, pinned)
			if overlap && (outs == 0 || ins != outs || pinned == 0) {
				t.Fatalf("rank %d: the device path was not taken: %d copies out, %d in, %d pinned bytes", r, outs, ins, pinned)
			}
			if !overlap && outs+ins+pinned != 0 {
				t.Fatalf("rank %d: the plain reducer staged buckets", r)
			}
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		tol  float64
	}{
		{"overlap/fp32", []string{"--compression", "none"}, 0},
		{"plain/fp32", []string{"--compression", "none", "--overlap=false"}, 0},
		{"overlap/fp16", []string{"--compression", "fp16"}, 2e-3},
		{"overlap/powersgd", []string{"--compression", "powersgd", "--powersgd-rank", "2", "--powersgd-start-step", "2"}, 2e-3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"--max-steps", fmt.Sprint(steps)}, base...), tc.args...)
			ref, dev := t.TempDir(), t.TempDir()
			runRanks(t, 2, optionsFor(t, append(args, "--run-dir", ref)...), onCPU)
			out := runRanks(t, 2, optionsFor(t, append(args, "--run-dir", dev)...), staged)
			checkDoubles(t, tc.args[len(tc.args)-1] != "--overlap=false")
			want, got := lossesOf(t, ref), lossesOf(t, dev)
			if len(want) != steps || len(got) != steps {
				t.Fatalf("%d and %d logged steps, want %d\n%s", len(want), len(got), steps, out)
			}
			for s, w := range want {
				if d := math.Abs(got[s] - w); d > tc.tol*math.Max(1, math.Abs(w)) || math.IsNaN(got[s]) {
					t.Errorf("step %d: loss %.7f on the device path, %.7f on the CPU", s, got[s], w)
				}
			}
		})
	}
	t.Run("resume", func(t *testing.T) {
		args := append(append([]string{}, base...), "--compression", "none", "--checkpoint-every", "3")
		full, cut := t.TempDir(), t.TempDir()
		runRanks(t, 2, optionsFor(t, append(args, "--max-steps", fmt.Sprint(steps), "--run-dir", full)...), staged)
		runRanks(t, 2, optionsFor(t, append(args, "--max-steps", "3", "--run-dir", cut)...), staged)
		out := runRanks(t, 2, optionsFor(t, append(args, "--max-steps", fmt.Sprint(steps), "--resume", "--run-dir", cut)...), staged)
		checkDoubles(t, true)
		want, got := lossesOf(t, full)[steps], lossesOf(t, cut)[steps]
		if math.Abs(got-want) > 1e-6*math.Max(1, want) {
			t.Fatalf("resumed at step 3: loss at step %d is %.7f, uninterrupted %.7f\n%s", steps, got, want, out)
		}
	})
}
