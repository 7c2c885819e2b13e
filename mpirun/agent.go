package mpirun

import (
	"bufio"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/rank"
)

// The remote agent is gorun itself, started once per remote host by ssh (or
// by --launch-agent) as
//
//	cd DIR && exec env NAME=VALUE... GORUN --internal-remote-agent --grace D --ranks R.L,R.L... [--cuda-local] [--agent-stdin R] -- PROG ARGS
//
// where the environment holds what the host's ranks share and --ranks lists
// each rank with its local rank. It starts one PROG per rank, each in its own
// process group, with GORUN_RANK, GORUN_LOCAL_RANK, CUDA_VISIBLE_DEVICES (with
// --cuda-local) and the job secret added to its environment, and its signal
// notices as fd 3 (GORUN_SIGNAL_NOTICES=3, signals.go): every stop signal
// the agent sends a rank, forwarded or its own, has its notice first.
//
// Its stdin is the control channel from the launcher: the first line is the
// job secret (so it never appears in a command line); the lines after it are
//
//	m ADDR PORT  MASTER_ADDR and MASTER_PORT, picked on rank 0's host (below)
//	s R N      send signal N to rank R's process group (R = -1: every rank)
//	i R BASE64 bytes for rank R's stdin (only the --agent-stdin rank)
//	e R        end of rank R's stdin
//
// and the end of the channel (the launcher or its ssh is gone) stops every
// rank: SIGTERM, then SIGKILL after the grace period. SIGTERM, SIGINT and
// SIGHUP to the agent are forwarded to every rank, with the same escalation.
//
// Its stdout carries frames to the launcher:
//
//	hello PID          the agent runs (first frame)
//	master ADDR PORT   MASTER_ADDR and MASTER_PORT picked here (below)
//	started R PID      rank R runs as PID
//	error R MESSAGE    rank R could not be started
//	o R N\n<N bytes>   output of rank R on stdout
//	e R N\n<N bytes>   output of rank R on stderr
//	exit R STATUS      rank R exited (after all its output)
//	signal R N         rank R died of signal N (after all its output)
//
// Its own stderr is for ssh's, the shell's and its own complaints.
//
// The variables of torchrun and OpenMPI that gorun gives every rank
// (ForeignVars) come in the host's environment, those that differ between
// its ranks as placeholders the agent fills in for each (RANK=@rank@,
// LOCAL_RANK=@local-rank@, and OMPI_COMM_WORLD_RANK, _LOCAL_RANK the same).
// MASTER_ADDR and MASTER_PORT, when gorun could not know them (rank 0 is
// on a remote host), come as @master-addr@ and @master-port@: the agent on
// rank 0's host picks them before starting its ranks and writes the frame
// "master ADDR PORT"; gorun sends "m ADDR PORT" to every other agent, which
// waits for it before starting its ranks, and starts its own local ranks.
// A new start (--max-restarts) is new agents, and a new pick.

// AgentFlag is the hidden command-line flag that makes gorun the remote agent.
const AgentFlag = "internal-remote-agent"

// AgentRank is one rank the agent starts.
type AgentRank struct{ Rank, Local int }

// AgentConfig is what the remote agent is told on its command line.
type AgentConfig struct {
	Grace     time.Duration
	Ranks     []AgentRank
	StdinRank int  // rank whose stdin the launcher feeds (-1: none)
	CUDALocal bool // set CUDA_VISIBLE_DEVICES to the local rank modulo the host's GPUs
	Prog      string
	Args      []string
	// Environ is the agent's environment, NAME=VALUE each as in
	// exec.Cmd's Env (cmd/gorun passes its process's): what the remote
	// command put there for the host's ranks, with the placeholders the
	// agent fills in, and the environment its ranks and its reaper start
	// with. The agent reads no other; nil is an empty environment (as
	// Config.Environ's).
	Environ []string
}

// ParseAgentRanks parses --ranks "R.L,R.L".
func ParseAgentRanks(s string) ([]AgentRank, error) {
	var out []AgentRank
	for _, f := range strings.Split(s, ",") {
		r, l, ok := strings.Cut(f, ".")
		rn, err1 := strconv.Atoi(r)
		ln, err2 := strconv.Atoi(l)
		if !ok || err1 != nil || err2 != nil || rn < 0 || ln < 0 {
			return nil, fmt.Errorf("--ranks %q: want RANK.LOCAL,...", s)
		}
		out = append(out, AgentRank{rn, ln})
	}
	return out, nil
}

func formatAgentRanks(rs []AgentRank) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%d.%d", r.Rank, r.Local)
	}
	return strings.Join(parts, ",")
}

// frameWriter writes whole frames to the launcher, one at a time.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (f *frameWriter) line(format string, a ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fmt.Fprintf(f.w, format+"\n", a...)
}

