package data

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Binary corpus layout (little-endian), version 1:
//
//	off  size  field
//	0    8     magic "GORUNCRP"
//	8    4     version (1)
//	12   4     vocabulary size
//	16   8     lines N
//	24   8     source tokens
//	32   8     target tokens
//	40   8     lines dropped when it was prepared
//	48   32    vocabulary hash (SHA-256 of the pieces)
//	80   44    reserved (zero)
//	124  4     CRC-32 (IEEE) of bytes 0..123
//	128  8(N+1) source offsets (in tokens, from 0 to source tokens)
//	...  8(N+1) target offsets
//	...  4*src  source ids (int32)
//	...  4*tgt  target ids (int32)
//
// Ids are stored without EOS. The file size must be exactly what the
// header implies.
const (
	corpusMagic   = "GORUNCRP"
	corpusVersion = 1
	headerSize    = 128
)

// Corpus is a memory-mapped binary corpus; Pair returns views into the
// mapping (zero-copy), valid until Close.
//
// The file stays open while it is mapped, so that Changed can tell, with
// one fstat, whether the mapped file itself was truncated or written over
// in place (reading a truncated mapping's lost pages is a SIGBUS). A file
// replaced by a rename (a second nmt-train prepare into the directory, a
// cache entry published again) is no change: the mapping holds the old
// file, which lives on until Close.
type Corpus struct {
	path                 string
	file                 *os.File // open while mapped (nil after Close)
	mtime                unix.Timespec
	mem                  []byte
	n                    int
	srcOff, tgtOff       []uint64
	srcIDs, tgtIDs       []int32
	vocabSize            int
	vocabHash            string
	srcTokens, tgtTokens int64
	dropped              int64
	size                 int64
}

// WriteCorpus writes pairs of id sequences (without EOS) to path, recording
// the vocabulary's hash and size and how many lines were dropped.
func WriteCorpus(path string, src, tgt [][]int32, vocabHash string, vocabSize int, dropped int64) error {
	if len(src) != len(tgt) {
		return fmt.Errorf("%s: %d source and %d target lines", path, len(src), len(tgt))
	}
	w, err := NewCorpusWriter(path, vocabHash, vocabSize)
	if err != nil {
		return err
	}
	for i := range src {
		if err := w.Add(src[i], tgt[i]); err != nil {
			w.Abort()
			return err
		}
	}
	return w.Close(dropped)
}

// CorpusWriter writes a binary corpus one pair at a time, keeping only the
// offsets in memory (16 bytes a pair): the ids go to two temporary files
// that Close appends after the header and offsets. The corpus appears at
// its path only when Close succeeds.
type CorpusWriter struct {
	path      string
	hash      []byte
	vocabSize int
	off       [2][]uint64
	tmp       [2]*os.File
	buf       [2]*bufio.Writer
	n         int
	scratch   []byte
}

// NewCorpusWriter starts a corpus at path.
func NewCorpusWriter(path, vocabHash string, vocabSize int) (*CorpusWriter, error) {
	hash, err := hex.DecodeString(vocabHash)
	if err != nil || len(hash) != 32 {
		return nil, fmt.Errorf("%s: vocabulary hash %q is not 64 hex digits", path, vocabHash)
	}
	w := &CorpusWriter{path: path, hash: hash, vocabSize: vocabSize}
	for i, side := range []string{"src", "tgt"} {
		f, err := os.Create(path + "." + side + ".tmp")
		if err != nil {
			w.Abort()
			return nil, err
		}
		w.tmp[i] = f
		w.buf[i] = bufio.NewWriterSize(f, 1<<20)
		w.off[i] = []uint64{0}
	}
	return w, nil
}

// Add appends a pair; an id outside the vocabulary is an error.
func (w *CorpusWriter) Add(src, tgt []int32) error {
	w.n++
	for i, side := range [2][]int32{src, tgt} {
		w.scratch = w.scratch[:0]
		for _, id := range side {
			if id < 0 || int(id) >= w.vocabSize {
				return fmt.Errorf("%s: pair %d has id %d outside the vocabulary of %d", w.path, w.n, id, w.vocabSize)
			}
			w.scratch = binary.LittleEndian.AppendUint32(w.scratch, uint32(id))
		}
		if _, err := w.buf[i].Write(w.scratch); err != nil {
			return fmt.Errorf("%s: %w", w.path, err)
		}
		w.off[i] = append(w.off[i], w.off[i][len(w.off[i])-1]+uint64(len(side)))
	}
	return nil
}

