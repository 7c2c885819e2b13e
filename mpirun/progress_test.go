package mpirun

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/creack/pty"
	"github.com/gorun/gorun/internal/testenv"
	"golang.org/x/sys/unix"
)

// terminal opens a pseudo-terminal of cols columns that passes bytes
// unchanged (no "\r\n" for "\n"), so that a test sees exactly what gorun
// wrote. read returns everything written to it, once tty is closed.
func terminal(t *testing.T, cols uint16) (tty *os.File, read func() string) {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatalf("no pseudo-terminal: %v", err)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 24, Cols: cols}); err != nil {
		t.Fatal(err)
	}
	tio, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	tio.Oflag &^= unix.OPOST
	if err := unix.IoctlSetTermios(int(tty.Fd()), unix.TCSETS, tio); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&out, ptmx); close(done) }() // EIO once tty is closed
	t.Cleanup(func() { tty.Close(); <-done; ptmx.Close() })
	return tty, func() string { tty.Close(); <-done; return out.String() }
}

// On a terminal, text a rank ends with '\r' is its progress, drawn on the
// bottom line; every other line clears it first and redraws it after; a
// line, a blank redraw or the rank's end takes it away; it is cut to the
// terminal's width (less one column, so that it never wraps), without
// escape sequences. Exact bytes.
func TestTaggerProgressLine(t *testing.T) {
	tty, read := terminal(t, 16)
	pl, errToo := newProgressLine(tty, tty)
	if pl == nil || !errToo {
		t.Fatalf("a terminal as stdout and stderr: progress line %v, stderr on it %v", pl != nil, errToo)
	}
	s := &sink{w: tty, pl: pl}
	r0 := &tagger{out: s, prefix: "[0] ", key: 0}
	r1 := &tagger{out: s, prefix: "[1] ", key: 2}
	const clr = "\r\x1b[K"
	steps := []struct {
		tg   *tagger
		in   string
		want string
	}{
		{r0, "\rA", clr + "[0] A"}, // tqdm's way: '\r' first
		{r0, "\rB", clr + "[0] B"},
		{r1, "x\n", clr + "[1] x\n[0] B"},                   // another rank's line, under the progress
		{r1, "\rC", ""},                                     // rank 1's progress waits behind rank 0's
		{r0, "\n", clr + "[0] B\n" + "[1] C"},               // the line a terminal would show; rank 1's turn
		{r1, "\r \r", clr},                                  // a blank redraw: no progress
		{r0, "text\r\n", "[0] text\n"},                      // CRLF is a plain line
		{r0, "P1\r", clr + "[0] P1"},                        // progress ended by '\r'
		{r0, "P2\rdone\n", clr + "[0] done\n"},              // the line replaces it
		{r0, "\r0123456789abcdef", clr + "[0] 0123456789a"}, // 15 columns of 16
		{r0, "\r\x1b[1;32mgreen\x1b[0m", clr + "[0] green"}, // colours dropped
		{r0, "\rlast", clr + "[0] last"},                    // pending at the end...
		{r0, "", clr + "[0] last\n"},                        // ...Close writes it as a line, like a terminal shows it
	}
	want := ""
	for i, st := range steps {
		if i == len(steps)-1 {
			st.tg.Close()
		} else {
			st.tg.Write([]byte(st.in))
		}
		want += st.want
	}
	pl.end()
	if got := read(); got != want {
		t.Errorf("terminal got\n%q\nwant\n%q", got, want)
	}

	// Not a terminal: the rank's bytes are passed as they are, in lines.
	var b bytes.Buffer
	plain := &tagger{out: &sink{w: &b}, prefix: "[0] "}
	plain.Write([]byte("\rA\rB\n"))
	if b.String() != "[0] \rA\rB\n" {
		t.Errorf("not a terminal: %q", b.String())
	}
}