func (f *frameWriter) data(stream byte, rank int, p []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	hdr := fmt.Sprintf("%c %d %d\n", stream, rank, len(p))
	buf := make([]byte, 0, len(hdr)+len(p))
	buf = append(append(buf, hdr...), p...)
	_, _ = f.w.Write(buf)
}

type agentRank struct {
	AgentRank
	cmd     *exec.Cmd
	notices *os.File // the agent's end of the rank's signal notices (signals.go)
	stdin   *os.File
	pumps   sync.WaitGroup
	exited  chan struct{}
}

// RunAgent runs the remote agent until every rank has ended; it returns 0,
// or 127 if it could not run at all.
func RunAgent(cfg AgentConfig, ctl io.Reader, stdout, stderr io.Writer) int {
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	br := bufio.NewReader(ctl)
	secret, err := br.ReadString('\n')
	secret = strings.TrimSpace(secret)
	if err != nil {
		fmt.Fprintln(stderr, "gorun agent: no job secret on stdin (the remote agent is started by gorun, not by hand; a --launch-agent must pass gorun's stdin on, as ssh does and kubectl exec does with -i)")
		return 127
	}
	if b, err := hex.DecodeString(secret); err != nil || len(b) < 16 {
		fmt.Fprintln(stderr, "gorun agent: malformed job secret on stdin")
		return 127
	}
	ag := &agent{cfg: cfg, out: &frameWriter{w: stdout}, stderr: stderr, ranks: map[int]*agentRank{}}
	ag.out.line("hello %d", os.Getpid())

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)

	// A reaper of its own stops the ranks' process groups if the agent
	// itself is killed (SIGKILL, the OOM killer) and cannot.
	if self, err := os.Executable(); err == nil {
		if ag.rp, err = startReaper(self, cfg.Grace, cfg.Environ); err == nil {
			defer ag.rp.done()
		}
	}
	// gorun's control lines, read from here on by one goroutine
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			lines <- l
		}
	}()
	master, ok := ag.master(lines, sigs)
	if !ok {
		return 0
	}
	host, _ := os.Hostname()
	gpus := HostGPUs()
	for _, ar := range cfg.Ranks {
		if a := ag.start(ar, secret, host, gpus, master); a != nil {
			ag.ranks[ar.Rank] = a
			ag.all = append(ag.all, a)
		}
	}
	go ag.control(lines)
	go func() {
		for s := range sigs {
			ag.stopAll(s.(syscall.Signal))
		}
	}()
	var wg sync.WaitGroup
	for _, a := range ag.all {
		wg.Add(1)
		go func(a *agentRank) {
			defer wg.Done()
			ag.wait(a)
		}(a)
	}
	wg.Wait()
	return 0
}

// agent is the remote agent's state: its ranks, the frames it writes to
// gorun, its reaper.
type agent struct {
	cfg      AgentConfig
	out      *frameWriter
	stderr   io.Writer // the agent's own complaints (gorun shows them)
	rp       *reaper
	mu       sync.Mutex // guards ranks' cmd.Process use against the waiters
	ranks    map[int]*agentRank
	all      []*agentRank
	stopOnce sync.Once
}

// master returns the values of MASTER_ADDR and MASTER_PORT for the
// placeholders gorun left in the host's environment (none when gorun
// knew them, or the user set them): the agent on rank 0's host picks them
// (an address of this host that routes to gorun's rendezvous, or the one
// GORUN_IFACE names; a free TCP port, in GORUN_PORT_RANGE if set) and says
// them to gorun in a "master ADDR PORT" frame before its ranks start; the
// other agents wait for gorun's "m ADDR PORT" line. A value that could not
// be picked is "-" (masterNone), with a warning on the agent's stderr
// (gorun shows it): the ranks get no such variable, and gorun's own ranks,
// which do not need it, run. ok is false when the ranks must not start:
// gorun went away or stopped the job while this agent waited (each rank
// reported as ended by the signal).
func (ag *agent) master(lines <-chan string, sigs <-chan os.Signal) (m map[string]string, ok bool) {
	env := ag.cfg.Environ
	needAddr := getenv(env, EnvMasterAddr) == masterAddrPlaceholder
	needPort := getenv(env, EnvMasterPort) == masterPortPlaceholder
	if !needAddr && !needPort {
		return nil, true
	}
	for _, ar := range ag.cfg.Ranks {
		if ar.Rank != 0 {
			continue
		}
		addr, port, warnings := pickMasterHere(env, needAddr, needPort)
		for _, w := range warnings {
			fmt.Fprintln(ag.stderr, "warning: "+w)
		}
		ag.out.line("master %s %s", addr, port)
		return map[string]string{EnvMasterAddr: addr, EnvMasterPort: port}, true
	}
	stopped := func(sig int) (map[string]string, bool) {
		for _, ar := range ag.cfg.Ranks {
			ag.out.line("signal %d %d", ar.Rank, sig)
		}
		return nil, false
	}
	for {
		select {
		case l, open := <-lines:
			if !open {
				return nil, false // gorun is gone
			}
			f := strings.Fields(l)
			switch {
			case len(f) == 3 && f[0] == "m":
				return map[string]string{EnvMasterAddr: f[1], EnvMasterPort: f[2]}, true
			case len(f) == 3 && f[0] == "s":
				if n, err := strconv.Atoi(f[2]); err == nil && n > 0 && n < 65 {
					return stopped(n)
				}
			}
		case s := <-sigs:
			sig, _ := s.(syscall.Signal)
			return stopped(int(sig))
		}
	}
}

