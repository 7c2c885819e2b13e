package cuda

import (
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// TestIndexOpsMatchKernels: the GR_OP_* codes of kernels.cu are the
// indexOps of bounds.go, in order.
func TestIndexOpsMatchKernels(t *testing.T) {
	src, err := os.ReadFile("kernels.cu")
	if err != nil {
		t.Fatal(err)
	}
	ms := regexp.MustCompile(`(?m)^#define\s+GR_OP_(\w+)\s+(\d+)\s*$`).FindAllSubmatch(src, -1)
	if len(ms) != len(indexOps) {
		t.Fatalf("kernels.cu defines %d GR_OP_* codes, bounds.go names %d ops", len(ms), len(indexOps))
	}
	for _, m := range ms {
		code, _ := strconv.Atoi(string(m[2]))
		name := strings.ToLower(string(m[1]))
		if code < 1 || code > len(indexOps) || indexOps[code-1].op != name {
			t.Errorf("kernels.cu: GR_OP_%s is %d; bounds.go's op %d is not %q", m[1], code, code, name)
		}
	}
}

// indexPanic runs fn and returns the *IndexError it panicked with (nil if
// none); any other panic fails the test.
func indexPanic(t *testing.T, fn func()) (ie *IndexError) {
	t.Helper()
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		err, ok := r.(error)
		if !ok || !errors.As(err, &ie) {
			t.Fatalf("panic %v (%T), want an *IndexError", r, r)
		}
		if f := Failure(r); f.Error() != "GPU: "+err.Error() {
			t.Errorf("Failure: %v", f)
		}
	}()
	fn()
	return nil
}

// Every op that reads indices from data reports one out of range in one
// line at the next sync, leaves the memory outside its tensors alone, and
// the backend goes on working; with good indices nothing is reported.
func TestIndexChecks(t *testing.T) {
	be := backend(t)
	up := func(dims []int, v []float32) kernels.Tensor {
		x := be.Alloc(dtype.Float32, dims...)
		be.Upload(x, v)
		return x
	}
	upI := func(v []int32) kernels.Tensor {
		x := be.Alloc(dtype.Int32, len(v))
		be.UploadI32(x, v)
		return x
	}
	seq := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%7) - 2.5
		}
		return v
	}
	down := func(x kernels.Tensor) []float32 {
		h := make([]float32, x.Len())
		be.Download(h, x)
		return h
	}
	const vocab, d = 8, 5
	for _, c := range []struct {
		name, want string
		// run queues the op with ids (bad at one place) and returns a
		// check of the memory after it, or reads its result itself
		// (CrossEntropy).
		run func(ids []int32) func(t *testing.T)
		ids []int32
	}{
		{"Embedding", "cuda: embedding: id 40000 outside the vocabulary of 8 (row 3)", func(ids []int32) func(*testing.T) {
			out := be.Alloc(dtype.Float32, len(ids), d)
			be.Embedding(out, up([]int{vocab, d}, seq(vocab*d)), upI(ids), 1, 0)
			return func(t *testing.T) {
				if h := down(out); h[3*d] != 0 || h[3*d+d-1] != 0 || h[d] == 0 {
					t.Errorf("out after a bad id: %v", h)
				}
			}
		}, []int32{1, 2, 3, 40000, 7}},
		{"Embedding/bf16", "cuda: embedding: id -2 outside the vocabulary of 8 (row 0)", func(ids []int32) func(*testing.T) {
			be.Embedding(be.Alloc(dtype.BFloat16, len(ids), d), up([]int{vocab, d}, seq(vocab*d)), upI(ids), 1, 0)
			return nil
		}, []int32{-2, 2}},
		{"EmbeddingBackward", "cuda: embedding_bwd: id 40000 outside the vocabulary of 8 (row 17)", func(ids []int32) func(*testing.T) {
			dt := be.Alloc(dtype.Float32, vocab, d)
			be.EmbeddingBackward(dt, up([]int{len(ids), d}, seq(len(ids)*d)), upI(ids), 1, 0)
			return func(t *testing.T) {
				if h := down(dt); h[d] == 0 {
					t.Errorf("the good ids' rows were not updated: %v", h)
				}
			}
		}, []int32{1, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 40000, 3}},
		{"EmbeddingBackward/f16", "cuda: embedding_bwd: id 8 outside the vocabulary of 8 (row 1)", func(ids []int32) func(*testing.T) {
			dout := be.Alloc(dtype.Float16, len(ids), d)
			be.EmbeddingBackward(be.Alloc(dtype.Float32, vocab, d), dout, upI(ids), 1, 0)
			return nil
		}, []int32{7, 8}},
		{"CrossEntropy", "cuda: xent: target 9 outside the vocabulary of 8 (row 2)", func(ids []int32) func(*testing.T) {
			logits := up([]int{len(ids), vocab}, seq(len(ids)*vocab))
			dl := be.Alloc(dtype.Float32, len(ids), vocab)
			be.CrossEntropy(dl, logits, upI(ids), 0.1, 0, 1) // reads the loss back: panics here
			return nil
		}, []int32{1, 2, 9, 3}},
		{"AdamRows", "cuda: adam_rows: row 40000 outside the parameter's 8 rows (rows[1])", func(ids []int32) func(*testing.T) {
			p := up([]int{vocab, d}, seq(vocab*d))
			g, m, v := up([]int{vocab, d}, seq(vocab*d)), be.Alloc(dtype.Float32, vocab, d), be.Alloc(dtype.Float32, vocab, d)
			be.AdamRows(p, g, m, v, upI(ids), kernels.AdamArgs{LR: 0.1, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8})
			return func(t *testing.T) {
				h, want := down(p), seq(vocab*d)
				if h[2*d] == want[2*d] || h[0] != want[0] {
					t.Errorf("p after AdamRows of rows %v: %v", ids, h)
				}
			}
		}, []int32{2, 40000, 5}},
		{"GatherRows", "cuda: gather_rows: index 4 outside the source's 4 rows (row 1 of the destination)", func(ids []int32) func(*testing.T) {
			dst := up([]int{3, 3}, []float32{9, 9, 9, 9, 9, 9, 9, 9, 9})
			be.GatherRows(dst, up([]int{4, 3}, seq(12)), upI(ids), 3)
			return func(t *testing.T) {
				if h := down(dst); h[3] != 9 || h[0] != seq(12)[0] || h[6] != seq(12)[3] {
					t.Errorf("dst after GatherRows of rows %v: %v", ids, h)
				}
			}
		}, []int32{0, 4, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var check func(*testing.T)
			ie := indexPanic(t, func() {
				check = c.run(c.ids)
				be.Sync()
			})
			if ie == nil || ie.Error() != c.want {
				t.Fatalf("got %v, want the panic %q", ie, c.want)
			}
			if again := indexPanic(t, be.Sync); again != nil {
				t.Errorf("a second sync reported it again: %v", again)
			}
			if check != nil {
				check(t)
			}
			// The same op with every index good: nothing to report.
			good := append([]int32(nil), c.ids...)
			for i := range good {
				good[i] = min(max(good[i], 1), 3)
			}
			if ie := indexPanic(t, func() { c.run(good); be.Sync() }); ie != nil {
				t.Errorf("good indices %v: %v", good, ie)
			}
		})
	}
}

