package mpirun

import (
	"io"
	"os"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// EnvProgressLine is set to 1 in every rank's environment when gorun's
// stdout is a terminal: text a rank writes after a '\r' (a progress bar's
// redraw, "\rstep 3/10 ...") is then drawn on gorun's progress line, the
// bottom line of the terminal, and kept below the other output until the
// rank writes a line, a blank redraw ("\r \r") or ends. A program that
// finds its stdout is a pipe can draw its progress that way instead of
// writing nothing between log lines.
const EnvProgressLine = "GORUN_PROGRESS_LINE"

// progressLine is the bottom line of gorun's terminal. It shows the
// progress of the first rank stream (by rank, stdout before stderr) that
// has one; every line written to the terminal, by a rank or by gorun,
// clears it first and redraws it after, so neither garbles the other.
type progressLine struct {
	mu    sync.Mutex
	term  *os.File       // gorun's stdout
	texts map[int]string // tagger key -> its tagged progress text
	shown string         // what the terminal shows now ("" none)
	buf   []byte
}

// clearLine returns the cursor to the start of the line and erases it.
const clearLine = "\r\x1b[K"

// newProgressLine returns gorun's progress line when stdout is a
// terminal, else nil; errToo says whether stderr is the same terminal.
func newProgressLine(stdout, stderr io.Writer) (pl *progressLine, errToo bool) {
	out, ok := stdout.(*os.File)
	if !ok || !term.IsTerminal(int(out.Fd())) {
		return nil, false
	}
	pl = &progressLine{term: out, texts: map[int]string{}}
	if e, ok := stderr.(*os.File); ok && term.IsTerminal(int(e.Fd())) {
		var so, se unix.Stat_t
		errToo = unix.Fstat(int(out.Fd()), &so) == nil && unix.Fstat(int(e.Fd()), &se) == nil && so.Rdev == se.Rdev
	}
	return pl, errToo
}

// write writes line (whole lines) to w, a stream on the terminal, under
// the progress line. end >= 0 is a tagger key whose progress the line
// ends (the rank's own line replaces it).
func (pl *progressLine) write(w io.Writer, line []byte, end int) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if end >= 0 {
		delete(pl.texts, end)
	}
	was, show := pl.shown, pl.current()
	pl.shown = show
	pl.buf = pl.buf[:0]
	if was != "" {
		pl.buf = append(pl.buf, clearLine...)
	}
	if w == io.Writer(pl.term) {
		pl.buf = append(append(pl.buf, line...), show...)
		_, _ = pl.term.Write(pl.buf)
		return
	}
	if len(pl.buf) > 0 {
		_, _ = pl.term.Write(pl.buf)
	}
	_, _ = w.Write(line)
	if show != "" {
		_, _ = pl.term.WriteString(show)
	}
}

// set makes text the progress of the tagger key ("" ends it) and redraws
// the line if what it shows changes.
func (pl *progressLine) set(key int, text string) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if text == "" {
		delete(pl.texts, key)
	} else {
		pl.texts[key] = text
	}
	if show := pl.current(); show != pl.shown {
		pl.shown = show
		_, _ = pl.term.WriteString(clearLine + show)
	}
}

// current is what the line should show: the progress of the lowest key,
// fitted to the terminal.
func (pl *progressLine) current() string {
	first := -1
	for k := range pl.texts {
		if first < 0 || k < first {
			first = k
		}
	}
	if first < 0 {
		return ""
	}
	return pl.fit(pl.texts[first])
}

// end clears the line for good: gorun's output after the job is plain.
func (pl *progressLine) end() {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	clear(pl.texts)
	if pl.shown != "" {
		pl.shown = ""
		_, _ = pl.term.WriteString(clearLine)
	}
}

// fit makes text one line of the terminal: escape sequences (colours)
// and control characters dropped, cut to one column less than the width,
// so that the terminal never wraps.
func (pl *progressLine) fit(text string) string {
	cols := 80
	if ws, err := unix.IoctlGetWinsize(int(pl.term.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 {
		cols = int(ws.Col)
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(text); {
		if strings.HasPrefix(text[i:], "\x1b[") { // ESC [ parameters final-byte
			i += 2
			for i < len(text) && (text[i] < 0x40 || text[i] > 0x7e) {
				i++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(text[i:])
		i += size
		if r == '\t' {
			r = ' '
		}
		if unicode.IsControl(r) {
			continue
		}
		if n == cols-1 {
			break
		}
		b.WriteRune(r)
		n++
	}
	return strings.TrimRight(b.String(), " ")
}

// lineWriter is gorun's own stderr when it is the terminal: its messages
// go under the progress line too.
type lineWriter struct {
	pl *progressLine
	w  io.Writer
}

func (lw lineWriter) Write(b []byte) (int, error) {
	lw.pl.write(lw.w, b, -1)
	return len(b), nil
}
