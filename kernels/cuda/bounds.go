package cuda

import (
	"fmt"
	"unsafe"
)

// Index checks. A kernel that reads indices from data (Embedding's and
// EmbeddingBackward's ids, CrossEntropy's targets, AdamRows' row numbers,
// GatherRows' source rows) checks each against its bound before it
// addresses memory: on a GPU an index out of range is silent corruption or
// an illegal address that kills the context. A bad index is not used, and
// the first one is recorded (atomically) in a record of four int32 beside
// the reduction buffer: the op (indexOps), the index, the bound and the
// row of the data it was read at. The host copies the record back at its
// next synchronisation of the compute stream (Sync, Download, and the
// scalar results: CrossEntropy's loss, HasInfNaN, SumSquares, where it
// rides on the copy of the result) and panics with an *IndexError, which
// Failure turns into one line. Only a sync after one of these kernels ran
// reads it: otherwise a sync costs what it did before.

// indexOps are the ops of kernels.cu's GR_OP_* codes (a test reads them
// there): code i+1 is indexOps[i]; its format takes the index, the bound
// and the row.
var indexOps = []struct {
	op, format string
}{
	{"embedding", "id %d outside the vocabulary of %d (row %d)"},
	{"embedding_bwd", "id %d outside the vocabulary of %d (row %d)"},
	{"xent", "target %d outside the vocabulary of %d (row %d)"},
	{"adam_rows", "row %d outside the parameter's %d rows (rows[%d])"},
	{"gather_rows", "index %d outside the source's %d rows (row %d of the destination)"},
}

// IndexError is an index that a kernel read from data and found outside
// its bound: "cuda: embedding_bwd: id 40000 outside the vocabulary of
// 32768 (row 17)".
type IndexError struct {
	Op    string // the kernel's op, as kernels.cu names it: embedding_bwd
	Index int
	Bound int
	Row   int // where in the data it was read: ids[Row], targets[Row], rows[Row], idx[Row]
	text  string
}

func (e *IndexError) Error() string { return "cuda: " + e.Op + ": " + e.text }

// reductionOut is the host's copy of the reduction buffer: the two
// reduction results, then the index record.
type reductionOut struct {
	sums [2]uint64
	rec  [4]int32 // op (0: none), index, bound, row
}

// The reduction buffer: 16 bytes of results, then the 16-byte index
// record.
const (
	recordOffset = 16
	recordBytes  = 16
	redBufBytes  = recordOffset + recordBytes
)

// indexRecord returns the device pointer of the index record for a kernel
// that checks indices, and notes that the next sync reads it.
func (b *Backend) indexRecord() uintptr {
	b.recPending = true
	return b.redBuf + recordOffset
}

// copyRecord queues the copy of the index record to the host when a kernel
// that writes it ran since the last sync.
func (b *Backend) copyRecord() {
	if b.recPending {
		b.begin()
		b.drv.must("cuMemcpyDtoHAsync", b.drv.call(b.drv.memcpyDtoHAsync, uintptr(unsafe.Pointer(&b.redOut.rec[0])),
			b.redBuf+recordOffset, recordBytes, b.stream))
		b.end(opDeviceToHost)
	}
}

// wait waits for the compute stream, then reports the index record if it
// was copied: a bad index panics with an *IndexError, the record cleared
// (the backend stays usable after a recover).
func (b *Backend) wait() {
	b.counts.Syncs++
	b.drv.must("cuStreamSynchronize", b.drv.call(b.drv.streamSynchronize, b.stream))
	if !b.recPending {
		return
	}
	b.recPending = false
	r := b.redOut.rec
	if r[0] == 0 {
		return
	}
	b.redOut.rec = [4]int32{}
	b.memset(b.redBuf+recordOffset, recordBytes)
	panic(indexError(r))
}

func indexError(r [4]int32) *IndexError {
	e := &IndexError{Op: fmt.Sprintf("op %d", r[0]), Index: int(r[1]), Bound: int(r[2]), Row: int(r[3])}
	format := "index %d outside its bound %d (row %d)"
	if r[0] >= 1 && int(r[0]) <= len(indexOps) {
		e.Op, format = indexOps[r[0]-1].op, indexOps[r[0]-1].format
	}
	e.text = fmt.Sprintf(format, e.Index, e.Bound, e.Row)
	return e
}
