package mpirun

import (
	"bytes"
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

// tagger turns one stream of one rank into tagged lines on a shared sink
// and (raw) into an optional file. Write may be called with any pieces;
// Close writes a last line that has no newline.
type tagger struct {
	out    *sink
	prefix string
	file   io.Writer
	mu     sync.Mutex // Close may race with a late Write (a pipe held past the rank's end)
	buf    []byte     // an incomplete line
	line   []byte
}

func (t *tagger) emit(piece []byte, complete bool) {
	t.line = append(append(t.line[:0], t.prefix...), piece...)
	if !complete {
		t.line = append(t.line, '\n')
	}
	t.out.writeLine(t.line)
}

// Write tags every complete line of p; a line grown to LineCap bytes
// without a newline is written as a piece of its own.
func (t *tagger) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.file != nil {
		_, _ = t.file.Write(p)
	}
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			room := LineCap - len(t.buf)
			if len(p) <= room {
				t.buf = append(t.buf, p...)
				break
			}
			t.buf = append(t.buf, p[:room]...)
			t.emit(t.buf, false)
			t.buf = t.buf[:0]
			p = p[room:]
			continue
		}
		if len(t.buf)+i > LineCap { // the line's head fills a piece first
			room := LineCap - len(t.buf)
			t.buf = append(t.buf, p[:room]...)
			t.emit(t.buf, false)
			t.buf = t.buf[:0]
			p = p[room:]
			continue
		}
		if len(t.buf) > 0 {
			t.buf = append(t.buf, p[:i+1]...)
			t.emit(t.buf, true)
			t.buf = t.buf[:0]
		} else {
			t.emit(p[:i+1], true)
		}
		p = p[i+1:]
	}
	return n, nil
}

// Close writes an unfinished last line, with a newline added.
func (t *tagger) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.buf) > 0 {
		t.emit(t.buf, false)
		t.buf = t.buf[:0]
	}
	return nil
}

// pump copies r into the tagger until EOF, then closes it.
func (t *tagger) pump(r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			_, _ = t.Write(buf[:n])
		}
		if err != nil {
			t.Close()
			return
		}
	}
}
