package transformer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
)

func savedCheckpoint(t *testing.T, trainer map[string]json.RawMessage) (string, *Model, *Adam) {
	t.Helper()
	m, _ := New(microConfig(), cpu.New(), 1)
	opt := NewLazyAdam(m)
	opt.T = 25
	path, err := SaveRunCheckpoint(t.TempDir(), "r", 30, m, opt, "v1", trainer)
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
	if _, err := LoadCheckpoint(path, m, opt, "v1"); err != nil {
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
			_, err := LoadCheckpoint(p, m, opt, "v1")
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
	if _, err := LoadCheckpoint(p, m2, opt2, "v1"); err != nil {
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
			_, err := LoadCheckpoint(p, m, opt, "v1")
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
	if _, err := LoadCheckpoint(p, m, opt, "v1"); err != nil {
		t.Fatal(err)
	}
}
