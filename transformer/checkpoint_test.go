package transformer

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
)

func microTrain(t *testing.T, m *Model, opt *Adam, b *Batch, from, to int) []float64 {
	t.Helper()
	lr := TransformerPolicy{LearningRate: 2, DModel: m.Cfg.DModel, Warmup: 4}
	var losses []float64
	for s := from; s < to; s++ {
		l, err := m.Forward(b, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(nil); err != nil {
			t.Fatal(err)
		}
		if err := opt.Step(m, lr.LR(s), nil); err != nil {
			t.Fatal(err)
		}
		losses = append(losses, l.Raw)
	}
	return losses
}

func TestCheckpointResumeBitExact(t *testing.T) {
	dir := t.TempDir()
	cfg := microConfig() // dropout on: the masks must resume too
	b := microBatch()
	m, _ := New(cfg, cpu.New(), 21)
	opt := NewLazyAdam(m)
	microTrain(t, m, opt, b, 0, 3)
	path, err := SaveRunCheckpoint(dir, "", 3, m, opt, "vocab-abc", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := microTrain(t, m, opt, b, 3, 6)
	wantW := append([]float32(nil), m.Weights.F32...)

	latest, err := LatestCheckpoint(dir)
	if err != nil || latest != path {
		t.Fatalf("latest = %q, %v; want %q", latest, err, path)
	}
	m2, _ := New(cfg, cpu.New(), 99) // other initial weights and seed
	opt2 := NewAdam(m2, 0.5, 0.5, 1)
	st, err := LoadCheckpoint(latest, m2, opt2, "vocab-abc")
	if err != nil {
		t.Fatal(err)
	}
	if st.Step != 3 || opt2.T != 3 || !opt2.Lazy {
		t.Fatalf("state step %d, optimizer step %d lazy %v", st.Step, opt2.T, opt2.Lazy)
	}
	got := microTrain(t, m2, opt2, b, 3, 6)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("step %d after reload: loss %v, uninterrupted %v", 3+i, got[i], want[i])
		}
	}
	for i, w := range m2.Weights.F32 {
		if w != wantW[i] {
			t.Fatalf("weights differ at %d after 3 resumed steps: %v vs %v", i, w, wantW[i])
		}
	}
}

func TestCheckpointRefusals(t *testing.T) {
	dir := t.TempDir()
	cfg := microConfig()
	m, _ := New(cfg, cpu.New(), 1)
	opt := NewLazyAdam(m)
	path, err := SaveRunCheckpoint(dir, "", 10, m, opt, "v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	// vocabulary mismatch
	_, err = LoadCheckpoint(path, m, opt, "v2")
	if err == nil || !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "vocabulary") || !strings.Contains(err.Error(), "state.json") {
		t.Fatalf("vocabulary mismatch: %v", err)
	}
	// wrong preset / shape
	other := cfg
	other.Preset, other.DModel, other.FFN = "micro2", 12, 24
	m2, _ := New(other, cpu.New(), 1)
	_, err = LoadCheckpoint(path, m2, nil, "v1")
	if err == nil || !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "preset") {
		t.Fatalf("wrong preset: %v", err)
	}
	// same preset name, other vocabulary size
	other = cfg
	other.Vocab = 14
	m3, _ := New(other, cpu.New(), 1)
	if _, err = LoadCheckpoint(path, m3, nil, ""); err == nil || !errors.Is(err, ErrMismatch) {
		t.Fatalf("other vocabulary size: %v", err)
	}
	// truncated weights
	mp := filepath.Join(path, "model.safetensors")
	fi, _ := os.Stat(mp)
	if err := os.Truncate(mp, fi.Size()-10); err != nil {
		t.Fatal(err)
	}
	before := append([]float32(nil), m.Weights.F32...)
	m.Weights.F32[0] = 42
	before[0] = 42
	_, err = LoadCheckpoint(path, m, opt, "v1")
	if err == nil || !strings.Contains(err.Error(), "truncated") || !strings.Contains(err.Error(), mp) {
		t.Fatalf("truncated file: %v", err)
	}
	for i := range before {
		if m.Weights.F32[i] != before[i] {
			t.Fatal("a refused load changed the model")
		}
	}
	if err := os.Truncate(mp, 5); err != nil {
		t.Fatal(err)
	}
	if _, err = LoadCheckpoint(path, m, opt, "v1"); err == nil || !strings.Contains(err.Error(), mp) {
		t.Fatalf("header-truncated file: %v", err)
	}
}

