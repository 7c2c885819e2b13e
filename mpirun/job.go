package mpirun

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gorun/gorun/rank"
)

// Config is one gorun job: where to run, what to run, and how.
type Config struct {
	NP            int    // ranks; 0 = every slot of the hosts
	Hosts         []Host // nil = this machine, with NP slots (the CPU count if NP is 0)
	MapBy         string // MapBySlot (default) or MapByNode
	Oversubscribe bool   // allow more ranks than slots (up to max_slots)

	Program string   // run as given: a path, or a name looked up in PATH
	Args    []string // the program's arguments, untouched
	Export  []string // -x NAME or NAME=VALUE, exported to every rank
	Dir     string   // working directory of every rank (default: gorun's)

	SSH         string // ssh program (default "ssh")
	SSHPort     int
	SSHIdentity string
	SSHArgs     string // extra ssh arguments, split like a shell does
	LaunchAgent string // replaces ssh: invoked as LaunchAgent host remote-command
	RemoteGorun string // gorun on remote hosts (default: this executable's path)
	Reaper      string // gorun binary to run as the job's reaper ("" = none; see RunReaper)

	Iface          string // address or interface name for the rendezvous (and GORUN_IFACE)
	RendezvousAddr string // host[:port] to serve the rendezvous on; overrides Iface for it

	Tag       string        // TagRank (default), TagMPI or TagNone
	OutputDir string        // also write DIR/rank.N/stdout and stderr
	StdinRank int           // rank that gets gorun's stdin; -1 = none
	Grace     time.Duration // between SIGTERM and SIGKILL (default 5s)
	Timeout   time.Duration // whole-job limit (0 = none)
	DryRun    bool          // print placement and commands, start nothing
	Verbose   bool          // placement and lifecycle lines on stderr

	Stdin          io.Reader      // gorun's stdin (nil: none)
	Stdout, Stderr io.Writer      // gorun's stdout and stderr
	Signals        chan os.Signal // signals to forward to every rank (nil: none)
}

// Exit statuses of gorun besides a failed rank's own status (1..255, or
// 128+N when a rank died of signal N).
const (
	ExitUsage   = 2   // bad input found before anything started
	ExitSetup   = 1   // could not set the job up (rendezvous, output dir)
	ExitTimeout = 124 // --timeout expired
	ExitLaunch  = 255 // a remote rank could not be started (ssh, agent)
)

// UsageError is bad input, found before anything started.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

func usagef(format string, a ...any) error { return &UsageError{fmt.Sprintf(format, a...)} }

// rankSpec is everything needed to start one rank.
type rankSpec struct {
	slot   Slot
	remote bool
	env    []string // the variables gorun sets (local: added to its own environment)
	argv   []string // local: program and args; remote: launcher words, host, remote command
}

type plan struct {
	cfg      Config
	specs    []rankSpec
	rdvIP    string
	rdvPort  string
	secret   string
	jobID    string
	prog     string // local path of the program
	hosts    int
	stdinAll bool
}

// contractVars are set by gorun itself; -x may not override them.
var contractVars = []string{rank.EnvRank, rank.EnvSize, rank.EnvLocalRank, rank.EnvLocalSize, rank.EnvNodeRank,
	rank.EnvRendezvous, rank.EnvJobID, rank.EnvSecret, rank.EnvHost}

// tuningVars are forwarded from gorun's environment to every rank, remote
// ones included, because the mesh needs them equal everywhere.
var tuningVars = []string{rank.EnvTransport, rank.EnvConns, rank.EnvTimeout}

// Run runs the job and returns gorun's exit status. A non-nil error is a
// one-line message about bad input or setup, found before any rank started
// (the status is then ExitUsage or ExitSetup). Failures of ranks are
// reported on cfg.Stderr in one line and in the status.
func Run(cfg Config) (int, error) {
	p, err := prepare(cfg)
	if err != nil {
		var ue *UsageError
		if errors.As(err, &ue) {
			return ExitUsage, err
		}
		return ExitSetup, err
	}
	if cfg.DryRun {
		p.printDryRun()
		return 0, nil
	}
	return p.run()
}

