package transformer

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