// TestSafetensorsPython loads a checkpoint with Python's safetensors
// package when it is installed (skipped otherwise).
func TestSafetensorsPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil || exec.Command(py, "-c", "import safetensors.numpy").Run() != nil {
		t.Skip("python3 with the safetensors package not available")
	}
	dir := t.TempDir()
	m, _ := New(microConfig(), cpu.New(), 1)
	path, err := SaveRunCheckpoint(dir, "", 1, m, NewLazyAdam(m), "h", nil)
	if err != nil {
		t.Fatal(err)
	}
	p := m.Params[3]
	script := `import sys
from safetensors.numpy import load_file
from safetensors import safe_open
t = load_file(sys.argv[1])
with safe_open(sys.argv[1], "np") as f:
    meta = f.metadata()
x = t[sys.argv[2]]
print(len(t), meta["preset"], list(x.shape), repr(float(x.reshape(-1)[5])))`
	out, err := exec.Command(py, "-c", script, filepath.Join(path, "model.safetensors"), p.Name).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	fields := strings.Fields(string(out))
	if len(fields) < 3 || fields[0] != itoa(len(m.Params)) || fields[1] != "micro" {
		t.Fatalf("python read %q", out)
	}
	want := float64(m.Weights.F32[p.Offset+5])
	if !strings.Contains(string(out), strings.TrimSpace(formatFloat(want))) {
		t.Fatalf("python read %q, want value %v", out, want)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// formatFloat prints a float32 value the way Python's repr of the
// float64 conversion does.
func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func ckptNames(t *testing.T, dir string) string {
	t.Helper()
	steps, err := CheckpointSteps(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, s := range steps {
		n = append(n, CheckpointDir(s))
	}
	return strings.Join(n, " ")
}

// Pruning keeps the newest checkpoints of its run counting back from the
// one latest names; it never removes that one, a newer one (renamed into
// place, latest not yet updated), another run's or one without a run.
func TestPruneCheckpoints(t *testing.T) {
	dir := t.TempDir()
	m, _ := New(microConfig(), cpu.New(), 1)
	opt := NewLazyAdam(m)
	save := func(run string, step int) {
		t.Helper()
		if _, err := SaveRunCheckpoint(dir, run, step, m, opt, "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	save("", 1)     // no run (an older version's)
	save("old", 2)  // another run
	save("old", 40) // another run, later steps
	for _, s := range []int{5, 10, 15, 20} {
		save("r", s)
	}
	// killed between the rename of ckpt-25 and latest: latest stays ckpt-20
	save("r", 25)
	os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-20\n"), 0o644)
	removed, err := PruneCheckpoints(dir, "r", 2)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(removed, " ") != "ckpt-10 ckpt-5" {
		t.Fatalf("removed %v", removed)
	}
	if got := ckptNames(t, dir); got != "ckpt-1 ckpt-2 ckpt-15 ckpt-20 ckpt-25 ckpt-40" {
		t.Fatalf("left %s", got)
	}
	// keep 1: only the one latest names (and what is not the run's)
	if _, err := PruneCheckpoints(dir, "r", 1); err != nil {
		t.Fatal(err)
	}
	if got := ckptNames(t, dir); got != "ckpt-1 ckpt-2 ckpt-20 ckpt-25 ckpt-40" {
		t.Fatalf("keep 1: left %s", got)
	}
	// latest names another run's checkpoint: nothing is removed
	os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-40\n"), 0o644)
	if removed, err := PruneCheckpoints(dir, "r", 1); err != nil || len(removed) != 0 {
		t.Fatalf("latest of another run: removed %v, %v", removed, err)
	}
	// no latest: an error, nothing removed
	os.Remove(filepath.Join(dir, "latest"))
	if removed, err := PruneCheckpoints(dir, "r", 1); err == nil || len(removed) != 0 {
		t.Fatalf("no latest: removed %v, %v", removed, err)
	}
	if got := ckptNames(t, dir); got != "ckpt-1 ckpt-2 ckpt-20 ckpt-25 ckpt-40" {
		t.Fatalf("left %s", got)
	}
}

// Resuming: the checkpoints after the one latest names are removed if
// they are of its run (never confirmed), and refused (nothing removed)
// if one is not.
func TestRemoveUnconfirmed(t *testing.T) {
	dir := t.TempDir()
	m, _ := New(microConfig(), cpu.New(), 1)
	opt := NewLazyAdam(m)
	for _, s := range []int{5, 10, 15} {
		if _, err := SaveRunCheckpoint(dir, "r", s, m, opt, "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-5\n"), 0o644)
	if _, err := SaveRunCheckpoint(dir, "other", 20, m, opt, "v", nil); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-5\n"), 0o644)
	st, err := ReadState(filepath.Join(dir, "ckpt-5"))
	if err != nil || st.Run != "r" {
		t.Fatalf("state %+v, %v", st, err)
	}
	if _, err := RemoveUnconfirmed(dir, st); err == nil || !strings.Contains(err.Error(), "ckpt-20") || strings.Contains(err.Error(), "ckpt-10") {
		t.Fatalf("another run's later checkpoint: %v", err)
	}
	if got := ckptNames(t, dir); got != "ckpt-5 ckpt-10 ckpt-15 ckpt-20" {
		t.Fatalf("a refusal removed something: %s", got)
	}
	os.RemoveAll(filepath.Join(dir, "ckpt-20"))
	removed, err := RemoveUnconfirmed(dir, st)
	if err != nil || strings.Join(removed, " ") != "ckpt-10 ckpt-15" {
		t.Fatalf("removed %v, %v", removed, err)
	}
	if got := ckptNames(t, dir); got != "ckpt-5" {
		t.Fatalf("left %s", got)
	}
}

// A checkpoint is not replaced by one of another run, nor when latest
// names it.
func TestSaveRunCheckpointReplaces(t *testing.T) {
	dir := t.TempDir()
	m, _ := New(microConfig(), cpu.New(), 1)
	opt := NewLazyAdam(m)
	if _, err := SaveRunCheckpoint(dir, "a", 5, m, opt, "v", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := SaveRunCheckpoint(dir, "a", 5, m, opt, "v", nil); err == nil || !strings.Contains(err.Error(), "latest names it") {
		t.Fatalf("replacing the checkpoint latest names: %v", err)
	}
	if _, err := SaveRunCheckpoint(dir, "a", 6, m, opt, "v", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := SaveRunCheckpoint(dir, "b", 5, m, opt, "v", nil); err == nil || !strings.Contains(err.Error(), "not of this run") {
		t.Fatalf("replacing another run's checkpoint: %v", err)
	}
	if _, err := SaveRunCheckpoint(dir, "a", 5, m, opt, "v", nil); err != nil {
		t.Fatalf("replacing this run's checkpoint: %v", err)
	}
	if st, err := ReadState(filepath.Join(dir, "ckpt-5")); err != nil || st.Run != "a" {
		t.Fatalf("%+v %v", st, err)
	}
}

// The lock is exclusive (two descriptors of one process conflict, as two
// processes do) and released; stale temporary files are removed, the
// checkpoints are not.
func TestLockAndStaleTemps(t *testing.T) {
	dir := t.TempDir()
	release, err := LockRunDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var inUse *RunDirInUseError
	if _, err := LockRunDir(dir); !errors.As(err, &inUse) || inUse.PID != os.Getpid() {
		t.Fatalf("second lock: %v", err)
	}
	release()
	release2, err := LockRunDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	defer release2()
	m, _ := New(microConfig(), cpu.New(), 1)
	if _, err := SaveRunCheckpoint(dir, "r", 3, m, nil, "v", nil); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, ".ckpt-4.tmp12345"), 0o755)
	os.WriteFile(filepath.Join(dir, ".ckpt-4.tmp12345", "model.safetensors"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, ".latest.tmp999"), []byte("ckpt-"), 0o644)
	removed, err := RemoveStaleTemps(dir)
	if err != nil || strings.Join(removed, " ") != ".ckpt-4.tmp12345 .latest.tmp999" {
		t.Fatalf("removed %v, %v", removed, err)
	}
	ents, _ := os.ReadDir(dir)
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if strings.Join(left, " ") != ".lock ckpt-3 latest" {
		t.Fatalf("left %v", left)
	}
}

// dirFiles reads every file of dir (not recursive): name → content.
func dirFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = string(b)
	}
	return files
}

func sameFiles(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A ckpt-STEP whose state.json does not parse is not proven to be of this
// run: SaveRunCheckpoint refuses to replace it, and leaves it as it was.
func TestSaveRunCheckpointKeepsUnreadable(t *testing.T) {
	dir := t.TempDir()
	m, _ := New(microConfig(), cpu.New(), 1)
	opt := NewLazyAdam(m)
	for _, s := range []int{5, 6} { // latest names ckpt-6
		if _, err := SaveRunCheckpoint(dir, "a", s, m, opt, "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	ck := filepath.Join(dir, "ckpt-5")
	if err := os.WriteFile(filepath.Join(ck, "state.json"), []byte(`{"format": 1, "step": 5, "ru`), 0o644); err != nil {
		t.Fatal(err)
	}
	before := dirFiles(t, ck)
	if _, err := SaveRunCheckpoint(dir, "a", 5, m, opt, "v", nil); err == nil || !strings.Contains(err.Error(), "not of this run") {
		t.Fatalf("saving over a ckpt-5 whose state.json does not parse: %v, want a refusal", err)
	}
	if !sameFiles(before, dirFiles(t, ck)) {
		t.Fatal("a refused save changed ckpt-5 (whose state.json does not parse)")
	}
	if latest, err := LatestCheckpoint(dir); err != nil || filepath.Base(latest) != "ckpt-6" {
		t.Fatalf("latest = %q, %v after a refused save; want ckpt-6", latest, err)
	}
}

// Resuming removes a later checkpoint only if its state.json proves it is
// of latest's run: one without a run while latest has none either (both of
// an older version), or one whose state.json does not parse, is refused
// and nothing is removed.
func TestRemoveUnconfirmedUnproven(t *testing.T) {
	m, _ := New(microConfig(), cpu.New(), 1)
	opt := NewLazyAdam(m)
	for _, c := range []struct {
		name, latestRun, laterRun string
		tear                      bool
	}{
		{"no run, as older versions wrote", "", "", false},
		{"later state.json torn", "r", "r", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if _, err := SaveRunCheckpoint(dir, c.latestRun, 5, m, opt, "v", nil); err != nil {
				t.Fatal(err)
			}
			if _, err := SaveRunCheckpoint(dir, c.laterRun, 10, m, opt, "v", nil); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-5\n"), 0o644)
			if c.tear {
				os.WriteFile(filepath.Join(dir, "ckpt-10", "state.json"), []byte(`{"format": 1, "st`), 0o644)
			}
			st, err := ReadState(filepath.Join(dir, "ckpt-5"))
			if err != nil {
				t.Fatal(err)
			}
			removed, err := RemoveUnconfirmed(dir, st)
			if err == nil || !strings.Contains(err.Error(), "ckpt-10") || len(removed) != 0 {
				t.Fatalf("removed %v, %v; want a refusal naming ckpt-10", removed, err)
			}
			if got := ckptNames(t, dir); got != "ckpt-5 ckpt-10" {
				t.Fatalf("a refusal removed something: left %s", got)
			}
		})
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Mkdir(to, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range dirFiles(t, from) {
		if err := os.WriteFile(filepath.Join(to, name), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Pruning removes only what it proves is an older checkpoint of its run:
// never a ckpt-N whose state.json is of another step, nothing when latest
// names a directory that is not ckpt-<its step> (a copy), and keep 0
// counts as 1.
func TestPruneCheckpointsOnlyProven(t *testing.T) {
	dir := t.TempDir()
	m, _ := New(microConfig(), cpu.New(), 1)
	opt := NewLazyAdam(m)
	for _, s := range []int{10, 15, 20, 30, 40} {
		if _, err := SaveRunCheckpoint(dir, "r", s, m, opt, "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	// ckpt-25 holds a checkpoint of step 15 (a copy under another name)
	copyDir(t, filepath.Join(dir, "ckpt-15"), filepath.Join(dir, "ckpt-25"))
	removed, err := PruneCheckpoints(dir, "r", 2)
	if err != nil || strings.Join(removed, " ") != "ckpt-20 ckpt-15 ckpt-10" {
		t.Fatalf("keep 2: removed %v, %v; want ckpt-20 ckpt-15 ckpt-10", removed, err)
	}
	if got := ckptNames(t, dir); got != "ckpt-25 ckpt-30 ckpt-40" {
		t.Fatalf("keep 2: left %s; ckpt-25 (state.json of step 15) must stay", got)
	}
	// latest names a copy of ckpt-40 under another name: not a checkpoint
	// pruning can count back from
	copyDir(t, filepath.Join(dir, "ckpt-40"), filepath.Join(dir, "final"))
	os.WriteFile(filepath.Join(dir, "latest"), []byte("final\n"), 0o644)
	if removed, err := PruneCheckpoints(dir, "r", 1); err != nil || len(removed) != 0 {
		t.Fatalf("latest names %q: removed %v, %v; want nothing removed", "final", removed, err)
	}
	if got := ckptNames(t, dir); got != "ckpt-25 ckpt-30 ckpt-40" {
		t.Fatalf("latest names final: left %s", got)
	}
	// keep 0 is keep 1: the checkpoint latest names stays
	os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-40\n"), 0o644)
	if removed, err := PruneCheckpoints(dir, "r", 0); err != nil || strings.Join(removed, " ") != "ckpt-30" {
		t.Fatalf("keep 0: removed %v, %v; want ckpt-30", removed, err)
	}
	if got := ckptNames(t, dir); got != "ckpt-25 ckpt-40" {
		t.Fatalf("keep 0: left %s", got)
	}
}

// Only directories named exactly ckpt-STEP are checkpoints: a user's
// ckpt-20.bak or ckpt-007 is neither pruned nor taken for a checkpoint
// written after latest (which would refuse the resume).
func TestCheckpointStepsNames(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"ckpt-3", "ckpt-12", "ckpt-007", "ckpt-20.bak", "ckpt-x", ".ckpt-4.tmp1"} {
		if err := os.Mkdir(filepath.Join(dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "ckpt-9"), []byte("a file"), 0o644)
	if got := ckptNames(t, dir); got != "ckpt-3 ckpt-12" {
		t.Fatalf("checkpoint steps: %s, want ckpt-3 ckpt-12", got)
	}
}

// latest names a directory of the run directory, nothing else.
func TestLatestCheckpointBadName(t *testing.T) {
	for _, name := range []string{"", "\n", "../other/ckpt-5\n", "sub/ckpt-5\n", `..\ckpt-5`} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "latest"), []byte(name), 0o644)
		if p, err := LatestCheckpoint(dir); err == nil || !strings.Contains(err.Error(), "bad checkpoint name") {
			t.Errorf("latest %q: %q, %v; want a refusal", name, p, err)
		}
	}
}

// A checkpoint of another configuration is refused with the state.json
// line of the documentation, even where the shapes agree (heads, preset)
// and the model is not touched.
func TestCheckpointConfigMismatch(t *testing.T) {
	dir := t.TempDir()
	m, _ := New(microConfig(), cpu.New(), 1)
	path, err := SaveRunCheckpoint(dir, "", 1, m, NewLazyAdam(m), "v", nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*Config){
		"heads":          func(c *Config) { c.Heads = 4 },
		"preset":         func(c *Config) { c.Preset = "micro-b" },
		"d_model":        func(c *Config) { c.DModel = 12 },
		"ffn":            func(c *Config) { c.FFN = 16 },
		"encoder layers": func(c *Config) { c.EncLayers = 3 },
		"decoder layers": func(c *Config) { c.DecLayers = 1 },
	} {
		cfg := microConfig()
		edit(&cfg)
		m2, err := New(cfg, cpu.New(), 2)
		if err != nil {
			t.Fatal(err)
		}
		opt2 := NewLazyAdam(m2)
		before := append([]float32(nil), m2.Weights.F32...)
		_, err = LoadCheckpoint(path, m2, opt2, "v")
		want := "state.json: checkpoint does not match: written for " + describe(microConfig()) + ", this model is " + describe(cfg)
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), want) {
			t.Errorf("other %s: %v; want ErrMismatch with %q", name, err, want)
		}
		for i := range before {
			if m2.Weights.F32[i] != before[i] {
				t.Fatalf("other %s: a refused load changed the model", name)
			}
		}
	}
}

// rewriteTensors writes file (model.safetensors or optimizer.safetensors)
// of the checkpoint ckpt again from m's weights or opt's moments, with its
// metadata, and its new checksum into SHA256SUMS.
func rewriteTensors(t *testing.T, ckpt, file string, m *Model, opt *Adam) {
	t.Helper()
	path := filepath.Join(ckpt, file)
	old, err := ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	var ts []STensor
	if file == modelFile {
		for _, p := range m.Params {
			ts = append(ts, STensor{Name: p.Name, Shape: p.Shape, Data: m.Weights.F32[p.Offset : p.Offset+p.Len]})
		}
	} else {
		for _, x := range []struct {
			prefix string
			data   []float32
		}{{"m/", opt.M.F32}, {"v/", opt.V.F32}} {
			for _, p := range m.Params {
				ts = append(ts, STensor{Name: x.prefix + p.Name, Shape: p.Shape, Data: x.data[p.Offset : p.Offset+p.Len]})
			}
		}
	}
	sum, err := writeSafetensors(path, ts, old.Metadata)
	if err != nil {
		t.Fatal(err)
	}
	sums, err := readSums(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	sums[file] = sum
	if err := os.WriteFile(filepath.Join(ckpt, sumsFile), formatSums(sums), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Weights or moments that are not finite are refused, naming the file and
// the tensor, and the model and optimizer are left as they were.
func TestCheckpointNotFinite(t *testing.T) {
	for _, c := range []struct {
		name, file, prefix string
		v                  float32
	}{
		{"weights", "model.safetensors", "", float32(math.NaN())},
		{"first moments", "optimizer.safetensors", "m/", float32(math.Inf(1))},
		{"second moments", "optimizer.safetensors", "v/", float32(math.Inf(-1))},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, _ := New(microConfig(), cpu.New(), 1)
			opt := NewLazyAdam(m)
			p := m.Params[2]
			path, err := SaveRunCheckpoint(t.TempDir(), "r", 4, m, opt, "v", nil)
			if err != nil {
				t.Fatal(err)
			}
			// SaveRunCheckpoint refuses to write a value that is not
			// finite: the file is rewritten with one (and SHA256SUMS with
			// its checksum), as a checkpoint written elsewhere could hold
			map[string][]float32{"": m.Weights.F32, "m/": opt.M.F32, "v/": opt.V.F32}[c.prefix][p.Offset+1] = c.v
			rewriteTensors(t, path, c.file, m, opt)
			m2, _ := New(microConfig(), cpu.New(), 2)
			opt2 := NewAdam(m2, 0.5, 0.5, 1)
			opt2.M.F32[0], opt2.V.F32[0], opt2.T = 0.25, 0.5, 1
			w, mm, vv := append([]float32(nil), m2.Weights.F32...), append([]float32(nil), opt2.M.F32...), append([]float32(nil), opt2.V.F32...)
			_, err = LoadCheckpoint(path, m2, opt2, "v")
			want := filepath.Join(path, c.file) + ": tensor " + c.prefix + p.Name + " holds " + formatFloat(float64(c.v)) + " at index 1"
			if err == nil || err.Error() != want {
				t.Fatalf("a %v in %s: %v; want %q", c.v, c.file, err, want)
			}
			for i := range w {
				if m2.Weights.F32[i] != w[i] || opt2.M.F32[i] != mm[i] || opt2.V.F32[i] != vv[i] {
					t.Fatalf("a refused load changed the model or the optimizer at %d", i)
				}
			}
			if opt2.T != 1 || opt2.Lazy || opt2.Beta1 != 0.5 {
				t.Fatalf("a refused load changed the optimizer: %+v", opt2)
			}
		})
	}
}

// TestCheckpointModes: a checkpoint's directory and files get the modes
// os.Mkdir and os.Create give under the umask (0755 and 0644 under 022),
// as metrics.jsonl and the event files do, not the 0700/0600 of temporary
// files, so that another user can read a run directory the umask opens.
func TestCheckpointModes(t *testing.T) {
	m, _ := New(microConfig(), cpu.New(), 1)
	for _, c := range []struct {
		umask           int
		dirMode, fileMd os.FileMode
	}{{0o022, 0o755, 0o644}, {0o077, 0o700, 0o600}} {
		dir := t.TempDir()
		old := syscall.Umask(c.umask)
		path, err := SaveRunCheckpoint(dir, "r", 1, m, NewLazyAdam(m), "v", nil)
		syscall.Umask(old)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != c.dirMode {
			t.Errorf("umask %#o: %s has mode %#o, want %#o", c.umask, path, fi.Mode().Perm(), c.dirMode)
		}
		files := []string{filepath.Join(dir, "latest")}
		for _, n := range []string{"model.safetensors", "optimizer.safetensors", "state.json", "SHA256SUMS"} {
			files = append(files, filepath.Join(path, n))
		}
		for _, f := range files {
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != c.fileMd {
				t.Errorf("umask %#o: %s has mode %#o, want %#o", c.umask, f, fi.Mode().Perm(), c.fileMd)
			}
		}
	}
}

// TestSaveRunCheckpointNoRunNeverReplaces: with no run name an existing
// ckpt-STEP is never replaced (it cannot be shown to be this run's), and a
// named run does not replace one saved without a name.
func TestSaveRunCheckpointNoRunNeverReplaces(t *testing.T) {
	m, _ := New(microConfig(), cpu.New(), 1)
	dir := t.TempDir()
	for _, step := range []int{1, 2} {
		if _, err := SaveRunCheckpoint(dir, "", step, m, nil, "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	before, err := os.ReadFile(filepath.Join(dir, "ckpt-1", "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"", "r"} {
		_, err := SaveRunCheckpoint(dir, run, 1, m, nil, "v", nil)
		if err == nil || !strings.Contains(err.Error(), "ckpt-1: exists and is not of this run") {
			t.Errorf("run %q over a ckpt-1 saved without a run name: %v", run, err)
		}
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "ckpt-1", "SHA256SUMS")); string(after) != string(before) {
		t.Error("ckpt-1 was rewritten")
	}
	if cur, err := LatestCheckpoint(dir); err != nil || filepath.Base(cur) != "ckpt-2" {
		t.Errorf("latest = %s, %v; want ckpt-2", cur, err)
	}
}
