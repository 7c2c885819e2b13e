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
// On gorun's terminal the lines go through its progress line instead,
// which clears and redraws itself around them.
type sink struct {
	mu sync.Mutex
	w  io.Writer
	pl *progressLine // non-nil: this stream is gorun's terminal
}

func (s *sink) writeLine(b []byte) {
	if s.pl != nil {
		s.pl.write(s.w, b, -1)
		return
	}
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
//
// When the sink is gorun's terminal, a '\r' is a terminal's carriage
// return: the text after it, until the next '\r' or '\n', is the rank's
// progress (key on the progress line), and the line finally written is
// what a terminal would show (see lineText).
type tagger struct {
	out    *sink
	prefix string
	key    int // this stream's place on the progress line: 2*rank, +1 for stderr
	file   io.Writer
	mu     sync.Mutex // Close may race with a late Write (a pipe held past the rank's end)
	buf    []byte     // the unfinished line (on a terminal: since its last '\r')
	cr     bool       // on a terminal: the unfinished line had a '\r'
	prev   []byte     // on a terminal: the last non-blank text ended by '\r' in this line
	line   []byte
}

// emit writes text as a tagged line; ends: the line ends this stream's
// progress (one redraw of the progress line for both).
func (t *tagger) emit(text []byte, ends bool) {
	t.line = append(append(append(t.line[:0], t.prefix...), text...), '\n')
	if ends {
		t.out.pl.write(t.out.w, t.line, t.key)
	} else {
		t.out.writeLine(t.line)
	}
}

// lineText is what ends the unfinished line on a newline: its text after
// the last '\r', or, when that is blank ("text\r\n"), the text before it.
func (t *tagger) lineText() []byte {
	if t.cr && blank(t.buf) {
		return t.prev
	}
	return t.buf
}

// endLine writes the unfinished line, which ends the rank's progress.
func (t *tagger) endLine() {
	t.emit(t.lineText(), t.cr)
	t.buf, t.prev, t.cr = t.buf[:0], t.prev[:0], false
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
	ends := "\n"
	if t.out.pl != nil {
		ends = "\r\n"
	}
	for len(p) > 0 {
		i := bytes.IndexAny(p, ends)
		if i < 0 || len(t.buf)+i > LineCap { // no end, or the line's head fills a piece first
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
		t.buf = append(t.buf, p[:i]...)
		if p[i] == '\n' {
			t.endLine()
		} else {
			if !blank(t.buf) {
				t.prev = append(t.prev[:0], t.buf...)
			} else if len(t.buf) > 0 { // spaces over the old text: it is gone
				t.prev = t.prev[:0]
			}
			t.buf, t.cr = t.buf[:0], true
		}
		p = p[i+1:]
	}
	if t.cr {
		text := t.buf
		if blank(text) {
			text = t.prev
		}
		if blank(text) {
			t.out.pl.set(t.key, "")
		} else {
			t.out.pl.set(t.key, t.prefix+string(text))
		}
	}
	return n, nil
}

// Close writes an unfinished last line, with a newline added, and ends
// the rank's progress.
func (t *tagger) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case len(t.buf) > 0 && !(t.cr && blank(t.buf)):
		t.emit(t.buf, t.cr)
	case t.cr:
		t.out.pl.set(t.key, "")
	}
	t.buf, t.prev, t.cr = t.buf[:0], t.prev[:0], false
	return nil
}

// blank: nothing but spaces and tabs.
func blank(b []byte) bool {
	return len(bytes.Trim(b, " \t")) == 0
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
