package cuda

import (
	_ "embed"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/transformer"
)

// ptxMaxntid maps each .entry of a PTX module to its .maxntid (threads, the
// product of its dimensions; 0 when it has none).
func ptxMaxntid(ptx string) map[string]int {
	entry := regexp.MustCompile(`(?s)\.entry\s+(\w+)\s*\(.*?\)([^{]*)\{`)
	maxntid := regexp.MustCompile(`\.maxntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?`)
	out := map[string]int{}
	for _, m := range entry.FindAllStringSubmatch(ptx, -1) {
		n := 0
		if d := maxntid.FindStringSubmatch(m[2]); d != nil {
			n = 1
			for _, s := range d[1:] {
				if s != "" {
					v, _ := strconv.Atoi(s)
					n *= v
				}
			}
		}
		out[m[1]] = n
	}
	return out
}

// TestLaunchBoundsMatchPTX: the launch table (blocks.go) names a shape for
// every kernel; each kernel's .maxntid in both PTX files (its
// __launch_bounds__) is its shape's largest block; kernels.cu's
// GR_*_THREADS are the Go constants; the launch functions stay within them;
// and a launch above a kernel's bound panics before the driver sees it.
func TestLaunchBoundsMatchPTX(t *testing.T) {
	for name, ptx := range map[string][]byte{"sm70": ptxSM70, "sm80": ptxSM80} {
		got := ptxMaxntid(string(ptx))
		for _, k := range allKernels() {
			s := shapeOf(k.name)
			if s == 0 {
				t.Errorf("%s: no launch shape in opShapes (blocks.go)", k.name)
				continue
			}
			if n, ok := got[k.name]; !ok {
				t.Errorf("%s: %s is not in the PTX", name, k.name)
			} else if n != s.maxThreads() {
				t.Errorf("%s: %s has .maxntid %d (its __launch_bounds__; 0: none), its %s shape's largest block is %d",
					name, k.name, n, s, s.maxThreads())
			}
		}
	}
	src, err := os.ReadFile("kernels.cu")
	if err != nil {
		t.Fatal(err)
	}
	for def, want := range map[string]int{"GR_FLAT_THREADS": flatThreads, "GR_ROW_THREADS": rowMaxThreads,
		"GR_COL_THREADS": colThreads, "GR_MAT_THREADS": matMaxThreads} {
		m := regexp.MustCompile(`(?m)^#define\s+` + def + `\s+(\d+)\s*$`).FindSubmatch(src)
		if m == nil {
			t.Errorf("kernels.cu defines no %s", def)
		} else if v, _ := strconv.Atoi(string(m[1])); v != want {
			t.Errorf("kernels.cu: %s is %d, blocks.go's %d", def, v, want)
		}
	}
	most := 0
	for cols := 0; cols < 1<<16; cols = cols*2 + 1 {
		for _, c := range []int{cols, cols + 1} {
			n := rowThreads(c)
			if n%32 != 0 || n < 32 || n > rowMaxThreads {
				t.Errorf("rowThreads(%d) = %d", c, n)
			}
			most = max(most, n)
		}
	}
	if most != rowMaxThreads {
		t.Errorf("rowThreads reaches %d, not rowMaxThreads %d (the bound would be loose)", most, rowMaxThreads)
	}
	for _, rows := range []int{1, 33, 1000, 1024, 1 << 20} {
		if n := orthoThreads(rows); n > matMaxThreads {
			t.Errorf("orthoThreads(%d) = %d > %d", rows, n, matMaxThreads)
		}
	}
	if colThreads != 32*32 || flatThreads%32 != 0 {
		t.Errorf("colThreads %d, flatThreads %d", colThreads, flatThreads)
	}
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(r.(string), "its bound") {
			t.Errorf("a row kernel launched with 1024 threads: %v, want a panic naming its bound", r)
		}
	}()
	checkBlock(kLayerNorm.of(dtype.Float32), 1024)
}

