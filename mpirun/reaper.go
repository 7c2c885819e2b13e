package mpirun

import (
	"bufio"
	"io"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The reaper is a small gorun process, one per job, that outlives gorun:
// gorun tells it the process group of every process it starts (local ranks,
// ssh, launch agents) on its stdin ("g PGID"), which groups are gone
// ("x PGID"), and says "done" when the job is over.
// If its stdin ends without "done" (gorun was killed with SIGKILL and
// could not clean up), it stops every group: SIGTERM, then SIGKILL after
// the grace period. Without it, the parent-death signal would stop only
// each rank's main process, not what the rank started.

// ReaperFlag is the hidden command-line flag that makes gorun the reaper.
const ReaperFlag = "internal-reaper"

// RunReaper runs the reaper until its stdin ends; it returns 0.
func RunReaper(grace time.Duration, in io.Reader) int {
	if grace <= 0 {
		grace = DefaultGrace
	}
	// The reaper must outlive gorun's terminal signals.
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGTERM)
	set := map[int]bool{}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		op, arg, _ := strings.Cut(sc.Text(), " ")
		n, err := strconv.Atoi(arg)
		switch {
		case op == "g" && err == nil && n > 1:
			set[n] = true
		case op == "x" && err == nil:
			delete(set, n)
		case op == "done":
			return 0
		}
	}
	var groups []int
	for g := range set {
		groups = append(groups, g)
	}
	alive := func() bool {
		for _, g := range groups {
			if syscall.Kill(-g, 0) == nil {
				return true
			}
		}
		return false
	}
	for _, g := range groups {
		_ = syscall.Kill(-g, syscall.SIGTERM)
	}
	for deadline := time.Now().Add(grace); alive() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	for _, g := range groups {
		_ = syscall.Kill(-g, syscall.SIGKILL)
	}
	return 0
}

// reaper is gorun's end of the reaper's stdin.
type reaper struct {
	mu     sync.Mutex
	w      io.WriteCloser
	cmd    *exec.Cmd
	closed bool
}

// startReaper starts the reaper, gorun's binary at path, with the
// environment environ (nil: an empty one).
func startReaper(path string, grace time.Duration, environ []string) (*reaper, error) {
	cmd := exec.Command(path, "--"+ReaperFlag, "--grace", grace.String())
	cmd.Env = childEnv(environ)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // no parent-death signal: it must outlive gorun
	w, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &reaper{w: w, cmd: cmd}, nil
}

// send tells the reaper about a process group: "g" to watch, "x" gone.
func (r *reaper) send(op string, pgid int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		_, _ = io.WriteString(r.w, op+" "+strconv.Itoa(pgid)+"\n")
	}
}

func (r *reaper) done() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = io.WriteString(r.w, "done\n")
	r.w.Close()
	r.closed = true
	_ = r.cmd.Wait()
}
