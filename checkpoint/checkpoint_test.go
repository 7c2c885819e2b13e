package checkpoint

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/transformer"
)

// microConfig and microBatch are transformer's test model and batch
// (transformer/model_test.go): a model of a few hundred weights, dropout on.
func microConfig() transformer.Config {
	return transformer.Config{Preset: "micro", Vocab: 13, DModel: 8, Heads: 2, FFN: 12, EncLayers: 2, DecLayers: 2,
		AttnDropout: 0.2, ReLUDropout: 0.2, PostDropout: 0.2, LabelSmoothing: 0.1, LNEps: 1e-6}
}

func microBatch() *transformer.Batch {
	return &transformer.Batch{B: 3, S: 5, T: 4,
		Src: []int32{4, 5, 6, 7, 1, 8, 9, 1, 0, 0, 10, 11, 12, 4, 1},
		Tgt: []int32{5, 6, 7, 1, 9, 1, 0, 0, 12, 11, 4, 1}}
}

func microTrain(t *testing.T, m *transformer.Model, opt *transformer.Adam, b *transformer.Batch, from, to int) []float64 {
	t.Helper()
	lr := transformer.TransformerPolicy{LearningRate: 2, DModel: m.Cfg.DModel, Warmup: 4}
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
	m, _ := transformer.New(cfg, cpu.New(), 21)
	opt := transformer.NewLazyAdam(m)
	microTrain(t, m, opt, b, 0, 3)
	path, err := Save(dir, "", 3, m, opt, "vocab-abc", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := microTrain(t, m, opt, b, 3, 6)
	wantW := append([]float32(nil), m.Weights.F32...)

	latest, err := Latest(dir)
	if err != nil || latest != path {
		t.Fatalf("latest = %q, %v; want %q", latest, err, path)
	}
	m2, _ := transformer.New(cfg, cpu.New(), 99) // other initial weights and seed
	opt2 := transformer.NewAdam(m2, 0.5, 0.5, 1)
	st, err := Load(latest, m2, opt2, "vocab-abc")
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
	m, _ := transformer.New(cfg, cpu.New(), 1)
	opt := transformer.NewLazyAdam(m)
	path, err := Save(dir, "", 10, m, opt, "v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	// vocabulary mismatch
	_, err = Load(path, m, opt, "v2")
	if err == nil || !errors.Is(err, transformer.ErrMismatch) || !strings.Contains(err.Error(), "vocabulary") || !strings.Contains(err.Error(), "state.json") {
		t.Fatalf("vocabulary mismatch: %v", err)
	}
	// wrong preset / shape
	other := cfg
	other.Preset, other.DModel, other.FFN = "micro2", 12, 24
	m2, _ := transformer.New(other, cpu.New(), 1)
	_, err = Load(path, m2, nil, "v1")
	if err == nil || !errors.Is(err, transformer.ErrMismatch) || !strings.Contains(err.Error(), "preset") {
		t.Fatalf("wrong preset: %v", err)
	}
	// same preset name, other vocabulary size
	other = cfg
	other.Vocab = 14
	m3, _ := transformer.New(other, cpu.New(), 1)
	if _, err = Load(path, m3, nil, ""); err == nil || !errors.Is(err, transformer.ErrMismatch) {
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
	_, err = Load(path, m, opt, "v1")
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
	if _, err = Load(path, m, opt, "v1"); err == nil || !strings.Contains(err.Error(), mp) {
		t.Fatalf("header-truncated file: %v", err)
	}
}

// A checkpoint of another configuration is refused with the state.json
// line of the documentation, even where the shapes agree (heads, preset)
// and the model is not touched.
func TestCheckpointConfigMismatch(t *testing.T) {
	dir := t.TempDir()
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	path, err := Save(dir, "", 1, m, transformer.NewLazyAdam(m), "v", nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*transformer.Config){
		"heads":          func(c *transformer.Config) { c.Heads = 4 },
		"preset":         func(c *transformer.Config) { c.Preset = "micro-b" },
		"d_model":        func(c *transformer.Config) { c.DModel = 12 },
		"ffn":            func(c *transformer.Config) { c.FFN = 16 },
		"encoder layers": func(c *transformer.Config) { c.EncLayers = 3 },
		"decoder layers": func(c *transformer.Config) { c.DecLayers = 1 },
	} {
		cfg := microConfig()
		edit(&cfg)
		m2, err := transformer.New(cfg, cpu.New(), 2)
		if err != nil {
			t.Fatal(err)
		}
		opt2 := transformer.NewLazyAdam(m2)
		before := append([]float32(nil), m2.Weights.F32...)
		_, err = Load(path, m2, opt2, "v")
		want := "state.json: checkpoint does not match: written for " + describe(microConfig()) + ", this model is " + describe(cfg)
		if !errors.Is(err, transformer.ErrMismatch) || !strings.Contains(err.Error(), want) {
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
func rewriteTensors(t *testing.T, ckpt, file string, m *transformer.Model, opt *transformer.Adam) {
	t.Helper()
	path := filepath.Join(ckpt, file)
	old, err := transformer.ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	var ts []transformer.STensor
	if file == modelFile {
		for _, p := range m.Params {
			ts = append(ts, transformer.STensor{Name: p.Name, Shape: p.Shape, Data: m.Weights.F32[p.Offset : p.Offset+p.Len]})
		}
	} else {
		for _, x := range []struct {
			prefix string
			data   []float32
		}{{"m/", opt.M.F32}, {"v/", opt.V.F32}} {
			for _, p := range m.Params {
				ts = append(ts, transformer.STensor{Name: x.prefix + p.Name, Shape: p.Shape, Data: x.data[p.Offset : p.Offset+p.Len]})
			}
		}
	}
	sum, err := transformer.WriteSafetensors(path, ts, old.Metadata)
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
			m, _ := transformer.New(microConfig(), cpu.New(), 1)
			opt := transformer.NewLazyAdam(m)
			p := m.Params[2]
			path, err := Save(t.TempDir(), "r", 4, m, opt, "v", nil)
			if err != nil {
				t.Fatal(err)
			}
			// Save refuses to write a value that is not
			// finite: the file is rewritten with one (and SHA256SUMS with
			// its checksum), as a checkpoint written elsewhere could hold
			map[string][]float32{"": m.Weights.F32, "m/": opt.M.F32, "v/": opt.V.F32}[c.prefix][p.Offset+1] = c.v
			rewriteTensors(t, path, c.file, m, opt)
			m2, _ := transformer.New(microConfig(), cpu.New(), 2)
			opt2 := transformer.NewAdam(m2, 0.5, 0.5, 1)
			opt2.M.F32[0], opt2.V.F32[0], opt2.T = 0.25, 0.5, 1
			w, mm, vv := append([]float32(nil), m2.Weights.F32...), append([]float32(nil), opt2.M.F32...), append([]float32(nil), opt2.V.F32...)
			_, err = Load(path, m2, opt2, "v")
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

// A checkpoint with a weight or an Adam moment that is not finite (a
// diverged run) is never written: Save refuses it before
// touching the directory, naming the tensor, and latest keeps naming the
// last good checkpoint (today's code wrote it, and latest named it).
func TestSaveRefusesNonFinite(t *testing.T) {
	for _, c := range []struct {
		what   string
		poison func(m *transformer.Model, opt *transformer.Adam)
		tensor string
	}{
		{"weight +Inf", func(m *transformer.Model, _ *transformer.Adam) {
			m.Weights.F32[m.Params[1].Offset+2] = float32(math.Inf(1))
		}, ""},
		{"first moment NaN", func(m *transformer.Model, opt *transformer.Adam) { opt.M.F32[m.Params[0].Offset] = float32(math.NaN()) }, "m/"},
		{"second moment -Inf", func(m *transformer.Model, opt *transformer.Adam) {
			opt.V.F32[m.Params[1].Offset+2] = float32(math.Inf(-1))
		}, "v/"},
	} {
		t.Run(c.what, func(t *testing.T) {
			dir := t.TempDir()
			m, _ := transformer.New(microConfig(), cpu.New(), 1)
			opt := transformer.NewLazyAdam(m)
			if _, err := Save(dir, "r", 1, m, opt, "v1", nil); err != nil {
				t.Fatal(err)
			}
			c.poison(m, opt)
			_, err := Save(dir, "r", 2, m, opt, "v1", nil)
			var nf *transformer.NonFiniteError
			if !errors.As(err, &nf) {
				t.Fatalf("save of a %s: %v, want a *NonFiniteError", c.what, err)
			}
			p, idx := m.Params[1].Name, 2
			if c.tensor == "m/" {
				p, idx = m.Params[0].Name, 0
			}
			if nf.Tensor != c.tensor+p || nf.Index != idx || !strings.Contains(err.Error(), "ckpt-2: not written: tensor "+c.tensor+p) {
				t.Fatalf("error %q names tensor %q index %d, want %s%s index %d", err, nf.Tensor, nf.Index, c.tensor, p, idx)
			}
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if strings.Contains(e.Name(), "ckpt-2") {
					t.Errorf("%s written", e.Name())
				}
			}
			if ck, err := Latest(dir); err != nil || filepath.Base(ck) != "ckpt-1" {
				t.Fatalf("latest names %q (%v), want ckpt-1", ck, err)
			}
		})
	}
}

// A trainer's extra file (PowerSGD's state) is written into the
// checkpoint, listed in SHA256SUMS and read back checked: a changed byte
// is refused naming the file; a checkpoint without it says not-exist; an
// extra file may not take a name of the checkpoint's own.
func TestCheckpointExtraFile(t *testing.T) {
	dir := t.TempDir()
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	opt := transformer.NewLazyAdam(m)
	extra := File{Name: "powersgd.safetensors", Meta: map[string]string{"ranks": "2"},
		Tensors: []transformer.STensor{{Name: "error/rank0", Shape: []int{3}, Data: []float32{1, 2, 3}}, {Name: "q", Shape: []int{2}, Data: []float32{-1, 0.5}}}}
	ck, err := Save(dir, "r", 1, m, opt, "v", nil, extra)
	if err != nil {
		t.Fatal(err)
	}
	sums, _ := os.ReadFile(filepath.Join(ck, sumsFile))
	if !strings.Contains(string(sums), "  powersgd.safetensors\n") {
		t.Fatalf("SHA256SUMS does not list the extra file:\n%s", sums)
	}
	f, err := ReadFile(ck, "powersgd.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	q := make([]float32, 2)
	if err := f.Read("q", []int{2}, q); err != nil || q[0] != -1 || q[1] != 0.5 || f.Metadata["ranks"] != "2" {
		t.Fatalf("read back %v %v %v", q, f.Metadata, err)
	}
	if _, err := Load(ck, m, opt, "v"); err != nil {
		t.Fatalf("the checkpoint with an extra file does not load: %v", err)
	}
	// a flipped byte in its data
	p := filepath.Join(ck, "powersgd.safetensors")
	b, _ := os.ReadFile(p)
	b[len(b)-1] ^= 1
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(ck, "powersgd.safetensors"); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("changed file: %v", err)
	}
	if _, err := ReadFile(ck, "absent.safetensors"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("absent file: %v", err)
	}
	for _, name := range []string{"model.safetensors", "state.json", "a/b", ".hidden", ""} {
		if _, err := Save(dir, "r", 2, m, opt, "v", nil, File{Name: name}); err == nil {
			t.Errorf("extra file %q accepted", name)
		}
	}
}

// TestCheckpointModes: a checkpoint's directory and files get the modes
// os.Mkdir and os.Create give under the umask (0755 and 0644 under 022),
// as metrics.jsonl and the event files do, not the 0700/0600 of temporary
// files, so that another user can read a run directory the umask opens.
func TestCheckpointModes(t *testing.T) {
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	for _, c := range []struct {
		umask           int
		dirMode, fileMd os.FileMode
	}{{0o022, 0o755, 0o644}, {0o077, 0o700, 0o600}} {
		dir := t.TempDir()
		old := syscall.Umask(c.umask)
		path, err := Save(dir, "r", 1, m, transformer.NewLazyAdam(m), "v", nil)
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

// TestSafetensorsPython loads a checkpoint with Python's safetensors
// package when it is installed (skipped otherwise).
func TestSafetensorsPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil || exec.Command(py, "-c", "import safetensors.numpy").Run() != nil {
		t.Skip("python3 with the safetensors package not available")
	}
	dir := t.TempDir()
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	path, err := Save(dir, "", 1, m, transformer.NewLazyAdam(m), "h", nil)
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