// A sync after no index-checking kernel copies nothing more than before;
// after one, the record rides on a scalar result's copy or costs one copy
// of 16 bytes. Counted by the profiler.
func TestIndexRecordCost(t *testing.T) {
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	b, err := Open(0, profiled())
	if err != nil {
		t.Fatal(err)
	}
	table, out, ids := b.Alloc(dtype.Float32, 4, 2), b.Alloc(dtype.Float32, 3, 2), b.Alloc(dtype.Int32, 3)
	logits, targets := b.Alloc(dtype.Float32, 3, 4), b.Alloc(dtype.Int32, 3)
	b.TakeProfile()
	copies := func() int {
		for _, o := range b.TakeProfile() {
			if o.Op == opDeviceToHost {
				return o.Calls
			}
		}
		return 0
	}
	b.Sync()
	if n := copies(); n != 0 {
		t.Errorf("a sync after no kernel: %d copies to the host", n)
	}
	b.Scale(table, 2)
	b.Sync()
	if n := copies(); n != 0 {
		t.Errorf("a sync after a kernel that reads no indices: %d copies to the host", n)
	}
	b.Embedding(out, table, ids, 1, -1)
	b.CrossEntropy(kernels.Tensor{}, logits, targets, 0, -1, 1)
	if n := copies(); n != 1 {
		t.Errorf("Embedding and CrossEntropy: %d copies to the host, want 1 (the loss and the record together)", n)
	}
	b.Embedding(out, table, ids, 1, -1)
	b.Sync()
	b.Sync()
	if n := copies(); n != 1 {
		t.Errorf("Embedding and two syncs: %d copies to the host, want 1 (the record, once)", n)
	}
}
