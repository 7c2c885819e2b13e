package transformer

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// rawSafetensors writes a safetensors file of the given header and data.
func rawSafetensors(t *testing.T, header string, data int) string {
	t.Helper()
	for len(header)%8 != 0 {
		header += " "
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(append(b, header...), make([]byte, data)...)
	path := filepath.Join(t.TempDir(), "x.safetensors")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// The reader refuses headers whose tensors are not laid out as the format
// requires (upstream refuses them too): offsets that disagree with the
// shape, two tensors on the same bytes, a gap between tensors. The file
// is the right size in each case.
func TestSafetensorsBadLayout(t *testing.T) {
	for _, c := range []struct {
		name, header, want string
		data               int
	}{
		{"offsets not the shape's size", `{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]}}`, "do not match shape", 8},
		{"overlapping tensors", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, "not contiguous", 8},
		{"gap between tensors", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}`, "not contiguous", 24},
	} {
		path := rawSafetensors(t, c.header, c.data)
		if _, err := ReadSafetensors(path); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v; want an error naming the file and %q", c.name, err, c.want)
		}
	}
	// the same tensors laid out right are read
	path := rawSafetensors(t, `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, 16)
	if _, err := ReadSafetensors(path); err != nil {
		t.Fatal(err)
	}
}

// Read refuses a shape other than the tensor's, even of the same size.
func TestSafetensorsReadShape(t *testing.T) {
	f, err := ReadSafetensors(upstream("f32-zeros-2x2.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	for _, shape := range [][]int{{4}, {1, 4}, {2, 2, 1}} {
		if err := f.Read("test", shape, make([]float32, 4)); err == nil || !strings.Contains(err.Error(), "has shape [2 2]") {
			t.Errorf("reading the [2 2] tensor as %v: %v", shape, err)
		}
	}
}

// A write that fails (the disk is full) is reported as such.
func TestSafetensorsWriteError(t *testing.T) {
	if f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0); err != nil {
		t.Skipf("no /dev/full to write to: %v", err)
	} else {
		f.Close()
	}
	_, err := WriteSafetensors("/dev/full", []STensor{{Name: "w", Shape: []int{2, 2}, Data: make([]float32, 4)}}, nil)
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "/dev/full") {
		t.Fatalf("writing to a full disk: %v; want ENOSPC naming the file", err)
	}
}
