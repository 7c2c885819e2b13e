package train

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/gorun/gorun/mpirun"
	"github.com/gorun/gorun/report"
	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// progress is rank 0's view of the run between two log lines: step N of
// M, the share done, the loss, tokens/s and the ETA. Where it goes:
//   - stdout is a terminal: a bar redrawn in place;
//   - stdout is gorun's pipe and gorun's stdout is a terminal
//     (GORUN_PROGRESS_LINE=1): the same text, each redraw begun with '\r'
//     and no escape codes; gorun draws it on the bottom line of its
//     terminal, below every rank's lines;
//   - otherwise (a file, a pipe, CI, nohup, --quiet): nothing. The log
//     lines say "step N/M" and the ETA (eta) and are the record.
type progress struct {
	w            io.Writer
	draw         drawMode
	start, total int       // the run's first step here, and its last
	t0           time.Time // when step start began
	last         time.Time // the last redraw
	shown        bool
	tokens, secs float64 // recent steps' target tokens and seconds, decaying
}

type drawMode int

const (
	drawNone     drawMode = iota
	drawTerminal          // stdout is a terminal
	drawGorun             // stdout is a pipe to gorun, which has a terminal
)

// progressEvery is the least time between two redraws.
const progressEvery = 200 * time.Millisecond

func newProgress(w io.Writer, want bool, start, total int) *progress {
	p := &progress{w: w, start: start, total: total, t0: time.Now()}
	f, ok := w.(*os.File)
	if !want || !ok {
		return p
	}
	var st unix.Stat_t
	if term.IsTerminal(int(f.Fd())) {
		p.draw = drawTerminal
	} else if os.Getenv(mpirun.EnvProgressLine) == "1" && unix.Fstat(int(f.Fd()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFIFO {
		p.draw = drawGorun
	}
	return p
}

// update records a finished step (the global loss and target tokens, its
// time) and redraws, at most every progressEvery.
func (p *progress) update(step int, loss float64, tokens int, dur time.Duration) {
	p.tokens = 0.9*p.tokens + float64(tokens)
	p.secs = 0.9*p.secs + dur.Seconds()
	if p.draw == drawNone || (p.shown && time.Since(p.last) < progressEvery) {
		return
	}
	p.last, p.shown = time.Now(), true
	const width = 10
	done := float64(step) / float64(max(p.total, 1))
	fill := min(int(done*width), width)
	bar := strings.Repeat("=", fill) + strings.Repeat(" ", width-fill)
	rate := 0.0
	if p.secs > 0 {
		rate = p.tokens / p.secs
	}
	// most wanted first: a narrow terminal cuts the end
	text := fmt.Sprintf("step %s/%s [%s] %3.0f%% | ETA %s | %s tok/s | loss %.4f",
		report.Commas(int64(step)), report.Commas(int64(p.total)), bar, 100*done, p.eta(step), report.Commas(int64(rate)), loss)
	if p.draw == drawGorun {
		fmt.Fprint(p.w, "\r"+text)
		return
	}
	if ws, err := unix.IoctlGetWinsize(int(p.w.(*os.File).Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 1 && len(text) >= int(ws.Col) {
		text = text[:ws.Col-1] // the text is ASCII; a full last column would wrap
	}
	fmt.Fprint(p.w, "\r"+text+"\x1b[K")
}

// clear takes the progress away before other output (logf calls it):
// erased on a terminal; under gorun ended with a blank redraw, which gorun
// reads as no progress. A nil progress (before the loop) has nothing shown.
func (p *progress) clear() {
	if p == nil || !p.shown {
		return
	}
	p.shown = false
	if p.draw == drawGorun {
		fmt.Fprint(p.w, "\r \r")
	} else {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
}

// eta is the time left after step, at the mean pace of the steps so far
// here (evaluations and checkpoints included), as h:mm:ss or m:ss.
func (p *progress) eta(step int) string {
	if step <= p.start {
		return "?"
	}
	left := time.Since(p.t0) / time.Duration(step-p.start) * time.Duration(p.total-step)
	s := int(left.Round(time.Second).Seconds())
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}