func prepare(cfg Config) (*plan, error) {
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if cfg.Program == "" {
		return nil, usagef("no program to run (usage: gorun [flags] PROGRAM [ARGS...])")
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Timeout < 0 {
		return nil, usagef("--timeout %s is negative", cfg.Timeout)
	}
	switch cfg.Tag {
	case "":
		cfg.Tag = TagRank
	case TagRank, TagMPI, TagNone:
	default:
		return nil, usagef("output tag style %q: want rank, mpi or none", cfg.Tag)
	}
	if cfg.NP < 0 {
		return nil, usagef("-np %d: need at least 1 rank", cfg.NP)
	}
	hosts := cfg.Hosts
	if len(hosts) == 0 {
		n := cfg.NP
		if n == 0 {
			n = runtime.NumCPU()
		}
		hosts = []Host{{Name: "localhost", Slots: n, Where: "default"}}
	}
	hosts = mergeLocalHosts(hosts)
	np := cfg.NP
	if np == 0 {
		for _, h := range hosts {
			np += h.Slots
		}
	}
	slots, err := Place(hosts, np, cfg.MapBy, cfg.Oversubscribe)
	if err != nil {
		return nil, usagef("%v", err)
	}
	if cfg.StdinRank >= np {
		return nil, usagef("--stdin %d: the job has ranks 0..%d", cfg.StdinRank, np-1)
	}

	// Which hosts are this machine.
	local := map[string]bool{}
	var remoteHosts []string
	usedHosts := 0
	for _, s := range slots {
		if _, ok := local[s.Host]; ok {
			continue
		}
		usedHosts++
		local[s.Host] = IsLocalHost(s.Host)
		if !local[s.Host] {
			remoteHosts = append(remoteHosts, s.Host)
		}
	}

	exports, userCUDA, err := exportVars(cfg.Export)
	if err != nil {
		return nil, err
	}

	dir := cfg.Dir
	if dir == "" {
		if dir, err = os.Getwd(); err != nil {
			return nil, fmt.Errorf("cannot find the working directory: %v", err)
		}
	} else if len(remoteHosts) < len(local) { // some local rank: the directory must exist here
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return nil, usagef("working directory %s does not exist", dir)
		}
	}
	if !filepath.IsAbs(dir) {
		if dir, err = filepath.Abs(dir); err != nil {
			return nil, err
		}
	}

	// The program: checked here when any rank is local.
	prog, remoteProg := cfg.Program, cfg.Program
	if strings.Contains(cfg.Program, "/") {
		if !filepath.IsAbs(prog) {
			prog = filepath.Join(dir, prog)
		}
		remoteProg = prog
	}
	if len(remoteHosts) < len(local) {
		if prog, err = checkProgram(cfg.Program, prog); err != nil {
			return nil, err
		}
	}

	// How to reach remote hosts.
	var launcher []string
	agentPath := cfg.RemoteGorun
	if len(remoteHosts) > 0 {
		if launcher, err = launcherWords(cfg); err != nil {
			return nil, err
		}
		if agentPath == "" {
			if agentPath, err = os.Executable(); err != nil {
				return nil, fmt.Errorf("cannot find gorun's own path for the remote agent (give --remote-gorun): %v", err)
			}
		}
	}

	// Where the rendezvous is served.
	p := &plan{cfg: cfg, secret: rank.NewSecret(), jobID: rank.NewJobID(), prog: prog, hosts: usedHosts, rdvPort: "0"}
	ifaceEnv, ifaceLocalOnly := "", false
	switch {
	case cfg.RendezvousAddr != "":
		h, port, err := net.SplitHostPort(cfg.RendezvousAddr)
		if err != nil {
			h, port = cfg.RendezvousAddr, "0"
		}
		if ip := net.ParseIP(h); ip == nil || ip.IsUnspecified() {
			return nil, usagef("--rendezvous-addr %q: want an IP address the ranks can reach, optionally with :port", cfg.RendezvousAddr)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return nil, usagef("--rendezvous-addr %q: bad port", cfg.RendezvousAddr)
		}
		p.rdvIP, p.rdvPort = h, port
	case cfg.Iface != "":
		ip, isName, err := ifaceIP(cfg.Iface)
		if err != nil {
			return nil, usagef("%v", err)
		}
		p.rdvIP = ip
		ifaceEnv, ifaceLocalOnly = cfg.Iface, !isName
	default:
		var sshWords []string
		if cfg.LaunchAgent == "" {
			sshWords = launcher
		}
		p.rdvIP = rendezvousIP(remoteHosts, sshWords)
	}
	if cfg.Iface != "" && ifaceEnv == "" {
		if _, isName, err := ifaceIP(cfg.Iface); err == nil {
			ifaceEnv, ifaceLocalOnly = cfg.Iface, !isName
		} else {
			return nil, usagef("%v", err)
		}
	}

	// The environment and command of every rank.
	for _, s := range slots {
		sp := rankSpec{slot: s, remote: !local[s.Host]}
		env := append([]string(nil), exports...)
		if sp.remote {
			for _, k := range tuningVars {
				if v, ok := os.LookupEnv(k); ok && !hasVar(exports, k) {
					env = append(env, k+"="+v)
				}
			}
			if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok && !userCUDA {
				env = append(env, "CUDA_VISIBLE_DEVICES="+v)
			}
		}
		if ifaceEnv != "" && (!sp.remote || !ifaceLocalOnly) && !hasVar(exports, rank.EnvIface) {
			env = append(env, rank.EnvIface+"="+ifaceEnv)
		}
		env = append(env,
			rank.EnvRank+"="+strconv.Itoa(s.Rank),
			rank.EnvSize+"="+strconv.Itoa(np),
			rank.EnvLocalRank+"="+strconv.Itoa(s.LocalRank),
			rank.EnvLocalSize+"="+strconv.Itoa(s.LocalSize),
			rank.EnvNodeRank+"="+strconv.Itoa(s.NodeRank),
			rank.EnvRendezvous+"="+net.JoinHostPort(p.rdvIP, rdvPortPlaceholder),
			rank.EnvJobID+"="+p.jobID,
			rank.EnvHost+"="+s.Host,
		)
		_, inherited := os.LookupEnv("CUDA_VISIBLE_DEVICES")
		if !userCUDA && !inherited {
			env = append(env, "CUDA_VISIBLE_DEVICES="+strconv.Itoa(s.LocalRank))
		}
		sp.env = env
		if sp.remote {
			agent := []string{agentPath, "--" + AgentFlag, "--grace", cfg.Grace.String()}
			if s.Rank == cfg.StdinRank && cfg.Stdin != nil {
				agent = append(agent, "--agent-stdin")
			}
			agent = append(agent, "--", remoteProg)
			agent = append(agent, cfg.Args...)
			words := append([]string{"exec", "env"}, env...)
			words = append(words, agent...)
			remoteCmd := "cd " + shellQuote(dir) + " && " + shellJoin(words)
			sp.argv = append(append(append([]string(nil), launcher...), s.Host), remoteCmd)
		} else {
			sp.argv = append([]string{prog}, cfg.Args...)
		}
		p.specs = append(p.specs, sp)
	}
	p.cfg.Dir = dir
	return p, nil
}