// pickMasterHere picks, on rank 0's host, what MASTER_ADDR and MASTER_PORT
// need ("-" for what is not needed, or could not be picked, said in
// warnings): the address this host's ranks would bind (GORUN_IFACE's, or
// the one that routes to gorun's rendezvous, which the other hosts reach
// it by), and a free TCP port (PickMasterPort within GORUN_PORT_RANGE);
// env is the agent's environment, which says those.
func pickMasterHere(env []string, needAddr, needPort bool) (addr, port string, warnings []string) {
	addr, port = masterNone, masterNone
	host, _ := os.Hostname()
	if h := getenv(env, rank.EnvHost); h != "" {
		host = h
	}
	if needAddr {
		if a, err := masterAddrHere(env); err != nil {
			warnings = append(warnings, fmt.Sprintf("MASTER_ADDR on %s (rank 0's host): %v: the ranks get no MASTER_ADDR (torch.distributed's env:// needs it); set MASTER_ADDR", host, err))
		} else {
			addr = a
		}
	}
	if needPort {
		pr, err := rank.ParsePortRange(getenv(env, rank.EnvPortRange))
		var n int
		if err == nil {
			n, err = PickMasterPort(pr)
		}
		if err != nil {
			warnings = append(warnings, masterPortWarning(host, err))
		} else {
			port = strconv.Itoa(n)
		}
	}
	return addr, port, warnings
}

// masterAddrHere is the address of this host for MASTER_ADDR, by the
// agent's environment env (GORUN_RENDEZVOUS, GORUN_IFACE).
func masterAddrHere(env []string) (string, error) {
	rdv := getenv(env, rank.EnvRendezvous)
	rdvHost, _, err := net.SplitHostPort(rdv)
	if err != nil {
		return "", fmt.Errorf("%s=%q: %w", rank.EnvRendezvous, rdv, err)
	}
	route := func() (string, error) { return routeSource(rdvHost) }
	iface := getenv(env, rank.EnvIface)
	if iface == "" {
		addr, err := route()
		if err != nil {
			return "", fmt.Errorf("no route to gorun's rendezvous %s: %w", rdvHost, err)
		}
		return addr, nil
	}
	spec, err := rank.ParseIfaceSpec(iface)
	if err != nil {
		return "", fmt.Errorf("%s=%w", rank.EnvIface, err)
	}
	addr, err := spec.Resolve(route)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", rank.EnvIface, iface, err)
	}
	return addr, nil
}

// rankEnv is the agent's environment (environ) as rank ar sees it: the
// placeholders gorun left for the rank's own values (foreignPerRank) and
// for MASTER_ADDR and MASTER_PORT (master; masterNone: left out) filled in.
func rankEnv(environ []string, ar AgentRank, master map[string]string) []string {
	var env []string
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		switch local, perRank := foreignPerRank[k]; {
		case perRank && v == rankPlaceholder && !local:
			kv = k + "=" + strconv.Itoa(ar.Rank)
		case perRank && v == localRankPlaceholder && local:
			kv = k + "=" + strconv.Itoa(ar.Local)
		case k == EnvMasterAddr && v == masterAddrPlaceholder && master != nil,
			k == EnvMasterPort && v == masterPortPlaceholder && master != nil:
			if master[k] == masterNone {
				continue
			}
			kv = k + "=" + master[k]
		}
		env = append(env, kv)
	}
	return env
}