// Len is the number of pairs added.
func (w *CorpusWriter) Len() int { return w.n }

// Abort removes the temporary files.
func (w *CorpusWriter) Abort() {
	for _, f := range w.tmp {
		if f != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}
	os.Remove(w.path + ".tmp")
}

// Close writes the corpus (header, offsets, ids) to a temporary file,
// syncs it and renames it to the path.
func (w *CorpusWriter) Close(dropped int64) (err error) {
	defer func() {
		if err != nil {
			w.Abort()
		} else {
			for _, f := range w.tmp {
				os.Remove(f.Name())
			}
		}
	}()
	for i := range w.buf {
		if err := w.buf[i].Flush(); err != nil {
			return fmt.Errorf("%s: %w", w.path, err)
		}
		if _, err := w.tmp[i].Seek(0, 0); err != nil {
			return fmt.Errorf("%s: %w", w.path, err)
		}
	}
	ns, nt := w.off[0][w.n], w.off[1][w.n]
	h := make([]byte, headerSize)
	copy(h, corpusMagic)
	le := binary.LittleEndian
	le.PutUint32(h[8:], corpusVersion)
	le.PutUint32(h[12:], uint32(w.vocabSize))
	le.PutUint64(h[16:], uint64(w.n))
	le.PutUint64(h[24:], ns)
	le.PutUint64(h[32:], nt)
	le.PutUint64(h[40:], uint64(dropped))
	copy(h[48:80], w.hash)
	le.PutUint32(h[124:], crc32.ChecksumIEEE(h[:124]))

	f, err := os.Create(w.path + ".tmp")
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	bw.Write(h)
	var b [8]byte
	for _, offs := range w.off {
		for _, o := range offs {
			le.PutUint64(b[:], o)
			bw.Write(b[:])
		}
	}
	for _, t := range w.tmp {
		if _, err := io.Copy(bw, t); err != nil {
			return fmt.Errorf("%s: %w", w.path, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("%s: %w", w.path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("%s: %w", w.path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("%s: %w", w.path, err)
	}
	return os.Rename(w.path+".tmp", w.path)
}

// OpenCorpus memory-maps a binary corpus and validates its header and
// offsets (not the tokens: a rank reads only its shard's tokens). Every
// problem is one error naming the file.
func OpenCorpus(path string) (_ *Corpus, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if st.Size < headerSize {
		return nil, fmt.Errorf("%s: not a gorun corpus (%d bytes, shorter than the %d-byte header)", path, st.Size, headerSize)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%s: mmap: %w", path, err)
	}
	var c *Corpus
	err = readMem(mem, func() (err error) { c, err = parseCorpus(mem); return err })
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c.path, c.file, c.size, c.mtime = path, f, st.Size, st.Mtim
	return c, nil
}

// readMem runs parse over the fresh mapping mem: a file truncated while
// it is being checked is an error, not a SIGBUS.
func readMem(mem []byte, parse func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if a, ok := r.(interface{ Addr() uintptr }); ok && inMem(mem, a.Addr()) {
				err = fmt.Errorf("the file changed while it was being opened (%v)", r)
				return
			}
			panic(r)
		}
	}()
	return parse()
}

func inMem(mem []byte, addr uintptr) bool {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	return len(mem) > 0 && addr >= base && addr-base < uintptr(len(mem))
}

// parseCorpus validates b and builds the views into it.
func parseCorpus(b []byte) (*Corpus, error) {
	if len(b) < headerSize || string(b[:8]) != corpusMagic {
		return nil, fmt.Errorf("not a gorun corpus (bad magic; make one with nmt-train prepare)")
	}
	le := binary.LittleEndian
	if v := le.Uint32(b[8:]); v != corpusVersion {
		return nil, fmt.Errorf("corpus format version %d, this program reads version %d", v, corpusVersion)
	}
	if le.Uint32(b[124:]) != crc32.ChecksumIEEE(b[:124]) {
		return nil, fmt.Errorf("header checksum mismatch (corrupted file)")
	}
	if !littleEndianHost() {
		return nil, fmt.Errorf("this host is big-endian; the corpus is little-endian")
	}
	n, ns, nt := le.Uint64(b[16:]), le.Uint64(b[24:]), le.Uint64(b[32:])
	const lim = 1 << 40
	if n >= lim || ns >= lim || nt >= lim {
		return nil, fmt.Errorf("header counts out of range (%d lines, %d+%d tokens)", n, ns, nt)
	}
	want := uint64(headerSize) + 16*(n+1) + 4*(ns+nt)
	if uint64(len(b)) != want {
		return nil, fmt.Errorf("size is %d bytes, the header (%d lines, %d source and %d target tokens) implies %d: truncated or garbled", len(b), n, ns, nt, want)
	}
	c := &Corpus{mem: b, n: int(n), vocabSize: int(le.Uint32(b[12:])),
		vocabHash: hex.EncodeToString(b[48:80]), srcTokens: int64(ns), tgtTokens: int64(nt),
		dropped: int64(le.Uint64(b[40:]))}
	p := uintptr(headerSize)
	c.srcOff = unsafe.Slice((*uint64)(unsafe.Pointer(&b[p])), n+1)
	p += uintptr(8 * (n + 1))
	c.tgtOff = unsafe.Slice((*uint64)(unsafe.Pointer(&b[p])), n+1)
	p += uintptr(8 * (n + 1))
	if ns > 0 {
		c.srcIDs = unsafe.Slice((*int32)(unsafe.Pointer(&b[p])), ns)
	}
	p += uintptr(4 * ns)
	if nt > 0 {
		c.tgtIDs = unsafe.Slice((*int32)(unsafe.Pointer(&b[p])), nt)
	}
	for side, off := range [][]uint64{c.srcOff, c.tgtOff} {
		total := []uint64{ns, nt}[side]
		name := []string{"source", "target"}[side]
		if off[0] != 0 || off[n] != total {
			return nil, fmt.Errorf("%s offsets run from %d to %d, want 0 to %d (garbled)", name, off[0], off[n], total)
		}
		for i := uint64(1); i <= n; i++ {
			if off[i] < off[i-1] {
				return nil, fmt.Errorf("%s offset of line %d goes backwards (garbled)", name, i)
			}
		}
	}
	return c, nil
}

func littleEndianHost() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// Len is the number of lines.
func (c *Corpus) Len() int { return c.n }

// Pair returns line i as views into the mapping.
//
// Offsets that no longer fit the mapping (the file was written over in
// place after OpenCorpus checked them) panic with a *ChangedError; the
// Batcher turns that, and a fault on the mapping, into its error.
func (c *Corpus) Pair(i int) (src, tgt []int32) {
	s0, s1, t0, t1 := c.span(i)
	return c.srcIDs[s0:s1:s1], c.tgtIDs[t0:t1:t1]
}

// Lens returns the lengths of line i from the offsets alone (checked as
// Pair checks them).
func (c *Corpus) Lens(i int) (int, int) {
	s0, s1, t0, t1 := c.span(i)
	return int(s1 - s0), int(t1 - t0)
}

// span returns line i's token ranges, checked against the mapping.
func (c *Corpus) span(i int) (s0, s1, t0, t1 uint64) {
	s0, s1, t0, t1 = c.srcOff[i], c.srcOff[i+1], c.tgtOff[i], c.tgtOff[i+1]
	if s0 > s1 || s1 > uint64(len(c.srcIDs)) || t0 > t1 || t1 > uint64(len(c.tgtIDs)) {
		panic(&ChangedError{Path: c.path, Detail: fmt.Sprintf("the offsets of line %d point outside it", i+1)})
	}
	return
}

// VocabHash is the hash of the vocabulary the corpus was made with.
func (c *Corpus) VocabHash() string { return c.vocabHash }

// VocabSize is the size of that vocabulary.
func (c *Corpus) VocabSize() int { return c.vocabSize }

// Tokens returns the token counts of each side (without EOS).
func (c *Corpus) Tokens() (src, tgt int64) { return c.srcTokens, c.tgtTokens }

// Dropped is the number of lines prepare dropped.
func (c *Corpus) Dropped() int64 { return c.dropped }

// Bytes is the file size.
func (c *Corpus) Bytes() int64 { return c.size }

// Path is the file it was opened from.
func (c *Corpus) Path() string { return c.path }

// CheckVocab returns an error naming the file when v is not the vocabulary
// the corpus was made with.
func (c *Corpus) CheckVocab(v *Vocab) error {
	if v.Hash() != c.vocabHash || v.Size() != c.vocabSize {
		return fmt.Errorf("%s: made with a vocabulary of %d pieces (hash %.12s), not this one of %d (hash %.12s): prepare it again with this vocabulary", c.path, c.vocabSize, c.vocabHash, v.Size(), v.Hash())
	}
	return nil
}

// Close unmaps and closes the file; slices from Pair are invalid
// afterwards.
func (c *Corpus) Close() error {
	if c.mem == nil {
		return nil
	}
	err := unix.Munmap(c.mem)
	if c.file != nil {
		c.file.Close()
	}
	c.mem, c.file, c.srcIDs, c.tgtIDs, c.srcOff, c.tgtOff = nil, nil, nil, nil, nil, nil
	return err
}

// ChangedError says that a corpus file changed under the job reading it.
type ChangedError struct {
	Path   string
	Detail string // what changed: "size 123 → 45 bytes: truncated ..."
}

func (e *ChangedError) Error() string {
	return fmt.Sprintf("data: %s changed under the running job (%s): stop, and start again once it is whole (a run resumes from its last checkpoint)", e.Path, e.Detail)
}

// Changed returns a *ChangedError when the mapped file is no longer as it
// was opened: its size or modification time differ (truncated, or written
// over in place: cp or dd onto it, rsync --inplace, a tool writing into
// it). One fstat of the open file; nil after Close. A file replaced by a
// rename is not a change (see Corpus).
func (c *Corpus) Changed() error {
	if c.file == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(c.file.Fd()), &st); err != nil {
		return fmt.Errorf("data: %s: %w", c.path, err)
	}
	switch {
	case st.Size != c.size:
		what := "truncated"
		if st.Size > c.size {
			what = "grew"
		}
		return &ChangedError{Path: c.path, Detail: fmt.Sprintf("size %d → %d bytes: %s, or written over in place, which nmt-train prepare never does", c.size, st.Size, what)}
	case st.Mtim != c.mtime:
		return &ChangedError{Path: c.path, Detail: fmt.Sprintf("written over in place at %s, same size, which nmt-train prepare never does",
			time.Unix(st.Mtim.Unix()).Format("2006-01-02 15:04:05"))}
	}
	return nil
}

// readFailed turns a panic recovered while reading c into the error that
// says why: a fault on the mapping (the file lost the page: truncated) or
// offsets outside it (written over in place). Any other panic goes on.
func (c *Corpus) readFailed(r any) error {
	var detail string
	switch e := r.(type) {
	case *ChangedError:
		if e.Path != c.path {
			panic(r)
		}
		detail = e.Detail
	case runtime.Error:
		a, ok := e.(interface{ Addr() uintptr })
		if !ok || !inMem(c.mem, a.Addr()) {
			panic(r)
		}
		detail = fmt.Sprintf("a read of byte %d of the mapping failed: an I/O error, or the file was truncated", a.Addr()-uintptr(unsafe.Pointer(unsafe.SliceData(c.mem))))
	default:
		panic(r)
	}
	if err := c.Changed(); err != nil {
		return err // what changed, by the file's size and time
	}
	return &ChangedError{Path: c.path, Detail: detail}
}

// readSource runs read, which reads s. When s is a mapped Corpus, a fault
// on its mapping (a truncated file: SIGBUS, turned into a panic by
// debug.SetPanicOnFault) or offsets outside it (a file written over in
// place) comes back as a *ChangedError naming the file instead of a crash,
// and so does a change the read did not trip over (one fstat after it):
// what read returns is then not used.
func readSource[T any](s Source, read func() (T, error)) (v T, err error) {
	c, ok := s.(*Corpus)
	if !ok || c.file == nil {
		return read()
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			var zero T
			v, err = zero, c.readFailed(r)
		}
	}()
	v, err = read()
	if cerr := c.Changed(); cerr != nil {
		var zero T
		return zero, cerr
	}
	return v, err
}
