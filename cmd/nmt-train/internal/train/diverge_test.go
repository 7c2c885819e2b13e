package train

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/transformer"
)

// poisoned is the CPU backend with one optimizer update that leaves a
// value that is not finite behind: after update number at (1-based), the
// first element of the weights (what "w") or of Adam's second moment
// ("v") of the parameter updated last (the embedding) is +Inf, what an
// overflowing learning rate or a gradient beyond float32's range (g*g
// overflows in v) leaves.
type poisoned struct {
	*cpu.Backend
	perStep, at, calls int
	what               string
}

func (p *poisoned) Adam(w, g, m, v kernels.Tensor, a kernels.AdamArgs) {
	p.Backend.Adam(w, g, m, v, a)
	p.calls++
	if p.calls == p.at*p.perStep {
		x := w
		if p.what == "v" {
			x = v
		}
		x.F32[0] = float32(math.Inf(1))
	}
}

// poisonAt opens, for every rank, a poisoned CPU backend.
func poisonAt(t *testing.T, at int, what string) func(int) func(string) (kernels.Backend, string, error) {
	cfg, err := transformer.Preset("tiny", 100)
	if err != nil {
		t.Fatal(err)
	}
	m, err := transformer.New(cfg, cpu.New(), 1)
	if err != nil {
		t.Fatal(err)
	}
	n := len(m.Params) // Adam calls a step: one per parameter (dense updates)
	return func(int) func(string) (kernels.Backend, string, error) {
		return func(string) (kernels.Backend, string, error) {
			c := cpu.New()
			c.Threads = 1
			return &poisoned{Backend: c, perStep: n, at: at, what: what}, "cpu, poisoned at update " + what, nil
		}
	}
}

// runRanksErr trains n ranks of one job in this process, as runRanks, and
// returns each rank's error and what the job wrote on stderr (the ranks'
// error lines).
func runRanksErr(t *testing.T, n int, o Options, open func(r int) func(string) (kernels.Backend, string, error)) ([]error, string) {
	t.Helper()
	secret := make([]byte, 32)
	rand.Read(secret)
	rdv := net.JoinHostPort("127.0.0.1", testenv.FreeUDPPort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = pw
	var errOut bytes.Buffer
	copied := make(chan struct{})
	go func() { io.Copy(&errOut, pr); close(copied) }()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := rank.Identity{Rank: r, Size: n, LocalRank: r, LocalSize: n, Rendezvous: rdv, JobID: "diverge-test",
				Secret: secret, Launcher: "torchrun", ServeRendezvous: r == 0 && n > 1}
			errs[r] = run(ctx, o, io.Discard, id, open(r))
		}()
	}
	wg.Wait()
	os.Stderr = stderr
	pw.Close()
	<-copied
	pr.Close()
	return errs, errOut.String()
}

func divergeArgs(dir string, extra ...string) []string {
	return append([]string{"--preset", "tiny", "--synthetic-lines", "2000", "--max-length", "24", "--batch-tokens", "1024",
		"--learning-rate", "1", "--warmup-steps", "10", "--log-every", "1", "--eval-sentences", "0", "--eval-every", "0",
		"--quiet", "--threads", "1", "--precision", "fp32", "--compression", "none", "--overlap=false", "--run-dir", dir}, extra...)
}

