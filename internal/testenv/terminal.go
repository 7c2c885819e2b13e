package testenv

import (
	"errors"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/creack/pty"
)

// RunInTerminal runs cmd with a pseudo-terminal of cols columns as its
// stdin, stdout and stderr (its controlling terminal, in a session of its
// own, as a shell starts a command), within limit. It returns everything
// the terminal received, byte for byte, and cmd's error.
func RunInTerminal(t testing.TB, cmd *exec.Cmd, cols uint16, limit time.Duration) (string, error) {
	t.Helper()
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 50, Cols: cols})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	timer := time.AfterFunc(limit, func() { cmd.Process.Kill() })
	defer timer.Stop()
	var out strings.Builder
	_, err = io.Copy(&out, ptmx) // ends with EIO once no process has the terminal open
	if err != nil && !errors.Is(err, syscall.EIO) {
		t.Fatal(err)
	}
	return out.String(), cmd.Wait()
}

// Screen is what a terminal shows after raw: its lines, where '\r' returns
// to the start of the line and ESC [ K erases from there to its end, as a
// terminal does; any other escape sequence is left in the text, for a
// test to find.
func Screen(raw string) []string {
	var lines []string
	var line []rune
	col := 0
	for i := 0; i < len(raw); {
		if strings.HasPrefix(raw[i:], "\x1b[K") {
			line = line[:min(col, len(line))]
			i += 3
			continue
		}
		r, n := utf8.DecodeRuneInString(raw[i:])
		i += n
		switch r {
		case '\r':
			col = 0
		case '\n':
			lines = append(lines, string(line))
			line, col = nil, 0
		default:
			if col < len(line) {
				line[col] = r
			} else {
				line = append(line, r)
			}
			col++
		}
	}
	if len(line) > 0 {
		lines = append(lines, string(line))
	}
	return lines
}