// mergeLocalHosts folds every name of this machine (localhost, 127.0.0.1,
// its host name...) into the first one listed, so that local ranks, and
// CUDA_VISIBLE_DEVICES, count over the whole machine.
func mergeLocalHosts(hosts []Host) []Host {
	out := make([]Host, 0, len(hosts))
	first := -1
	for _, h := range hosts {
		if IsLocalHost(h.Name) {
			if first >= 0 {
				f := &out[first]
				f.Slots = min(f.Slots+h.Slots, maxCount)
				if f.MaxSlots == 0 || h.MaxSlots == 0 {
					f.MaxSlots = 0
				} else {
					f.MaxSlots = min(f.MaxSlots+h.MaxSlots, maxCount)
				}
				continue
			}
			first = len(out)
		}
		out = append(out, h)
	}
	return out
}

// rdvPortPlaceholder stands for the rendezvous port in commands built
// before the port is known; run() fills it in.
const rdvPortPlaceholder = "<port>"

func hasVar(env []string, name string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			return true
		}
	}
	return false
}

// exportVars resolves -x NAME[=VALUE] into NAME=VALUE pairs.
func exportVars(xs []string) (env []string, cuda bool, err error) {
	seen := map[string]bool{}
	for _, x := range xs {
		name, val, hasVal := strings.Cut(x, "=")
		if !validEnvName(name) {
			return nil, false, usagef("-x %q: %q is not a valid environment variable name", x, name)
		}
		for _, c := range contractVars {
			if name == c {
				return nil, false, usagef("-x %s: gorun sets %s itself for every rank", name, name)
			}
		}
		if !hasVal {
			v, ok := os.LookupEnv(name)
			if !ok {
				return nil, false, usagef("-x %s: %s is not set in gorun's environment (use -x %s=VALUE)", name, name, name)
			}
			val = v
		}
		if seen[name] {
			return nil, false, usagef("-x %s given twice", name)
		}
		seen[name] = true
		if name == "CUDA_VISIBLE_DEVICES" {
			cuda = true
		}
		env = append(env, name+"="+val)
	}
	return env, cuda, nil
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// checkProgram makes sure a local rank can exec the program and returns
// the path to exec.
func checkProgram(given, path string) (string, error) {
	if !strings.Contains(given, "/") {
		p, err := exec.LookPath(given)
		if err != nil {
			if st, err := os.Stat(given); err == nil && !st.IsDir() {
				return "", usagef("program %q not found in PATH (did you mean ./%s?)", given, given)
			}
			return "", usagef("program %q not found in PATH", given)
		}
		if !filepath.IsAbs(p) {
			p, _ = filepath.Abs(p)
		}
		return p, nil
	}
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", usagef("program %s: no such file", given)
	case err != nil:
		return "", usagef("program %s: %v", given, unwrapExec(err))
	case st.IsDir():
		return "", usagef("program %s is a directory", given)
	case st.Mode()&0o111 == 0:
		return "", usagef("program %s is not executable (chmod +x it)", given)
	}
	if err := syscall.Access(path, 1 /* X_OK */); err != nil {
		return "", usagef("program %s is not executable by this user: %v", given, err)
	}
	return path, nil
}