// checkNotSaved: latest names ckpt-want, and no checkpoint of a later
// step, finished or not, is in dir.
func checkNotSaved(t *testing.T, dir string, want int) {
	t.Helper()
	ck, err := checkpoint.Latest(dir)
	if err != nil || filepath.Base(ck) != checkpoint.DirName(want) {
		t.Fatalf("latest names %q (%v), want %s", ck, err, checkpoint.DirName(want))
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		// ckpt-STEP, or .ckpt-STEP.tmp* left by a write
		digits := strings.TrimPrefix(strings.TrimPrefix(e.Name(), "."), "ckpt-")
		if digits == strings.TrimPrefix(e.Name(), ".") {
			continue
		}
		if i := strings.IndexFunc(digits, func(c rune) bool { return c < '0' || c > '9' }); i >= 0 {
			digits = digits[:i]
		}
		if s, err := strconv.Atoi(digits); err == nil && s > want {
			t.Errorf("%s was written after the run diverged", e.Name())
		}
	}
	// what latest names loads (finite, whole): the run can be resumed from it
	st, err := checkpoint.ReadState(ck)
	if err != nil {
		t.Fatal(err)
	}
	m, err := transformer.New(st.Config, cpu.New(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.Load(ck, m, transformer.NewLazyAdam(m), ""); err != nil {
		t.Fatal(err)
	}
}

// The update that makes a weight infinite stops the run at that step, with
// one line naming it, before its checkpoint: latest keeps naming the one
// before (today's code wrote ckpt-3 with +Inf and named it latest, and
// stopped one step later at the NaN loss).
func TestDivergedUpdateNotSaved(t *testing.T) {
	dir := t.TempDir()
	errs, stderr := runRanksErr(t, 1, optionsFor(t, divergeArgs(dir, "--max-steps", "6", "--checkpoint-every", "1")...), poisonAt(t, 3, "w"))
	if !errors.Is(errs[0], ErrReported) {
		t.Fatalf("run: %v, want the divergence reported\n%s", errs[0], stderr)
	}
	want := "nmt-train: step 3: diverged: the update at learning rate "
	tail := " made the weights non-finite (tensor embedding_and_softmax/weights holds +Inf at index 0); nothing saved (latest still names ckpt-2); try a smaller --learning-rate or more --warmup-steps\n"
	if !strings.HasPrefix(stderr, want) || !strings.HasSuffix(stderr, tail) || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("stderr:\n%s\nwant one line %q...%q", stderr, want, tail)
	}
	checkNotSaved(t, dir, 2)
}

// A moment that is not finite (the weights stay finite: an infinite v
// only freezes its weight) is caught when a checkpoint is due: on 2
// ranks, both stop at that step, rank 0 alone says why, and the
// checkpoint is not written (today's code wrote ckpt-4 with v = +Inf,
// named it latest, and went on to exit 0).
func TestDivergedMomentNotSaved(t *testing.T) {
	dir := t.TempDir()
	errs, stderr := runRanksErr(t, 2, optionsFor(t, divergeArgs(dir, "--max-steps", "6", "--checkpoint-every", "2")...), poisonAt(t, 3, "v"))
	for r, err := range errs {
		if !errors.Is(err, ErrReported) {
			t.Fatalf("rank %d: %v, want the divergence reported\n%s", r, err, stderr)
		}
	}
	want := "nmt-train: step 4: diverged: ckpt-4 not written: tensor v/embedding_and_softmax/weights holds +Inf at index 0; nothing saved (latest still names ckpt-2); try a smaller --learning-rate or more --warmup-steps\n"
	if stderr != want {
		t.Fatalf("stderr:\n%s\nwant:\n%s", stderr, want)
	}
	checkNotSaved(t, dir, 2)
}

// validateArgs parses train's flags from args and returns what
// OptionsFromCLI says.
func validateArgs(args ...string) error {
	app := &cli.App{Name: "x", Writer: io.Discard, ErrWriter: io.Discard, Commands: []*cli.Command{{Name: "train", Flags: Flags(), Action: func(c *cli.Context) error {
		_, err := OptionsFromCLI(c)
		return err
	}}}}
	return app.Run(append([]string{"x", "train"}, args...))
}

// NaN passes "v <= 0": every float flag refuses a number that is not
// finite, naming the flag (today --learning-rate NaN trained on NaN).
func TestFloatFlagsFinite(t *testing.T) {
	for _, flag := range []string{"learning-rate", "alpha", "bucket-cap-mb", "first-bucket-mb", "link-gbps"} {
		for _, v := range []string{"NaN", "Inf", "-Inf", "+Inf"} {
			err := validateArgs("--"+flag, v)
			shown := map[string]string{"NaN": "NaN", "Inf": "+Inf", "-Inf": "-Inf", "+Inf": "+Inf"}[v]
			if want := "--" + flag + " " + shown + ": must be a finite number"; err == nil || err.Error() != want {
				t.Errorf("--%s %s: %v, want %q", flag, v, err, want)
			}
		}
	}
	if err := validateArgs("--link-gbps", "-1"); err == nil || !strings.Contains(err.Error(), "--link-gbps -1: must not be negative") {
		t.Errorf("--link-gbps -1: %v", err)
	}
	o := optionsFor(t)
	o.Adam = &AdamConfig{Beta1: 0.9, Beta2: math.NaN(), Eps: 1e-9}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "beta2 NaN") {
		t.Errorf("beta2 NaN: %v", err)
	}
	if err := validateArgs("--learning-rate", "0.5", "--alpha", "0", "--link-gbps", "0"); err != nil {
		t.Errorf("finite values refused: %v", err)
	}
}

// A --run-dir that is a file, or below one, says so in one line.
func TestRunDirIsFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "x")
	if err := os.WriteFile(file, []byte("not a run\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cpuOnly := func(int) func(string) (kernels.Backend, string, error) {
		return func(string) (kernels.Backend, string, error) { return cpu.New(), "cpu", nil }
	}
	for _, c := range []struct{ dir, want string }{
		{file, "--run-dir " + file + ": is a file, not a directory"},
		{filepath.Join(file, "y"), "--run-dir " + filepath.Join(file, "y") + ": " + file + " is a file, not a directory"},
	} {
		for _, resume := range []string{"--resume=false", "--resume"} {
			errs, stderr := runRanksErr(t, 1, optionsFor(t, divergeArgs(c.dir, "--max-steps", "1", resume)...), cpuOnly)
			if want := "nmt-train: " + c.want + "\n"; !errors.Is(errs[0], ErrReported) || stderr != want {
				t.Errorf("%s %s: %v, stderr %q, want %q", c.dir, resume, errs[0], stderr, want)
			}
		}
	}
}
