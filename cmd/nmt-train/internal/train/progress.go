package train

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// progress draws a one-line progress bar with an ETA when the output is a
// terminal; otherwise (CI, nohup, gorun's tagged pipes) it draws nothing
// and the log lines are the record.
type progress struct {
	w    io.Writer
	on   bool
	last time.Time
}

func newProgress(w io.Writer, want bool) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok && want {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.on = err == nil
	}
	return p
}

func (p *progress) update(step, total, start int, t0 time.Time, loss float64) {
	if !p.on || time.Since(p.last) < 200*time.Millisecond {
		return
	}
	p.last = time.Now()
	done := float64(step) / float64(total)
	const width = 30
	fill := int(done * width)
	eta := "?"
	if step > start {
		per := time.Since(t0) / time.Duration(step-start)
		eta = (per * time.Duration(total-step)).Round(time.Second).String()
	}
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d  loss %.3f  ETA %s ", strings.Repeat("=", fill), strings.Repeat(" ", width-fill), step, total, loss, eta)
}

func (p *progress) clear() {
	if p.on && !p.last.IsZero() {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", 80))
	}
}