func launcherWords(cfg Config) ([]string, error) {
	if cfg.LaunchAgent != "" {
		w, err := splitWords(cfg.LaunchAgent)
		if err != nil || len(w) == 0 {
			return nil, usagef("--launch-agent %q: not a command", cfg.LaunchAgent)
		}
		return w, nil
	}
	ssh := cfg.SSH
	if ssh == "" {
		ssh = "ssh"
	}
	words := []string{ssh}
	user, err := splitWords(cfg.SSHArgs)
	if err != nil {
		return nil, usagef("--ssh-args: %v", err)
	}
	// ssh keeps the first value it sees for an option: the user's come first.
	words = append(words, user...)
	words = append(words, "-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
	if cfg.SSHPort != 0 {
		if cfg.SSHPort < 0 || cfg.SSHPort > 65535 {
			return nil, usagef("--ssh-port %d: not a port", cfg.SSHPort)
		}
		words = append(words, "-p", strconv.Itoa(cfg.SSHPort))
	}
	if cfg.SSHIdentity != "" {
		words = append(words, "-i", cfg.SSHIdentity)
	}
	return words, nil
}

// commandLine renders one rank's command for --dry-run and -v, with the
// secret redacted.
func (p *plan) commandLine(sp rankSpec, port string) string {
	fill := func(s string) string { return strings.ReplaceAll(s, rdvPortPlaceholder, port) }
	if sp.remote {
		w := make([]string, len(sp.argv))
		for i, a := range sp.argv {
			w[i] = fill(a)
		}
		return shellJoin(w) + "   # job secret on stdin"
	}
	words := []string{"env"}
	for _, kv := range sp.env {
		words = append(words, fill(kv))
	}
	words = append(words, rank.EnvSecret+"=<redacted>")
	words = append(words, sp.argv...)
	return "cd " + shellQuote(p.cfg.Dir) + " && " + shellJoin(words)
}

func (p *plan) printDryRun() {
	w := p.cfg.Stdout
	fmt.Fprintf(w, "gorun: dry run: %s on %s, job %s, rendezvous %s\n",
		plural(len(p.specs), "rank"), plural(p.hosts, "host"), p.jobID, net.JoinHostPort(p.rdvIP, p.displayPort()))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RANK\tHOST\tLOCAL RANK\tLOCAL SIZE\tNODE RANK\tSTART")
	for _, sp := range p.specs {
		how := "exec"
		if sp.remote {
			how = p.launcherName()
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%s\n", sp.slot.Rank, sp.slot.Host, sp.slot.LocalRank, sp.slot.LocalSize, sp.slot.NodeRank, how)
	}
	tw.Flush()
	for _, sp := range p.specs {
		fmt.Fprintf(w, "[%d] %s\n", sp.slot.Rank, p.commandLine(sp, p.displayPort()))
	}
}

func (p *plan) displayPort() string {
	if p.rdvPort == "0" {
		return rdvPortPlaceholder
	}
	return p.rdvPort
}

func (p *plan) launcherName() string {
	if p.cfg.LaunchAgent != "" {
		return "launch-agent"
	}
	return "ssh"
}

// proc is one started rank.
type proc struct {
	spec   rankSpec
	cmd    *exec.Cmd
	pid    int
	ctl    *control // remote: the agent's control channel
	reaper *reaper
	files  []*os.File
	pumps  sync.WaitGroup

	mu       sync.Mutex // agent reports, written by the stderr pump
	started  bool
	agentPid int
	agentSig int
	agentErr string
	held     [][]byte
}

type outcome struct {
	p     *proc
	state *os.ProcessState
	err   error
}

func (p *plan) run() (int, error) {
	cfg := p.cfg
	secretBytes, _ := hex.DecodeString(p.secret)
	rdv, err := rank.ListenRendezvous(net.JoinHostPort(p.rdvIP, p.rdvPort), len(p.specs), secretBytes)
	if err != nil {
		return ExitSetup, err
	}
	defer rdv.Close()
	_, port, _ := net.SplitHostPort(rdv.Addr())
	p.rdvPort = port

	stdout, stderr := &sink{w: cfg.Stdout}, &sink{w: cfg.Stderr}
	if cfg.OutputDir != "" {
		for _, sp := range p.specs {
			if err := os.MkdirAll(filepath.Join(cfg.OutputDir, fmt.Sprintf("rank.%d", sp.slot.Rank)), 0o755); err != nil {
				return ExitSetup, fmt.Errorf("--output-dir: %v", err)
			}
		}
	}
	if cfg.Verbose {
		fmt.Fprintf(cfg.Stderr, "gorun: job %s: %s on %s, rendezvous %s\n", p.jobID, plural(len(p.specs), "rank"), plural(p.hosts, "host"), rdv.Addr())
		for _, sp := range p.specs {
			fmt.Fprintf(cfg.Stderr, "gorun: [%d] %s\n", sp.slot.Rank, p.commandLine(sp, port))
		}
	}

	var rp *reaper
	if cfg.Reaper != "" {
		if rp, err = startReaper(cfg.Reaper, cfg.Grace); err != nil {
			return ExitSetup, fmt.Errorf("cannot start the reaper %s: %v", cfg.Reaper, err)
		}
		defer rp.done()
	}
	results := make(chan outcome, len(p.specs))
	var procs []*proc
	for _, sp := range p.specs {
		pr, err := p.start(sp, port, stdout, stderr)
		if err == nil {
			pr.reaper = rp
			rp.send("g", pr.pid)
		}
		if err != nil {
			// Stop what already runs, then report.
			for _, q := range procs {
				q.signal(syscall.SIGKILL)
			}
			for range procs {
				<-results
			}
			return ExitSetup, err
		}
		procs = append(procs, pr)
		go pr.wait(results)
	}

	// The lifecycle: the first failure (or a signal, or the timeout) stops
	// everyone: SIGTERM (or the signal received), SIGKILL after the grace.
	status, stopping := 0, false
	var grace, hard <-chan time.Time
	var timeout <-chan time.Time
	if cfg.Timeout > 0 {
		t := time.NewTimer(cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	done := map[*proc]bool{}
	stopAll := func(sig syscall.Signal) {
		for _, q := range procs {
			if !done[q] {
				q.signal(sig)
			}
		}
		if !stopping {
			stopping = true
			grace = time.After(cfg.Grace)
		}
	}
	for len(done) < len(procs) {
		select {
		case r := <-results:
			done[r.p] = true
			if stopping {
				continue
			}
			if code, msg := r.p.describe(r); code != 0 {
				fmt.Fprintln(cfg.Stderr, "gorun: "+msg)
				status = code
				stopAll(syscall.SIGTERM)
			}
		case s := <-cfg.Signals:
			sig, _ := s.(syscall.Signal)
			if sig == 0 {
				sig = syscall.SIGTERM
			}
			if stopping {
				if cfg.Verbose {
					fmt.Fprintf(cfg.Stderr, "gorun: %v again: killing every rank\n", sig)
				}
				stopAll(syscall.SIGKILL)
				continue
			}
			if cfg.Verbose {
				fmt.Fprintf(cfg.Stderr, "gorun: %v: forwarded to every rank; SIGKILL in %s\n", sig, cfg.Grace)
			}
			status = 128 + int(sig)
			stopAll(sig)
		case <-timeout:
			if !stopping {
				fmt.Fprintf(cfg.Stderr, "gorun: job timed out after %s (--timeout); stopping %d ranks\n", cfg.Timeout, len(procs)-len(done))
				status = ExitTimeout
				stopAll(syscall.SIGTERM)
			}
		case <-grace:
			if cfg.Verbose {
				fmt.Fprintf(cfg.Stderr, "gorun: %d ranks still running %s after SIGTERM: SIGKILL\n", len(procs)-len(done), cfg.Grace)
			}
			stopAll(syscall.SIGKILL)
			hard = time.After(2 * time.Second)
		case <-hard:
			for _, q := range procs {
				if !done[q] {
					q.killLocal()
				}
			}
		}
	}
	return status, nil
}

// start starts one rank: by exec here, or through ssh / the launch agent.
func (p *plan) start(sp rankSpec, port string, stdout, stderr *sink) (*proc, error) {
	cfg := p.cfg
	pr := &proc{spec: sp}
	fill := func(s string) string { return strings.ReplaceAll(s, rdvPortPlaceholder, port) }
	argv := make([]string, len(sp.argv))
	for i, a := range sp.argv {
		argv[i] = fill(a)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	if !sp.remote {
		cmd.Dir = cfg.Dir // remote ranks cd there on their host
	}
	if sp.remote {
		cmd.SysProcAttr = procAttr(syscall.SIGTERM)
	} else {
		cmd.SysProcAttr = procAttr(syscall.SIGKILL)
	}
	base := cleanEnviron()
	if sp.remote {
		cmd.Env = base // ssh's own environment; the rank's is in the remote command
	} else {
		env := base
		for _, kv := range sp.env {
			env = append(env, fill(kv))
		}
		cmd.Env = append(env, rank.EnvSecret+"="+p.secret)
	}
	r := sp.slot.Rank
	var outFile, errFile io.Writer
	if cfg.OutputDir != "" {
		d := filepath.Join(cfg.OutputDir, fmt.Sprintf("rank.%d", r))
		of, err := os.Create(filepath.Join(d, "stdout"))
		if err != nil {
			return nil, fmt.Errorf("--output-dir: %v", err)
		}
		ef, err := os.Create(filepath.Join(d, "stderr"))
		if err != nil {
			of.Close()
			return nil, fmt.Errorf("--output-dir: %v", err)
		}
		pr.files = append(pr.files, of, ef)
		outFile, errFile = of, ef
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	to := &tagger{out: stdout, prefix: tagPrefix(cfg.Tag, r, "stdout"), file: outFile}
	te := &tagger{out: stderr, prefix: tagPrefix(cfg.Tag, r, "stderr"), file: errFile}

	var stdinW *os.File
	wantStdin := r == cfg.StdinRank && cfg.Stdin != nil
	if sp.remote {
		ctlR, ctlW, err := os.Pipe()
		if err != nil {
			closeAll(outR, outW, errR, errW)
			return nil, err
		}
		cmd.Stdin = ctlR
		defer ctlR.Close()
		pr.ctl = newControl(ctlW)
		pr.ctl.send(p.secret)
		te.control = pr.agentLine(te)
	} else if wantStdin {
		sr, sw, err := os.Pipe()
		if err != nil {
			closeAll(outR, outW, errR, errW)
			return nil, err
		}
		cmd.Stdin, stdinW = sr, sw
		defer sr.Close()
	}
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		closeAll(outR, errR)
		if stdinW != nil {
			stdinW.Close()
		}
		if pr.ctl != nil {
			pr.ctl.close()
		}
		for _, f := range pr.files {
			f.Close()
		}
		if sp.remote {
			return nil, fmt.Errorf("cannot start %s for rank %d on host %s: %v", argv[0], r, sp.slot.Host, unwrapExec(err))
		}
		return nil, fmt.Errorf("cannot start rank %d (%s): %v", r, argv[0], unwrapExec(err))
	}
	pr.cmd, pr.pid = cmd, cmd.Process.Pid
	pr.pumps.Add(2)
	go func() { defer pr.pumps.Done(); to.pump(outR); outR.Close() }()
	go func() { defer pr.pumps.Done(); te.pump(errR); errR.Close() }()
	if wantStdin {
		if sp.remote {
			go pr.ctl.forwardStdin(cfg.Stdin)
		} else {
			go func() { _, _ = io.Copy(stdinW, cfg.Stdin); stdinW.Close() }()
		}
	}
	return pr, nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// cleanEnviron is gorun's environment without the rank contract of an
// enclosing job.
func cleanEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		skip := false
		for _, c := range contractVars {
			if k == c {
				skip = true
			}
		}
		if !skip {
			env = append(env, kv)
		}
	}
	return env
}

// agentLine handles the remote agent's report lines on the rank's stderr.
// Lines before "started" are held back: if the start fails, the last of
// them (ssh's complaint) goes into gorun's one-line message.
func (pr *proc) agentLine(te *tagger) func([]byte) bool {
	return func(line []byte) bool {
		s := string(line)
		pr.mu.Lock()
		defer pr.mu.Unlock()
		if rest, ok := strings.CutPrefix(s, agentMark); ok {
			op, arg, _ := strings.Cut(strings.TrimSpace(rest), " ")
			switch op {
			case "started":
				pr.started = true
				pr.agentPid, _ = strconv.Atoi(arg)
				held := pr.held
				pr.held = nil
				for _, h := range held {
					if te.file != nil {
						_, _ = te.file.Write(h)
					}
					te.out.writeLine(append([]byte(te.prefix), h...))
				}
			case "signal":
				pr.agentSig, _ = strconv.Atoi(arg)
			case "error":
				pr.agentErr = arg
			}
			return true
		}
		if pr.started {
			return false
		}
		if len(pr.held) == 32 {
			pr.held = pr.held[1:]
		}
		pr.held = append(pr.held, append([]byte(nil), line...))
		return true
	}
}

func (pr *proc) wait(results chan<- outcome) {
	err := pr.cmd.Wait()
	// Whatever the rank left in its process group goes with it.
	_ = syscall.Kill(-pr.pid, syscall.SIGKILL)
	pr.reaper.send("x", pr.pid) // its group id may be reused now
	if pr.ctl != nil {
		pr.ctl.close()
	}
	ch := make(chan struct{})
	go func() { pr.pumps.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(2 * time.Second): // a process outside the group holds the pipe
	}
	for _, f := range pr.files {
		f.Close()
	}
	results <- outcome{p: pr, state: pr.cmd.ProcessState, err: err}
}

// describe says how a rank ended: status 0 and "" for success, else gorun's
// exit status and its one-line message.
func (pr *proc) describe(r outcome) (int, string) {
	s := pr.spec.slot
	pr.mu.Lock()
	started, agentPid, agentSig, agentErr := pr.started, pr.agentPid, pr.agentSig, pr.agentErr
	var last string
	if len(pr.held) > 0 {
		last = strings.TrimSpace(string(pr.held[len(pr.held)-1]))
	}
	pr.mu.Unlock()
	st := r.state
	if st == nil {
		return ExitSetup, fmt.Sprintf("rank %d (host %s): %v", s.Rank, s.Host, r.err)
	}
	ws, _ := st.Sys().(syscall.WaitStatus)
	if pr.spec.remote {
		if !started || (agentErr != "" && agentSig == 0) {
			why := agentErr
			if why == "" {
				why = last
			}
			if why == "" {
				if ws.Signaled() {
					why = fmt.Sprintf("%s killed by signal %d (%v)", pr.cmd.Path, int(ws.Signal()), ws.Signal())
				} else {
					why = fmt.Sprintf("%s exited with status %d before the remote agent started", filepath.Base(pr.cmd.Path), ws.ExitStatus())
				}
			}
			return ExitLaunch, fmt.Sprintf("cannot start rank %d on host %s: %s", s.Rank, s.Host, why)
		}
		where := fmt.Sprintf("rank %d (host %s, pid %d)", s.Rank, s.Host, agentPid)
		switch {
		case agentSig > 0:
			return 128 + agentSig, fmt.Sprintf("%s killed by signal %d (%v)", where, agentSig, syscall.Signal(agentSig))
		case ws.Signaled():
			return 128 + int(ws.Signal()), fmt.Sprintf("%s: lost: %s killed by signal %d (%v)", where, filepath.Base(pr.cmd.Path), int(ws.Signal()), ws.Signal())
		case ws.ExitStatus() != 0:
			return ws.ExitStatus(), fmt.Sprintf("%s exited with status %d", where, ws.ExitStatus())
		}
		return 0, ""
	}
	where := fmt.Sprintf("rank %d (host %s, pid %d)", s.Rank, s.Host, pr.pid)
	switch {
	case ws.Signaled():
		return 128 + int(ws.Signal()), fmt.Sprintf("%s killed by signal %d (%v)", where, int(ws.Signal()), ws.Signal())
	case ws.ExitStatus() != 0:
		return ws.ExitStatus(), fmt.Sprintf("%s exited with status %d", where, ws.ExitStatus())
	}
	return 0, ""
}

// signal sends sig to the rank: to its process group here, or through the
// agent's control channel (SIGKILL also ends the channel, which makes the
// agent kill the rank even if the line is lost).
func (pr *proc) signal(sig syscall.Signal) {
	if pr.ctl == nil {
		_ = syscall.Kill(-pr.pid, sig)
		return
	}
	pr.ctl.send("s " + strconv.Itoa(int(sig)))
	if sig == syscall.SIGKILL {
		pr.ctl.close()
	} else if !pr.isStarted() {
		// ssh has not started the agent yet (or never will): stop ssh.
		_ = syscall.Kill(-pr.pid, sig)
	}
}

func (pr *proc) isStarted() bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.started
}

// killLocal kills the local side of a remote rank (ssh or the launch agent).
func (pr *proc) killLocal() { _ = syscall.Kill(-pr.pid, syscall.SIGKILL) }

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

func (c *control) forwardStdin(r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			c.send("i " + base64.StdEncoding.EncodeToString(buf[:n]))
		}
		if err != nil {
			c.send("e")
			return
		}
		select {
		case <-c.done:
			return
		default:
		}
	}
}

// DefaultGrace is the time between SIGTERM and SIGKILL when a job stops.
const DefaultGrace = 5 * time.Second

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
