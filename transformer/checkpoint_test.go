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
	path, err := SaveCheckpoint(dir, 3, m, opt, "vocab-abc", nil)
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
	path, err := SaveCheckpoint(dir, 10, m, opt, "v1", nil)
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
	path, err := SaveCheckpoint(dir, 1, m, NewLazyAdam(m), "h", nil)
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