// start starts rank ar with its own variables and pumps its output to
// gorun; it reports a rank it cannot start to gorun and returns nil.
func (ag *agent) start(ar AgentRank, secret, host string, gpus int, master map[string]string) *agentRank {
	cfg, out := ag.cfg, ag.out
	a := &agentRank{AgentRank: ar, exited: make(chan struct{})}
	env := append(rankEnv(cfg.Environ, ar, master),
		rank.EnvRank+"="+strconv.Itoa(ar.Rank),
		rank.EnvLocalRank+"="+strconv.Itoa(ar.Local),
		EnvSignalNotices+"="+strconv.Itoa(noticeFD),
		rank.EnvSecret+"="+secret)
	if cfg.CUDALocal {
		env = append(env, "CUDA_VISIBLE_DEVICES="+visibleDevice(ar.Local, gpus))
	}
	cmd := exec.Command(cfg.Prog, cfg.Args...)
	cmd.Env = env
	cmd.SysProcAttr = procAttr(syscall.SIGKILL)
	noteR, noteW, err0 := noticePipe()
	outR, outW, err1 := os.Pipe()
	errR, errW, err2 := os.Pipe()
	if err0 != nil || err1 != nil || err2 != nil {
		out.line("error %d %v", ar.Rank, firstErr(err0, err1, err2))
		return nil
	}
	cmd.ExtraFiles = []*os.File{noteR} // fd 3 = noticeFD
	cmd.Stdout, cmd.Stderr = outW, errW
	var inR *os.File
	if ar.Rank == cfg.StdinRank {
		var err error
		if inR, a.stdin, err = os.Pipe(); err == nil {
			cmd.Stdin = inR
		}
	}
	err := cmd.Start()
	closeAll(noteR, outW, errW)
	if inR != nil {
		inR.Close()
	}
	if err != nil {
		closeAll(noteW, outR, errR)
		out.line("error %d cannot start %s on %s: %v", ar.Rank, cfg.Prog, host, unwrapExec(err))
		return nil
	}
	a.cmd, a.notices = cmd, noteW
	ag.rp.send("g", cmd.Process.Pid)
	out.line("started %d %d", ar.Rank, cmd.Process.Pid)
	for _, p := range []struct {
		r      *os.File
		stream byte
	}{{outR, 'o'}, {errR, 'e'}} {
		a.pumps.Add(1)
		go func(r *os.File, stream byte) {
			defer a.pumps.Done()
			defer r.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					out.data(stream, a.Rank, buf[:n])
				}
				if err != nil {
					return
				}
			}
		}(p.r, p.stream)
	}
	return a
}

// kill signals a's process group, after the signal's notice, unless a
// has exited.
func (ag *agent) kill(a *agentRank, sig syscall.Signal) {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	select {
	case <-a.exited:
	default:
		signalGroup(a.cmd.Process.Pid, a.notices, sig)
	}
}

// stopAll sends every rank sig now, and SIGKILL after the grace period.
func (ag *agent) stopAll(sig syscall.Signal) {
	for _, a := range ag.all {
		ag.kill(a, sig)
	}
	ag.stopOnce.Do(func() {
		time.AfterFunc(ag.cfg.Grace, func() {
			for _, a := range ag.all {
				ag.kill(a, syscall.SIGKILL)
			}
		})
	})
}

// control reads gorun's requests (signal a rank, its stdin, the end of its
// stdin) until gorun goes away, and then stops every rank.
func (ag *agent) control(lines <-chan string) {
	for {
		line, ok := <-lines
		if !ok {
			ag.stopAll(syscall.SIGTERM)
			for _, a := range ag.all {
				if a.stdin != nil {
					a.stdin.Close()
				}
			}
			return
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		r, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		switch {
		case f[0] == "s" && len(f) == 3:
			n, err := strconv.Atoi(f[2])
			if err != nil || n <= 0 || n >= 65 {
				continue
			}
			for _, a := range ag.all {
				if r == -1 || a.Rank == r {
					ag.kill(a, syscall.Signal(n))
				}
			}
		case f[0] == "i" && len(f) == 3:
			if a := ag.ranks[r]; a != nil && a.stdin != nil {
				if b, err := base64.StdEncoding.DecodeString(f[2]); err == nil {
					_, _ = a.stdin.Write(b)
				}
			}
		case f[0] == "e":
			if a := ag.ranks[r]; a != nil && a.stdin != nil {
				a.stdin.Close()
			}
		}
	}
}

// wait waits for a to end, kills what it left in its process group, and
// reports how it ended once its output has been pumped.
func (ag *agent) wait(a *agentRank) {
	_ = a.cmd.Wait()
	ag.mu.Lock()
	close(a.exited)
	// Nothing the rank left in its process group outlives it.
	_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
	a.notices.Close()
	ag.mu.Unlock()
	ag.rp.send("x", a.cmd.Process.Pid)
	done := make(chan struct{})
	go func() { a.pumps.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second): // a process outside the group holds the pipe
	}
	ws, _ := a.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		ag.out.line("signal %d %d", a.Rank, int(ws.Signal()))
	} else {
		ag.out.line("exit %d %d", a.Rank, ws.ExitStatus())
	}
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// unwrapExec shortens exec's "exec: \"x\": ..." errors.
func unwrapExec(err error) error {
	if e, ok := err.(*exec.Error); ok {
		return e.Err
	}
	if e, ok := err.(*os.PathError); ok {
		return e.Err
	}
	return err
}
