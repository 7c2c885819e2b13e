package transformer

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// The safetensors format (https://huggingface.co/docs/safetensors): an
// 8-byte little-endian header length N, N bytes of JSON mapping each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the
// data that follows the header) plus an optional "__metadata__" map of
// strings, then the raw little-endian tensor data, tensors back to back.

// STensor is one float32 tensor to write.
type STensor struct {
	Name  string
	Shape []int
	Data  []float32
}

// dtypeSize is the bytes per element of each dtype the format defines.
// Any of them is read and validated; only F32 tensors are loaded into a
// model (Read).
var dtypeSize = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8, "C64": 8,
}

type stEntry struct {
	DType   string `json:"dtype"`
	Shape   []int  `json:"shape"`
	Offsets [2]int `json:"data_offsets"`
}

// WriteSafetensors writes tensors (in the given order) and metadata to
// path, fsyncs it and returns the SHA-256 of the bytes written (hex).
func WriteSafetensors(path string, tensors []STensor, meta map[string]string) (string, error) {
	h := sha256.New()
	if err := writeSafetensorsTo(path, tensors, meta, h); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func writeSafetensorsTo(path string, tensors []STensor, meta map[string]string, hash io.Writer) error {
	hdr := map[string]any{}
	if len(meta) > 0 {
		hdr["__metadata__"] = meta
	}
	off := 0
	for _, t := range tensors {
		n := 1
		for _, s := range t.Shape {
			n *= s
		}
		if n != len(t.Data) {
			return fmt.Errorf("safetensors %s: tensor %s has %d values for shape %v", path, t.Name, len(t.Data), t.Shape)
		}
		if _, dup := hdr[t.Name]; dup {
			return fmt.Errorf("safetensors %s: duplicate tensor %s", path, t.Name)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		hdr[t.Name] = stEntry{DType: "F32", Shape: shape, Offsets: [2]int{off, off + 4*n}}
		off += 4 * n
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return err
	}
	for len(js)%8 != 0 { // align the data to 8 bytes, as the Python writer does
		js = append(js, ' ')
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(io.MultiWriter(f, hash), 1<<20)
	var l [8]byte
	binary.LittleEndian.PutUint64(l[:], uint64(len(js)))
	w.Write(l[:])
	w.Write(js)
	buf := make([]byte, 4096)
	for _, t := range tensors {
		d := t.Data
		for len(d) > 0 {
			n := min(len(d), len(buf)/4)
			for i, v := range d[:n] {
				binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
			}
			if _, err := w.Write(buf[:4*n]); err != nil {
				f.Close()
				return fmt.Errorf("safetensors %s: %w", path, err)
			}
			d = d[n:]
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("safetensors %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("safetensors %s: %w", path, err)
	}
	return f.Close()
}

// SafetensorsFile is a parsed safetensors file held in memory.
type SafetensorsFile struct {
	Path     string
	Metadata map[string]string
	// SHA256 is the SHA-256 of the whole file as read (hex).
	SHA256  string
	entries map[string]stEntry
	data    []byte
}

// ReadSafetensors reads and validates a safetensors file: a header that
// does not parse, offsets outside the data, or a file shorter than its
// header says (a truncated write) are errors naming the file.
func ReadSafetensors(path string) (*SafetensorsFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	h := sha256.New()
	r := io.TeeReader(f, h)
	var l [8]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, fmt.Errorf("%s: not a safetensors file (%d bytes, truncated header)", path, size)
	}
	n := binary.LittleEndian.Uint64(l[:])
	if n > uint64(size-8) || n > 100<<20 {
		return nil, fmt.Errorf("%s: truncated or not a safetensors file (header of %d bytes, file of %d)", path, n, size)
	}
	js := make([]byte, n)
	if _, err := io.ReadFull(r, js); err != nil {
		return nil, fmt.Errorf("%s: reading header: %w", path, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(js, &raw); err != nil {
		return nil, fmt.Errorf("%s: bad safetensors header: %w", path, err)
	}
	sf := &SafetensorsFile{Path: path, entries: map[string]stEntry{}}
	end := 0
	type span struct{ b, e int }
	var spans []span
	for k, v := range raw {
		if k == "__metadata__" {
			if err := json.Unmarshal(v, &sf.Metadata); err != nil {
				return nil, fmt.Errorf("%s: bad __metadata__: %w", path, err)
			}
			continue
		}
		var e stEntry
		if err := json.Unmarshal(v, &e); err != nil {
			return nil, fmt.Errorf("%s: bad entry for %s: %w", path, k, err)
		}
		size, known := dtypeSize[e.DType]
		if !known {
			return nil, fmt.Errorf("%s: tensor %s has unknown dtype %q", path, k, e.DType)
		}
		cnt := 1
		for _, s := range e.Shape {
			cnt *= s
		}
		if e.Offsets[0] < 0 || e.Offsets[1]-e.Offsets[0] != size*cnt {
			return nil, fmt.Errorf("%s: tensor %s: offsets %v do not match shape %v", path, k, e.Offsets, e.Shape)
		}
		sf.entries[k] = e
		spans = append(spans, span{e.Offsets[0], e.Offsets[1]})
		end = max(end, e.Offsets[1])
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].b < spans[j].b })
	pos := 0
	for _, s := range spans {
		if s.b != pos {
			return nil, fmt.Errorf("%s: tensor data is not contiguous at byte %d", path, pos)
		}
		pos = s.e
	}
	if have := size - 8 - int64(n); have != int64(end) {
		if have < int64(end) {
			return nil, fmt.Errorf("%s: truncated: header promises %d bytes of tensor data, file holds %d", path, end, have)
		}
		return nil, fmt.Errorf("%s: %d bytes of trailing data after the tensors", path, have-int64(end))
	}
	sf.data = make([]byte, end)
	if _, err := io.ReadFull(r, sf.data); err != nil {
		return nil, fmt.Errorf("%s: reading tensor data: %w", path, err)
	}
	sf.SHA256 = hex.EncodeToString(h.Sum(nil))
	return sf, nil
}

// Names lists the tensor names, sorted.
func (s *SafetensorsFile) Names() []string {
	var n []string
	for k := range s.entries {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Read copies tensor name into dst, checking its shape.
func (s *SafetensorsFile) Read(name string, shape []int, dst []float32) error {
	e, ok := s.entries[name]
	if !ok {
		return fmt.Errorf("%s: no tensor %s", s.Path, name)
	}
	if e.DType != "F32" {
		return fmt.Errorf("%s: tensor %s has dtype %s; checkpoints hold F32", s.Path, name, e.DType)
	}
	if !equalShape(e.Shape, shape) {
		return fmt.Errorf("%s: tensor %s has shape %v, the model needs %v", s.Path, name, e.Shape, shape)
	}
	b := s.data[e.Offsets[0]:e.Offsets[1]]
	if len(dst) != len(b)/4 {
		return fmt.Errorf("%s: tensor %s: %d values for a buffer of %d", s.Path, name, len(b)/4, len(dst))
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return nil
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
