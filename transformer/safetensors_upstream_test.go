package transformer

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The files under testdata/upstream are the byte strings that the
// safetensors project's own tests assert (test/interop/UPSTREAM.md names
// each source line). They check the format against its authors rather
// than against our own writer.

func upstream(name string) string { return filepath.Join("testdata", "upstream", name) }

// TestSafetensorsWriterMatchesUpstream: what safetensors.torch.save()
// writes for a 2x2 float32 zero tensor named "test", byte for byte,
// including the header padded with spaces to 8 bytes.
func TestSafetensorsWriterMatchesUpstream(t *testing.T) {
	want, err := os.ReadFile(upstream("f32-zeros-2x2.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if _, err := WriteSafetensors(path, []STensor{{Name: "test", Shape: []int{2, 2}, Data: make([]float32, 4)}}, nil); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("our file differs from safetensors' own:\n got %q\nwant %q", got, want)
	}
}

// TestSafetensorsReaderUpstreamFiles reads the files upstream must load
// and refuses the ones upstream must refuse.
func TestSafetensorsReaderUpstreamFiles(t *testing.T) {
	f, err := ReadSafetensors(upstream("f32-zeros-2x2.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	got := []float32{1, 1, 1, 1}
	if err := f.Read("test", []int{2, 2}, got); err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != 0 {
			t.Fatalf("value %d = %v, want 0", i, v)
		}
	}

	// Other dtypes are valid files: they are read and validated, and only
	// loading them into float32 is refused.
	for _, c := range []struct {
		file, tensor string
		shape        []int
		dtype        string
		meta         map[string]string
	}{
		{"i32-2x2.safetensors", "test", []int{2, 2}, "I32", nil},
		{"i32-scalar.safetensors", "test", []int{}, "I32", nil},
		{"bf16-2x2.safetensors", "test", []int{2, 2}, "BF16", nil},
		{"metadata.safetensors", "test1", []int{2, 2}, "I32", map[string]string{"framework": "pt"}},
	} {
		f, err := ReadSafetensors(upstream(c.file))
		if err != nil {
			t.Errorf("%s: %v", c.file, err)
			continue
		}
		if names := f.Names(); len(names) != 1 || names[0] != c.tensor {
			t.Errorf("%s: tensors %v, want [%s]", c.file, names, c.tensor)
		}
		if e, ok := f.entries[c.tensor]; !ok || !equalShape(e.Shape, c.shape) {
			t.Errorf("%s: shape %v, want %v", c.file, e.Shape, c.shape)
		}
		if len(f.Metadata) != len(c.meta) || f.Metadata["framework"] != c.meta["framework"] {
			t.Errorf("%s: metadata %v, want %v", c.file, f.Metadata, c.meta)
		}
		err = f.Read(c.tensor, c.shape, make([]float32, 4))
		if err == nil || !strings.Contains(err.Error(), "dtype "+c.dtype) {
			t.Errorf("%s: loading a %s tensor as float32: err %v", c.file, c.dtype, err)
		}
	}

	for file, reason := range map[string]string{
		"bad-polyglot.safetensors":           "trailing data",
		"bad-missing-2-bytes.safetensors":    "truncated",
		"bad-header-too-large.safetensors":   "truncated or not a safetensors file",
		"bad-empty.safetensors":              "truncated header",
		"bad-header-length-only.safetensors": "truncated or not a safetensors file",
	} {
		_, err := ReadSafetensors(upstream(file))
		if err == nil || !strings.Contains(err.Error(), reason) || !strings.Contains(err.Error(), file) {
			t.Errorf("%s: err %v, want one naming the file and %q", file, err, reason)
		}
	}
}
