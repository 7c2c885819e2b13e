package checkpoint

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/transformer"
)

func savedCheckpoint(t *testing.T, trainer map[string]json.RawMessage) (string, *transformer.Model, *transformer.Adam) {
	t.Helper()
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	opt := transformer.NewLazyAdam(m)
	opt.T = 25
	path, err := Save(t.TempDir(), "r", 30, m, opt, "v1", trainer)
	if err != nil {
		t.Fatal(err)
	}
	return path, m, opt
}

// flipByte changes one byte of path at offset off from the end.
func flipByte(t *testing.T, path string, fromEnd int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-fromEnd] ^= 0x01
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCheckpointChecksums(t *testing.T) {
	path, m, opt := savedCheckpoint(t, nil)
	sums, err := os.ReadFile(filepath.Join(path, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"model.safetensors", "optimizer.safetensors", "state.json"} {
		if !strings.Contains(string(sums), "  "+f+"\n") {
			t.Fatalf("SHA256SUMS lacks %s:\n%s", f, sums)
		}
	}
	if _, err := Load(path, m, opt, "v1"); err != nil {
		t.Fatalf("intact checkpoint: %v", err)
	}
	for _, f := range []string{"model.safetensors", "optimizer.safetensors", "state.json"} {
		t.Run(f, func(t *testing.T) {
			p, m, opt := savedCheckpoint(t, nil)
			// a byte of the last tensor's data (a low mantissa bit: the
			// value stays finite and the file parses), or of state.json's
			// closing lines (whitespace and brace: "}\n" → "|\n" breaks it)
			flipByte(t, filepath.Join(p, f), 5)
			before := append([]float32(nil), m.Weights.F32...)
			_, err := Load(p, m, opt, "v1")
			want := filepath.Join(filepath.Base(p), f) + ": checksum mismatch"
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("tampered %s: %v, want an error containing %q", f, err, want)
			}
			for i := range before {
				if m.Weights.F32[i] != before[i] {
					t.Fatal("a refused load changed the model")
				}
			}
		})
	}
	// a checkpoint of a version before checksums still loads
	p, m2, opt2 := savedCheckpoint(t, nil)
	if err := os.Remove(filepath.Join(p, "SHA256SUMS")); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p, m2, opt2, "v1"); err != nil {
		t.Fatalf("checkpoint without SHA256SUMS: %v", err)
	}
}

