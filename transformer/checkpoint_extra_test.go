package transformer

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
)

// A trainer's extra file (PowerSGD's state) is written into the
// checkpoint, listed in SHA256SUMS and read back checked: a changed byte
// is refused naming the file; a checkpoint without it says not-exist; an
// extra file may not take a name of the checkpoint's own.
func TestCheckpointExtraFile(t *testing.T) {
	dir := t.TempDir()
	m, _ := New(microConfig(), cpu.New(), 1)
	opt := NewLazyAdam(m)
	extra := CheckpointFile{Name: "powersgd.safetensors", Meta: map[string]string{"ranks": "2"},
		Tensors: []STensor{{Name: "error/rank0", Shape: []int{3}, Data: []float32{1, 2, 3}}, {Name: "q", Shape: []int{2}, Data: []float32{-1, 0.5}}}}
	ck, err := SaveRunCheckpoint(dir, "r", 1, m, opt, "v", nil, extra)
	if err != nil {
		t.Fatal(err)
	}
	sums, _ := os.ReadFile(filepath.Join(ck, sumsFile))
	if !strings.Contains(string(sums), "  powersgd.safetensors\n") {
		t.Fatalf("SHA256SUMS does not list the extra file:\n%s", sums)
	}
	f, err := ReadCheckpointFile(ck, "powersgd.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	q := make([]float32, 2)
	if err := f.Read("q", []int{2}, q); err != nil || q[0] != -1 || q[1] != 0.5 || f.Metadata["ranks"] != "2" {
		t.Fatalf("read back %v %v %v", q, f.Metadata, err)
	}
	if _, err := LoadCheckpoint(ck, m, opt, "v"); err != nil {
		t.Fatalf("the checkpoint with an extra file does not load: %v", err)
	}
	// a flipped byte in its data
	p := filepath.Join(ck, "powersgd.safetensors")
	b, _ := os.ReadFile(p)
	b[len(b)-1] ^= 1
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCheckpointFile(ck, "powersgd.safetensors"); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("changed file: %v", err)
	}
	if _, err := ReadCheckpointFile(ck, "absent.safetensors"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("absent file: %v", err)
	}
	for _, name := range []string{"model.safetensors", "state.json", "a/b", ".hidden", ""} {
		if _, err := SaveRunCheckpoint(dir, "r", 2, m, opt, "v", nil, CheckpointFile{Name: name}); err == nil {
			t.Errorf("extra file %q accepted", name)
		}
	}
}
