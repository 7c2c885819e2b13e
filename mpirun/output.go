package mpirun

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Output tag styles.
const (
	TagRank = "rank" // "[3] text" (default)
	TagMPI  = "mpi"  // "[1,3]<stdout>:text" (mpirun --tag-output)
	TagNone = "none" // untouched lines (still whole lines)
)

// LineCap is the longest piece of a line written at once: a longer line is
// cut into pieces of this size, each tagged and ended with a newline.
const LineCap = 64 << 10

// sink is one of gorun's output streams, shared by all ranks: a line is
// written with one Write under the lock, so ranks never mix inside a line.
type sink struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *sink) writeLine(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.w.Write(b)
}

func tagPrefix(style string, rank int, stream string) string {
	switch style {
	case TagMPI:
		return fmt.Sprintf("[1,%d]<%s>:", rank, stream)
	case TagNone:
		return ""
	default:
		return fmt.Sprintf("[%d] ", rank)
	}
}

// tagger reads one stream of one rank and writes it line by line, tagged,
// to a shared sink and (raw) to an optional file.
type tagger struct {
	out    *sink
	prefix string
	file   io.Writer
	// control, if set, sees every complete line first and returns true to
	// swallow it (the remote agent's control lines).
	control func(line []byte) bool
}

// pump copies r until EOF. A last line without a newline is written with
// one added; so is each LineCap-sized piece of an over-long line.
func (t *tagger) pump(r io.Reader) {
	br := bufio.NewReaderSize(r, LineCap)
	buf := make([]byte, 0, 256)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			complete := line[len(line)-1] == '\n'
			if !(complete && t.control != nil && t.control(line)) {
				if t.file != nil {
					_, _ = t.file.Write(line)
				}
				buf = append(buf[:0], t.prefix...)
				buf = append(buf, line...)
				if !complete {
					buf = append(buf, '\n')
				}
				t.out.writeLine(buf)
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}