// TestHotKernelsAreATrainingStep: hot_kernels.txt (the kernels whose
// spills make ptx-check fail) is exactly the set of kernels that training
// steps launch: the Transformer's forward and backward in fp32, fp16 and
// bf16 with LazyAdam, the trainer's loss scaling and overflow checks, the
// gradient buckets' casts to and from fp16 and bf16, and PowerSGD's
// orthonormalization and error feedback. Read from a profiling backend,
// which names every kernel it queues.
func TestHotKernelsAreATrainingStep(t *testing.T) {
	backend(t) // the driver loaded
	b, err := Open(testIndex(), profiled())
	if err != nil {
		t.Fatal(err)
	}
	cfg := transformer.Config{Preset: "test", Vocab: 37, DModel: 32, Heads: 4, FFN: 64, EncLayers: 1, DecLayers: 1,
		AttnDropout: 0.1, ReLUDropout: 0.1, PostDropout: 0.1, LabelSmoothing: 0.1, LNEps: 1e-6}
	r := rand.New(rand.NewPCG(5, 6))
	batch := func(n, minLen int) *transformer.Batch {
		var src, tgt [][]int32
		for i := 0; i < n; i++ {
			s, g := make([]int32, minLen+r.IntN(3)), make([]int32, minLen+r.IntN(3))
			for j := range s {
				s[j] = int32(4 + r.IntN(cfg.Vocab-4))
			}
			for j := range g {
				g[j] = int32(4 + r.IntN(cfg.Vocab-4))
			}
			g[len(g)-1] = transformer.EOS
			src, tgt = append(src, s), append(tgt, g)
		}
		b, err := transformer.PadBatch(src, tgt)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// fp32: 32 sentences of 17 to 19 tokens, over 512 rows, so that the
	// column reductions run in splits (gr_col_sum_f32), as on real batches
	big, small := batch(32, 17), batch(4, 5)
	for _, acts := range []dtype.DType{dtype.Float32, dtype.Float16, dtype.BFloat16} {
		m, err := transformer.New(cfg, b, 7)
		if err != nil {
			t.Fatal(err)
		}
		m.Activations = acts
		if acts == dtype.Float16 {
			m.LossScale = 1024
		}
		b.SetMatmulPrecision(acts)
		opt := transformer.NewLazyAdam(m)
		bt := small
		if acts == dtype.Float32 {
			bt = big
		}
		if _, err := m.Forward(bt, true); err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(nil); err != nil {
			t.Fatal(err)
		}
		b.Scale(m.Grads, 1/1024.0)
		b.HasInfNaN(m.Grads)
		for _, wire := range []dtype.DType{dtype.Float32, dtype.Float16, dtype.BFloat16} {
			pin := b.PinnedHost(m.Grads.Len() * wire.Size())
			if err := b.CopyOutAsync(pin, m.Grads, wire).Wait(); err != nil {
				t.Fatal(err)
			}
			b.CopyIn(m.Grads, pin, wire)
		}
		if err := opt.Step(m, 1e-3, nil); err != nil {
			t.Fatal(err)
		}
		b.HasInfNaN(m.Weights)
	}
	b.SetMatmulPrecision(dtype.Float32)
	// PowerSGD (fusion): P = M Q, orthonormalized; error feedback by axpy
	q, e := b.Alloc(dtype.Float32, 48, 4), b.Alloc(dtype.Float32, 48, 4)
	b.Orthonormalize(q, 1e-8)
	b.Axpy(e, -1, q)
	b.Sync()
	ran := map[string]bool{}
	for _, o := range b.TakeProfile() {
		if strings.HasPrefix(o.Op, "gr_") {
			ran[o.Op] = true
		}
	}
	hot := hotKernels()
	var missing, extra []string
	for k := range ran {
		if !hot[k] {
			missing = append(missing, k)
		}
	}
	for k := range hot {
		if !ran[k] {
			extra = append(extra, k)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 {
		t.Errorf("training steps launch kernels that hot_kernels.txt does not list: %v", missing)
	}
	if len(extra) > 0 {
		t.Errorf("hot_kernels.txt lists kernels no training step launched: %v", extra)
	}
	t.Logf("%d hot kernels", len(ran))
}

// TestRegisterCheckFails: ptx.sh's register check (which make ptx-check
// runs on the committed PTX for sm_70, sm_80 and sm_90) refuses a kernel
// without .maxntid and a hot kernel that spills, naming the kernel. Needs
// the toolchain (make cuda-toolchain).
func TestRegisterCheckFails(t *testing.T) {
	if _, err := os.Stat(filepath.Join(toolchainDir(), "usr", "bin", "ptxas")); err != nil {
		t.Skipf("no ptxas in %s (make cuda-toolchain): %v", toolchainDir(), err)
	}
	ptx := string(ptxSM80)
	dir := t.TempDir()
	for _, c := range []struct {
		what, kernel, want string
		edit               func(head string) string
	}{
		{"no .maxntid", "gr_scale_f32", "gr_scale_f32 has no .maxntid",
			func(h string) string { return regexp.MustCompile(`\.maxntid[^\n]*\n`).ReplaceAllString(h, "") }},
		// .maxnreg 24 leaves the column reduction too few registers
		{"a hot kernel spills", "gr_layernorm_bwd_params_f32", "hot kernel gr_layernorm_bwd_params_f32 spills",
			func(h string) string { return h + "\n.maxnreg 24\n" }},
	} {
		// the PTX's head (.version, .target) and this kernel alone
		i := strings.Index(ptx, ".entry "+c.kernel+"(")
		if i < 0 {
			t.Fatalf("%s is not in the sm80 PTX", c.kernel)
		}
		i = strings.LastIndex(ptx[:i], "\n") + 1
		end := i + strings.Index(ptx[i:], "\n}\n") + 3
		head := ptx[:strings.Index(ptx, ".visible .entry")]
		one := ptx[i:end]
		j := strings.Index(one, ")") + 1
		k := j + strings.Index(one[j:], "{")
		f := filepath.Join(dir, strings.ReplaceAll(c.what, " ", "-")+".ptx")
		if err := os.WriteFile(f, []byte(head+one[:j]+c.edit(one[j:k])+one[k:]), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("bash", "kernels/cuda/ptx.sh", "regs", f, "sm_80", "part")
		cmd.Dir = "../.."
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: ptx.sh regs: %v, want a failure saying %q:\n%s", c.what, err, c.want, out)
		}
	}
}

// hotKernelsList is hot_kernels.txt: the kernels a training step runs.
//
//go:embed hot_kernels.txt
var hotKernelsList string

// hotKernels are the kernels a training step runs (hot_kernels.txt, one a
// line, # comments): ptx.sh fails when one of them spills registers to
// local memory, and TestHotKernelsAreATrainingStep checks the list
// against the kernels that training steps launch on the emulator.
func hotKernels() map[string]bool {
	out := map[string]bool{}
	for _, l := range strings.Split(hotKernelsList, "\n") {
		if l, _, _ = strings.Cut(l, "#"); strings.TrimSpace(l) != "" {
			out[strings.TrimSpace(l)] = true
		}
	}
	return out
}