// TestCheckpointStateRanges: a state.json out of range is refused with
// one line naming the file and the field (checkpoints without SHA256SUMS,
// as older versions wrote, or edited with their checksum).
func TestCheckpointStateRanges(t *testing.T) {
	trainer := map[string]json.RawMessage{
		"data":        json.RawMessage(`{"epoch":1,"index":3,"seed":7,"size":1,"lines":100,"steps_per_epoch":10}`),
		"loss_scaler": json.RawMessage(`{"Scale":16384,"Min":1,"Max":16777216,"Factor":2,"Window":2000,"Clean":5}`),
	}
	cases := []struct{ from, to, field string }{
		{`"step": 30`, `"step": -5`, "step -5"},
		{`"optimizer_step": 25`, `"optimizer_step": -1`, "optimizer_step -1"},
		{`"optimizer_step": 25`, `"optimizer_step": 31`, "optimizer_step 31"},
		{`"Scale": 16384`, `"Scale": 0`, "loss_scaler.Scale 0"},
		{`"Scale": 16384`, `"Scale": -2`, "loss_scaler.Scale -2"},
		{`"index": 3`, `"index": -1`, "data.index -1"},
		{`"index": 3`, `"index": 11`, "data.index 11"},
		{`"epoch": 1`, `"epoch": -3`, "data.epoch -3"},
		{`"dropout_step": 0`, `"dropout_step": -4`, "dropout_step"},
		{`"optimizer": "lazyadam"`, `"optimizer": "sgd"`, "optimizer \"sgd\""},
		{`"format": 1`, `"format": 2`, "checkpoint format 2"},
		{`"optimizer": "lazyadam"`, `"optimizer": ""`, "optimizer_step 25 without an optimizer"},
		{`"beta1": 0.9`, `"beta1": 1`, "beta1 1 is outside"},
		{`"beta1": 0.9`, `"beta1": -0.1`, "beta1 -0.1 is outside"},
		{`"beta2": 0.997`, `"beta2": 1.5`, "beta2 1.5 is outside"},
		{`"epsilon": 1e-9`, `"epsilon": 0`, "epsilon 0 is not positive"},
		{`"Min": 1`, `"Min": 0`, "loss_scaler.Min 0"},
		{`"Max": 16777216`, `"Max": 0.5`, "loss_scaler.Max 0.5"},
		{`"Factor": 2`, `"Factor": 1`, "loss_scaler.Factor 1"},
		{`"Window": 2000`, `"Window": 0`, "loss_scaler.Window 0"},
		{`"Clean": 5`, `"Clean": -1`, "loss_scaler.Clean -1"},
		{`"size": 1`, `"size": 0`, "data.size 0"},
	}
	for _, c := range cases {
		t.Run(c.to, func(t *testing.T) {
			p, m, opt := savedCheckpoint(t, trainer)
			sp := filepath.Join(p, "state.json")
			b, _ := os.ReadFile(sp)
			if !strings.Contains(string(b), c.from) {
				t.Fatalf("state.json lacks %s:\n%s", c.from, b)
			}
			os.WriteFile(sp, []byte(strings.Replace(string(b), c.from, c.to, 1)), 0o644)
			// without checksums, the range check refuses it
			os.Remove(filepath.Join(p, "SHA256SUMS"))
			_, err := Load(p, m, opt, "v1")
			if err == nil || !strings.Contains(err.Error(), sp) || !strings.Contains(err.Error(), c.field) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%s: %v, want one line naming %s and %q", c.to, err, sp, c.field)
			}
			if _, err := ReadState(p); err == nil {
				t.Fatalf("ReadState accepted %s", c.to)
			}
		})
	}
	// the unmodified state passes
	p, m, opt := savedCheckpoint(t, trainer)
	if _, err := Load(p, m, opt, "v1"); err != nil {
		t.Fatal(err)
	}
}

// A SHA256SUMS that changed after it was written is not taken for a
// checkpoint without checksums: emptied, with a line that is not a
// checksum, without the line of a file, or not readable as a file, the
// load is refused naming it, and the model is not touched.
func TestCheckpointSumsTampered(t *testing.T) {
	for _, c := range []struct {
		name, want string
		edit       func(t *testing.T, sums string)
	}{
		{"emptied", "SHA256SUMS: empty", func(t *testing.T, sums string) { os.WriteFile(sums, nil, 0o644) }},
		{"a line that is not a checksum", "SHA256SUMS:4: not a", func(t *testing.T, sums string) {
			b, _ := os.ReadFile(sums)
			os.WriteFile(sums, append(b, "d41d8cd9  model.safetensors\n"...), 0o644)
		}},
		{"without model.safetensors", "model.safetensors: no checksum in SHA256SUMS", func(t *testing.T, sums string) {
			b, _ := os.ReadFile(sums)
			var keep []string
			for _, l := range strings.SplitAfter(string(b), "\n") {
				if !strings.HasSuffix(l, "  model.safetensors\n") {
					keep = append(keep, l)
				}
			}
			os.WriteFile(sums, []byte(strings.Join(keep, "")), 0o644)
		}},
		{"a directory", "SHA256SUMS", func(t *testing.T, sums string) {
			os.Remove(sums)
			os.Mkdir(sums, 0o755)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, m, opt := savedCheckpoint(t, nil)
			c.edit(t, filepath.Join(p, "SHA256SUMS"))
			before := append([]float32(nil), m.Weights.F32...)
			m.Weights.F32[0]++ // the checkpoint holds other weights than the model
			before[0]++
			_, err := Load(p, m, opt, "v1")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("SHA256SUMS %s: %v, want an error containing %q", c.name, err, c.want)
			}
			for i := range before {
				if m.Weights.F32[i] != before[i] {
					t.Fatal("a refused load changed the model")
				}
			}
		})
	}
}

