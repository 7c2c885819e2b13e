package mpirun

import (
	"bufio"
	"encoding/base64"
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

// Remote hosts: starting the agent on one (startHost), reading its frames
// and complaints, its end, and the control channel on the agent's stdin.

// remoteHost is gorun's side of one remote host: the ssh (or launch agent)
// process that runs the remote agent, its control channel, and the ranks
// the agent starts.
type remoteHost struct {
	spec    *hostSpec
	cmd     *exec.Cmd
	pid     int
	ctl     *control
	procs   map[int]*proc
	results chan<- outcome
	reaper  *reaper
	stderr  *sink
	readers sync.WaitGroup
	// bindings: say each rank's binding line when it starts (--report-bindings)
	bindings bool
	// master gets MASTER_ADDR and MASTER_PORT as the agent picked them
	// (nil: this agent picks none)
	master chan<- [2]string

	mu       sync.Mutex
	hello    bool
	held     []string // the launcher's stderr before the agent said hello
	reported map[int]bool
}

// startHost starts the remote agent on one host, for all of its ranks.
// master, for rank 0's host when its agent picks MASTER_ADDR and
// MASTER_PORT, gets them from the agent's "master" frame.
func (p *plan) startHost(hs *hostSpec, port string, stdout, stderr *sink, results chan<- outcome, rp *reaper, master chan<- [2]string) (*remoteHost, []*proc, error) {
	h := &remoteHost{spec: hs, procs: map[int]*proc{}, results: results, reaper: rp, stderr: stderr, reported: map[int]bool{},
		bindings: p.cfg.ReportBindings, master: master}
	var procs []*proc
	fail := func(err error) (*remoteHost, []*proc, error) {
		for _, pr := range procs {
			pr.closeOutput()
		}
		return nil, nil, err
	}
	for _, r := range hs.ranks {
		pr, err := p.newProc(p.specs[r], stdout, stderr)
		if err != nil {
			return fail(err)
		}
		pr.host = h
		h.procs[r] = pr
		procs = append(procs, pr)
	}
	argv := make([]string, len(hs.argv))
	for i, a := range hs.argv {
		argv[i] = p.fill(a, port)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = cleanEnviron(p.cfg.Environ) // ssh's own; the ranks' is in the remote command
	cmd.SysProcAttr = procAttr(syscall.SIGTERM)
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(ctlR, ctlW)
		return fail(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(ctlR, ctlW, outR, outW)
		return fail(err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = ctlR, outW, errW
	err = cmd.Start()
	closeAll(ctlR, outW, errW)
	if err != nil {
		closeAll(ctlW, outR, errR)
		return fail(fmt.Errorf("cannot start %s for %s on host %s: %w", argv[0], rank.List(hs.ranks), hs.name, unwrapExec(err)))
	}
	h.cmd, h.pid = cmd, cmd.Process.Pid
	rp.send("g", h.pid)
	for _, pr := range procs {
		pr.reaper = rp
	}
	h.ctl = newControl(ctlW)
	h.ctl.send(p.secret)
	h.readers.Add(2)
	go func() { defer h.readers.Done(); h.readFrames(outR); outR.Close() }()
	go func() { defer h.readers.Done(); h.readDiag(errR); errR.Close() }()
	if r := p.cfg.StdinRank; p.cfg.Stdin != nil && h.procs[r] != nil {
		go h.ctl.forwardStdin(p.cfg.Stdin, r)
	}
	return h, procs, nil
}

// report sends a rank's outcome once.
func (h *remoteHost) report(o outcome) {
	r := o.p.spec.slot.Rank
	h.mu.Lock()
	if h.reported[r] {
		h.mu.Unlock()
		return
	}
	h.reported[r] = true
	h.mu.Unlock()
	o.p.closeOutput()
	h.results <- o
}

// readFrames reads the agent's frames (see agent.go). Lines that are not
// frames (a login script's chatter) are ignored.
func (h *remoteHost) readFrames(r io.Reader) {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	masterSeen := false // the agent said MASTER_ADDR and MASTER_PORT
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		if f[0] == "hello" {
			h.sayHello()
			continue
		}
		h.mu.Lock()
		hello := h.hello
		h.mu.Unlock()
		if !hello { // a login script's output, not the agent's
			continue
		}
		if f[0] == "master" {
			masterSeen = true
			if len(f) == 3 && h.master != nil {
				select {
				case h.master <- [2]string{f[1], f[2]}:
				default: // said once; a second is not the agent's
				}
			}
			continue
		}
		rk, err := strconv.Atoi(f[1])
		pr := h.procs[rk]
		if err != nil || pr == nil {
			continue
		}
		switch f[0] {
		case "o", "e":
			n, err := strconv.Atoi(f[len(f)-1])
			if len(f) != 3 || err != nil || n < 0 || n > 1<<24 {
				continue
			}
			if cap(buf) < n {
				buf = make([]byte, n)
			}
			if _, err := io.ReadFull(br, buf[:n]); err != nil {
				return
			}
			if f[0] == "o" {
				_, _ = pr.to.Write(buf[:n])
			} else {
				_, _ = pr.te.Write(buf[:n])
			}
		case "started":
			if len(f) == 3 {
				pid, _ := strconv.Atoi(f[2])
				pr.mu.Lock()
				pr.pid, pr.started = pid, true
				pr.mu.Unlock()
				if h.bindings {
					h.stderr.writeLine([]byte(bindingLine(pr.spec.slot, pid)))
				}
				if h.master != nil && !masterSeen {
					// an agent that does not know the "master" frame
					// (another gorun there): the other ranks would wait
					h.report(outcome{p: pr, fail: fmt.Sprintf("rank %d (host %s, pid %d): the agent there started it without picking MASTER_ADDR and MASTER_PORT: is the gorun there (--remote-gorun) an older one than this?", rk, h.spec.name, pid)})
					h.signal(rk, syscall.SIGTERM) // reported: the job's stop passes it by
				}
			}
		case "exit", "signal":
			if len(f) != 3 {
				continue
			}
			n, _ := strconv.Atoi(f[2])
			o := outcome{p: pr}
			if f[0] == "exit" {
				o.status = n
			} else {
				o.signal = n
			}
			h.report(o)
		case "error":
			msg := "the remote agent could not start it"
			if parts := strings.SplitN(strings.TrimSpace(line), " ", 3); len(parts) == 3 {
				msg = parts[2]
			}
			h.report(outcome{p: pr, fail: fmt.Sprintf("cannot start rank %d on host %s: %s", rk, h.spec.name, msg)})
		}
	}
}

func (h *remoteHost) sayHello() {
	h.mu.Lock()
	held := h.held
	h.hello, h.held = true, nil
	h.mu.Unlock()
	for _, l := range held {
		h.stderr.writeLine([]byte("gorun: " + h.spec.name + ": " + l + "\n"))
	}
}

// readDiag reads the launcher's stderr: ssh's, the remote shell's and the
// agent's complaints. Before the agent runs they are held back, for the
// one-line message if it never does.
func (h *remoteHost) readDiag(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		l := strings.TrimRight(sc.Text(), "\r")
		h.mu.Lock()
		if !h.hello {
			if len(h.held) == 32 {
				h.held = h.held[1:]
			}
			h.held = append(h.held, l)
			h.mu.Unlock()
			continue
		}
		h.mu.Unlock()
		h.stderr.writeLine([]byte("gorun: " + h.spec.name + ": " + l + "\n"))
	}
}

// wait waits for the host's ssh to end, then reports every rank the agent
// did not report: never started, or lost with the connection.
func (h *remoteHost) wait() {
	err := h.cmd.Wait()
	_ = syscall.Kill(-h.pid, syscall.SIGKILL)
	h.reaper.send("x", h.pid)
	h.ctl.close()
	done := make(chan struct{})
	go func() { h.readers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	how := "exited with status " + strconv.Itoa(h.cmd.ProcessState.ExitCode())
	if ws, ok := h.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		how = fmt.Sprintf("killed by signal %d (%v)", int(ws.Signal()), ws.Signal())
	} else if err != nil && h.cmd.ProcessState == nil {
		how = err.Error()
	}
	launcher := filepath.Base(h.cmd.Path)
	h.mu.Lock()
	hello := h.hello
	var last string
	if len(h.held) > 0 {
		last = h.held[len(h.held)-1]
	}
	h.mu.Unlock()
	for _, r := range h.spec.ranks {
		pr := h.procs[r]
		pr.mu.Lock()
		started, pid := pr.started, pr.pid
		pr.mu.Unlock()
		var msg string
		switch {
		case !hello && last != "":
			msg = fmt.Sprintf("cannot start rank %d on host %s: %s", r, h.spec.name, last)
		case !hello || !started:
			msg = fmt.Sprintf("cannot start rank %d on host %s: %s %s before the remote agent ran", r, h.spec.name, launcher, how)
		default:
			msg = fmt.Sprintf("rank %d (host %s, pid %d): lost: %s %s", r, h.spec.name, pid, launcher, how)
		}
		h.report(outcome{p: pr, fail: msg})
	}
}

// signal sends sig to one rank through the agent; before the agent runs,
// to the ssh (or launch agent) process group instead.
func (h *remoteHost) signal(rank int, sig syscall.Signal) {
	h.mu.Lock()
	hello := h.hello
	h.mu.Unlock()
	if !hello {
		_ = syscall.Kill(-h.pid, sig)
		return
	}
	h.ctl.send(fmt.Sprintf("s %d %d", rank, int(sig)))
}

// control is the launcher's end of a remote agent's stdin: lines go out in
// order from one goroutine, so a stuck ssh never blocks the lifecycle.
type control struct {
	q    chan string
	done chan struct{}
	once sync.Once
}

func newControl(w io.WriteCloser) *control {
	c := &control{q: make(chan string, 64), done: make(chan struct{})}
	go func() {
		defer w.Close()
		write := func(l string) { _, _ = io.WriteString(w, l+"\n") }
		for {
			select {
			case l := <-c.q:
				write(l)
			case <-c.done:
				for {
					select {
					case l := <-c.q:
						write(l)
					default:
						return
					}
				}
			}
		}
	}()
	return c
}

func (c *control) send(line string) {
	select {
	case <-c.done:
		return
	default:
	}
	select {
	case c.q <- line:
	case <-c.done:
	}
}

func (c *control) close() { c.once.Do(func() { close(c.done) }) }

func (c *control) forwardStdin(r io.Reader, rank int) {
	buf := make([]byte, 32<<10)
	rs := strconv.Itoa(rank)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			c.send("i " + rs + " " + base64.StdEncoding.EncodeToString(buf[:n]))
		}
		if err != nil {
			c.send("e " + rs)
			return
		}
		select {
		case <-c.done:
			return
		default:
		}
	}
}
