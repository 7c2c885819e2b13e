package mpirun

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/rank"
)

// proc, one started rank, local or remote; starting a rank on this
// machine (its environment, pipes, output files and signal notices),
// waiting for it, signalling and killing it.

// proc is one started rank.
type proc struct {
	spec   rankSpec
	cmd    *exec.Cmd   // local ranks
	host   *remoteHost // remote ranks
	reaper *reaper
	files  []*os.File
	pumps  sync.WaitGroup
	// notices: gorun's end of a local rank's signal notices (signals.go)
	notices *os.File
	to, te  *tagger

	mu      sync.Mutex
	pid     int // remote: the program's pid on its host, once started
	started bool
}

func (pr *proc) getPid() int {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.pid
}

// outputFiles opens DIR/rank.N/stdout and stderr, or returns nils.
func (p *plan) outputFiles(r int) (of, ef *os.File, err error) {
	if p.cfg.OutputDir == "" {
		return nil, nil, nil
	}
	d := filepath.Join(p.cfg.OutputDir, fmt.Sprintf("rank.%d", r))
	if of, err = os.Create(filepath.Join(d, "stdout")); err != nil {
		return nil, nil, fmt.Errorf("--output-dir: %w", err)
	}
	if ef, err = os.Create(filepath.Join(d, "stderr")); err != nil {
		of.Close()
		return nil, nil, fmt.Errorf("--output-dir: %w", err)
	}
	return of, ef, nil
}

// newProc makes a rank's taggers and output files.
func (p *plan) newProc(sp rankSpec, stdout, stderr *sink) (*proc, error) {
	r := sp.slot.Rank
	pr := &proc{spec: sp}
	pr.to = &tagger{out: stdout, prefix: tagPrefix(p.cfg.Tag, r, "stdout"), key: 2 * r}
	pr.te = &tagger{out: stderr, prefix: tagPrefix(p.cfg.Tag, r, "stderr"), key: 2*r + 1}
	of, ef, err := p.outputFiles(r)
	if err != nil {
		return nil, err
	}
	if of != nil {
		pr.files = []*os.File{of, ef}
		pr.to.file, pr.te.file = of, ef
	}
	return pr, nil
}

func (pr *proc) closeOutput() {
	pr.to.Close()
	pr.te.Close()
	for _, f := range pr.files {
		f.Close()
	}
}

// startLocal starts a rank on this machine by exec.
func (p *plan) startLocal(sp rankSpec, port string, stdout, stderr *sink) (*proc, error) {
	cfg := p.cfg
	pr, err := p.newProc(sp, stdout, stderr)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(sp.argv[0], sp.argv[1:]...)
	cmd.Dir = cfg.Dir
	cmd.SysProcAttr = procAttr(syscall.SIGKILL)
	// gorun's environment (cfg.Environ), less what gorun sets for the
	// rank (RANK left there by another launcher, say), then the rank's own
	own := map[string]bool{}
	for _, kv := range sp.env {
		k, _, _ := strings.Cut(kv, "=")
		own[k] = true
	}
	var env []string
	for _, kv := range cleanEnviron(cfg.Environ) {
		if k, _, _ := strings.Cut(kv, "="); !own[k] {
			env = append(env, kv)
		}
	}
	for _, kv := range sp.env {
		if kv = p.fill(kv, port); kv != "" {
			env = append(env, kv)
		}
	}
	if p.restart > 0 {
		env = append(env, rank.EnvRestartCause+"="+p.cause)
	}
	cmd.Env = append(env, EnvSignalNotices+"="+strconv.Itoa(noticeFD), rank.EnvSecret+"="+p.secret)
	noteR, noteW, err := noticePipe()
	if err != nil {
		pr.closeOutput()
		return nil, err
	}
	cmd.ExtraFiles = []*os.File{noteR} // fd 3 = noticeFD
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(noteR, noteW)
		pr.closeOutput()
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(noteR, noteW, outR, outW)
		pr.closeOutput()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	var stdinW *os.File
	if sp.slot.Rank == cfg.StdinRank && cfg.Stdin != nil {
		sr, sw, err := os.Pipe()
		if err != nil {
			closeAll(noteR, noteW, outR, outW, errR, errW)
			pr.closeOutput()
			return nil, err
		}
		cmd.Stdin, stdinW = sr, sw
		defer sr.Close()
	}
	err = cmd.Start()
	closeAll(noteR, outW, errW)
	if err != nil {
		closeAll(noteW, outR, errR)
		if stdinW != nil {
			stdinW.Close()
		}
		pr.closeOutput()
		return nil, fmt.Errorf("cannot start rank %d (%s): %w", sp.slot.Rank, sp.argv[0], unwrapExec(err))
	}
	pr.cmd, pr.pid, pr.started, pr.notices = cmd, cmd.Process.Pid, true, noteW
	pr.pumps.Add(2)
	go func() { defer pr.pumps.Done(); pr.to.pump(outR); outR.Close() }()
	go func() { defer pr.pumps.Done(); pr.te.pump(errR); errR.Close() }()
	if stdinW != nil {
		go func() { _, _ = io.Copy(stdinW, cfg.Stdin); stdinW.Close() }()
	}
	return pr, nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// wait waits for a local rank and reports how it ended.
func (pr *proc) wait(results chan<- outcome) {
	_ = pr.cmd.Wait()
	// Whatever the rank left in its process group goes with it.
	_ = syscall.Kill(-pr.pid, syscall.SIGKILL)
	pr.notices.Close()
	pr.reaper.send("x", pr.pid) // its group id may be reused now
	ch := make(chan struct{})
	go func() { pr.pumps.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(2 * time.Second): // a process outside the group holds the pipe
	}
	pr.closeOutput()
	o := outcome{p: pr}
	if ws, ok := pr.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		o.signal = int(ws.Signal())
	} else {
		o.status = pr.cmd.ProcessState.ExitCode()
	}
	results <- o
}

// signal sends sig to the rank: to its process group here, after its
// notice (signals.go), or through its host's agent, which does the same.
func (pr *proc) signal(sig syscall.Signal) {
	if pr.host != nil {
		pr.host.signal(pr.spec.slot.Rank, sig)
		return
	}
	signalGroup(pr.pid, pr.notices, sig)
}

// killLocal kills what runs here for the rank: the rank itself, or its
// host's ssh or launch agent.
func (pr *proc) killLocal() {
	if pr.host != nil {
		_ = syscall.Kill(-pr.host.pid, syscall.SIGKILL)
		return
	}
	_ = syscall.Kill(-pr.pid, syscall.SIGKILL)
}