// rewriteModel rewrites ckpt/model.safetensors through edit (its tensors
// in file order and metadata) and removes SHA256SUMS, as a checkpoint of a
// version before checksums: what the other checks must catch alone. The
// checkpoint is of microConfig (savedCheckpoint).
func rewriteModel(t *testing.T, ckpt string, edit func([]transformer.STensor, map[string]string) []transformer.STensor) {
	t.Helper()
	path := filepath.Join(ckpt, "model.safetensors")
	f, err := transformer.ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	params, err := transformer.ParamList(microConfig())
	if err != nil {
		t.Fatal(err)
	}
	shapes := map[string][]int{}
	for _, p := range params {
		shapes[p.Name] = p.Shape
	}
	var ts []transformer.STensor
	for _, n := range f.Names() {
		shape := shapes[n]
		size := 1
		for _, s := range shape {
			size *= s
		}
		d := make([]float32, size)
		if err := f.Read(n, shape, d); err != nil {
			t.Fatal(err)
		}
		ts = append(ts, transformer.STensor{Name: n, Shape: shape, Data: d})
	}
	if _, err := transformer.WriteSafetensors(path, edit(ts, f.Metadata), f.Metadata); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(ckpt, "SHA256SUMS")); err != nil {
		t.Fatal(err)
	}
}

// A model.safetensors that does not match state.json or the model is
// refused even without checksums: another vocabulary hash in its metadata,
// a tensor more than the model has, a tensor of another shape of the same
// size. Each error wraps transformer.ErrMismatch.
func TestCheckpointModelFileMismatch(t *testing.T) {
	for _, c := range []struct {
		name, want string
		edit       func([]transformer.STensor, map[string]string) []transformer.STensor
	}{
		{"vocabulary hash", `vocabulary hash "v2" differs from state.json's "v1"`, func(ts []transformer.STensor, meta map[string]string) []transformer.STensor {
			meta["vocab_hash"] = "v2"
			return ts
		}},
		{"extra tensor", "the model has", func(ts []transformer.STensor, meta map[string]string) []transformer.STensor {
			return append(ts, transformer.STensor{Name: "extra/weights", Shape: []int{2}, Data: []float32{1, 2}})
		}},
		{"transposed tensor", "the model needs", func(ts []transformer.STensor, meta map[string]string) []transformer.STensor {
			for i, x := range ts {
				if len(x.Shape) == 2 && x.Shape[0] != x.Shape[1] {
					ts[i].Shape = []int{x.Shape[1], x.Shape[0]}
					return ts
				}
			}
			panic("no rectangular tensor")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, m, opt := savedCheckpoint(t, nil)
			rewriteModel(t, p, c.edit)
			_, err := Load(p, m, opt, "v1")
			if err == nil || !strings.Contains(err.Error(), "model.safetensors") || !strings.Contains(err.Error(), c.want) ||
				!strings.Contains(err.Error(), transformer.ErrMismatch.Error()) || !errors.Is(err, transformer.ErrMismatch) {
				t.Fatalf("%s: %v; want a mismatch naming model.safetensors and %q", c.name, err, c.want)
			}
		})
	}
	// the rewrite alone (same tensors, same metadata) loads
	p, m, opt := savedCheckpoint(t, nil)
	rewriteModel(t, p, func(ts []transformer.STensor, _ map[string]string) []transformer.STensor { return ts })
	if _, err := Load(p, m, opt, "v1"); err != nil {
		t.Fatalf("model.safetensors rewritten unchanged: %v", err)
	}
}