// A job on a terminal: every rank is told (local and remote); rank 0's
// progress, then a remote rank's, is drawn while the other ranks and
// gorun write lines, and the screen at the end holds whole lines only.
func TestRunOnTerminal(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent.sh")
	os.WriteFile(agent, []byte("#!/bin/sh\nexec env MPIRUN_TEST_AS_GORUN=1 /bin/sh -c \"$2\"\n"), 0o755)
	self, _ := os.Executable()
	// Rank 0 (here) draws while rank 1 (on the "remote" host) writes
	// lines, then ends its progress with a line; rank 1 draws; rank 2
	// (remote) fails: gorun says so and stops rank 1, which is drawing.
	wait := func(f string) string { return "while [ ! -e " + dir + "/" + f + " ]; do sleep 0.01; done; " }
	script := `echo "rank $GORUN_RANK progress line $GORUN_PROGRESS_LINE"
		case $GORUN_RANK in
		0) printf '\rstep 1/3'; printf '\rstep 2/3'; touch ` + dir + `/a; ` + wait("b") + `printf '\r'; echo "rank 0 done"; touch ` + dir + `/c;;
		1) ` + wait("a") + `echo "out of 1"; echo "err of 1" >&2; touch ` + dir + `/b; ` + wait("c") + `printf '\rremote 1/2'; touch ` + dir + `/d; sleep 60;;
		2) ` + wait("d") + `exit 3;;
		esac`
	tty, read := terminal(t, 200)
	code, err := Run(Config{Environ: os.Environ(), Hosts: []Host{{Name: "localhost", Slots: 1}, {Name: "127.0.0.2", Slots: 2}},
		LaunchAgent: agent, RemoteGorun: self, Reaper: self, StdinRank: -1,
		Program: "/bin/sh", Args: []string{"-c", script}, Stdout: tty, Stderr: tty})
	if err != nil || code != 3 {
		t.Fatalf("status %d, %v", code, err)
	}
	raw := read()
	// shown, then cleared for a line (whichever comes first)
	for _, drawn := range []string{"[0] step 2/3\r\x1b[K", "[1] remote 1/2\r\x1b[K"} {
		if !strings.Contains(raw, drawn) {
			t.Errorf("the terminal never showed %q:\n%q", drawn, raw)
		}
	}
	if !strings.HasSuffix(raw, "\n") {
		t.Errorf("the terminal does not end with a whole line: %q", raw)
	}
	screen := testenv.Screen(raw)
	slices.Sort(screen)
	want := []string{
		"[0] rank 0 done",
		"[0] rank 0 progress line 1",
		"[1] err of 1",
		"[1] out of 1",
		"[1] rank 1 progress line 1",
		"[1] remote 1/2", // stopped while drawing: its last progress stays, as on a terminal
		"[2] rank 2 progress line 1",
	}
	var failure string
	if len(screen) > 0 {
		failure, screen = screen[len(screen)-1], screen[:len(screen)-1]
	}
	if !slices.Equal(screen, want) || !strings.HasPrefix(failure, "gorun: rank 2 (host 127.0.0.2, pid ") || !strings.HasSuffix(failure, ") exited with status 3") {
		t.Errorf("screen at the end:\n%s\n%s\nwant\n%s\ngorun: rank 2 (host 127.0.0.2, pid N) exited with status 3\nraw: %q",
			strings.Join(screen, "\n"), failure, strings.Join(want, "\n"), raw)
	}
}

// Not on a terminal: no rank is told, even when gorun itself runs under
// a gorun that is.
func TestRunNotOnTerminal(t *testing.T) {
	t.Setenv(EnvProgressLine, "1")
	code, out, errs := runSh(t, Config{NP: 2, StdinRank: -1}, `echo "progress line '$GORUN_PROGRESS_LINE'"`)
	if code != 0 || strings.Join(sortedLines(out), ",") != "[0] progress line '',[1] progress line ''" || errs != "" {
		t.Errorf("status %d, stdout %q, stderr %q", code, out, errs)
	}
}
