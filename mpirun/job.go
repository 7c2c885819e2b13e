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
	"sort"
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
	PerNode       int    // -N: exactly this many ranks on every host (0: by slots)

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

	// Iface is --iface: an address, an interface name or a list of them
	// (rank.IfaceSpec) for the rendezvous and GORUN_IFACE. Without it, the
	// interface parameters of MCA and the variables IfaceVars (from Export
	// or IfaceVars) choose, with a line that says so.
	Iface          string
	RendezvousAddr string // host[:port] to serve the rendezvous on; overrides Iface for it
	// MCA is every --mca KEY VALUE given: the interface ones choose the
	// interface (iface.go), the others are dropped with a note.
	MCA []MCAParam
	// IfaceVars holds those of IfaceVars (NCCL_SOCKET_IFNAME, ...) that are
	// set in gorun's environment.
	IfaceVars map[string]string
	// PortRange pins every port the job listens on: the rendezvous's
	// (unless RendezvousAddr names a port) and each rank's UDP and TCP
	// ports, which the ranks take from GORUN_PORT_RANGE. Zero: any free
	// port.
	PortRange rank.PortRange
	BindTo    string // --bind-to: gorun binds nothing; any value but "none" gets a note

	Tag       string        // TagRank (default), TagMPI or TagNone
	OutputDir string        // also write DIR/rank.N/stdout and stderr
	StdinRank int           // rank that gets gorun's stdin; -1 = none
	Grace     time.Duration // between SIGTERM and SIGKILL (default DefaultGrace)
	Timeout   time.Duration // whole-job limit (0 = none)
	// MaxRestarts: when a rank fails, stop the job as always, then start
	// it again, up to this many times (torchrun's --max-restarts); each
	// start tells the ranks its number in GORUN_RESTART. A signal to
	// gorun or --timeout ends the job without a restart.
	MaxRestarts int
	DryRun      bool // print placement and commands, start nothing
	Verbose     bool // placement and lifecycle lines on stderr
	// DisplayMap prints the placement as OpenMPI's JOB MAP before the
	// start; ReportBindings prints, as each rank starts, OpenMPI's line
	// for a rank that is not bound.
	DisplayMap, ReportBindings bool

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
	// ExitKilled: a job stopped by a signal to gorun (or by its output's
	// reader going away) in which gorun had to kill a rank with SIGKILL
	// (--grace ran out, or a second signal): 128+9, as a killed process.
	// It differs from the clean stop's 128+N, so that a script can tell a
	// rank's stop (nmt-train's checkpoint) may not have finished.
	ExitKilled = 128 + 9
	// ExitBrokenPipe: gorun's stdout or stderr was a pipe whose reader
	// exited (`gorun ... | head`): gorun stopped the job as for SIGTERM
	// and exits as a pipeline's writer killed by SIGPIPE would.
	ExitBrokenPipe = 128 + 13
)

// UsageError is bad input, found before anything started.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

func usagef(format string, a ...any) error { return &UsageError{fmt.Sprintf(format, a...)} }

// rankSpec is everything needed to start one rank.
type rankSpec struct {
	slot   Slot
	remote bool
	env    []string // local: the variables gorun adds to its own environment
	argv   []string // local: program and args
}

// hostSpec is one remote host: one ssh (or launch agent) runs gorun's
// remote agent there, which starts all of the host's ranks.
type hostSpec struct {
	name  string
	ranks []int    // indexes in plan.specs
	argv  []string // launcher words, host, remote command
}

type plan struct {
	cfg      Config
	notes    []string // gorun's one-line notes about the flags, said once before the start
	hostList []Host   // the hosts that got ranks, in node-rank order
	specs    []rankSpec
	remote   []*hostSpec
	rdvIP    string
	rdvPort  string
	secret   string
	jobID    string
	prog     string // local path of the program
	rprog    string // the program as remote agents run it
	cudaRank bool   // CUDA_VISIBLE_DEVICES = local rank
	hosts    int
	restart  int           // the number of this start (GORUN_RESTART)
	cause    string        // the failure that caused this start (GORUN_RESTART_CAUSE)
	failure  string        // set by run: the failure of a rank that stopped the job
	pl       *progressLine // gorun's stdout is a terminal (nil: it is not)
	plErr    bool          // gorun's stderr is the same terminal

	// The variables of torchrun and OpenMPI (ForeignVars) that gorun
	// sets; the others the user set. userMaster: MASTER_ADDR and
	// MASTER_PORT as set in gorun's environment, for the remote ranks.
	foreign    map[string]bool
	userMaster []string
	// rank0Local: rank 0 runs on this machine, so gorun picks MASTER_PORT
	// (and MASTER_ADDR is the rendezvous address); otherwise the agent on
	// rank 0's host picks them and says so (agent.go), and gorun passes
	// them on before the other ranks start. masterAddr, masterPort: this
	// start's values, once known ("" before).
	rank0Local             bool
	masterAddr, masterPort string
}

// contractVars are set by gorun itself; -x may not override them.
var contractVars = []string{rank.EnvRank, rank.EnvSize, rank.EnvLocalRank, rank.EnvLocalSize, rank.EnvNodeRank,
	rank.EnvRendezvous, rank.EnvJobID, rank.EnvSecret, rank.EnvHost, rank.EnvRestart, rank.EnvRestartCause, EnvProgressLine, EnvSignalNotices}

// tuningVars are forwarded from gorun's environment to every rank, remote
// ones included, because the mesh needs them equal everywhere (the TCP
// cipher need not be, but whoever sets it means the whole job).
var tuningVars = []string{rank.EnvTransport, rank.EnvConns, rank.EnvTimeout, rank.EnvTCPCipher, rank.EnvQUICGRO}

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
	for _, n := range p.notes {
		fmt.Fprintln(p.cfg.Stderr, "gorun: "+n)
	}
	if cfg.DisplayMap {
		p.printMap(p.cfg.Stdout)
	}
	if cfg.DryRun {
		p.printDryRun()
		return 0, nil
	}
	for {
		status, err := p.run()
		if err != nil || p.failure == "" || p.restart >= cfg.MaxRestarts {
			return status, err
		}
		p.restart, p.cause = p.restart+1, p.failure
		fmt.Fprintf(cfg.Stderr, "gorun: restarting the job (restart %d of %d, GORUN_RESTART=%d) after: %s\n", p.restart, cfg.MaxRestarts, p.restart, p.failure)
	}
}

// prepare checks cfg and works out the job: where every rank runs, with
// which environment and command, and how each remote host is reached. It
// starts nothing.
func prepare(cfg Config) (*plan, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	ompiNotes, err := cfg.fromOMPIEnv()
	if err != nil {
		return nil, err
	}
	slots, hostList, err := placeRanks(cfg)
	if err != nil {
		return nil, err
	}
	np := len(slots)
	// Which hosts are this machine.
	local := map[string]bool{}
	var remoteHosts []string
	for _, s := range slots {
		if _, ok := local[s.Host]; ok {
			continue
		}
		local[s.Host] = IsLocalHost(s.Host)
		if !local[s.Host] {
			remoteHosts = append(remoteHosts, s.Host)
		}
	}
	anyLocal := len(remoteHosts) < len(local)
	exports, userCUDA, unset, err := exportVars(cfg.Export)
	if err != nil {
		return nil, err
	}
	dir, prog, remoteProg, err := locateProgram(cfg, anyLocal)
	if err != nil {
		return nil, err
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
	p := &plan{cfg: cfg, secret: rank.NewSecret(), jobID: rank.NewJobID(), prog: prog, hosts: len(local), rdvPort: "0", hostList: hostList}
	p.pl, p.plErr = newProgressLine(cfg.Stdout, cfg.Stderr)
	p.notes = append(p.notes, ompiNotes...)
	for _, m := range cfg.MCA {
		if !isIfaceMCA(m.Key) {
			p.notes = append(p.notes, fmt.Sprintf("%s ignored: it sets an OpenMPI parameter, and gorun is not OpenMPI", m))
		}
	}
	if b := cfg.BindTo; b != "" && b != "none" {
		// placement on cores is the kernel's (mpirun's --bind-to none);
		// a program sizes its own threads (nmt-train --threads)
		p.notes = append(p.notes, fmt.Sprintf("--bind-to %s: gorun does not bind ranks to cores (as --bind-to none); each rank sizes its own threads (nmt-train --threads)", b))
	}
	for _, name := range unset {
		// mpirun's own words: "Warning: could not find environment variable"
		p.notes = append(p.notes, fmt.Sprintf("warning: -x %s: %s is not set in gorun's environment, so the ranks do not get it (mpirun warns and goes on too)", name, name))
	}
	iface, err := p.chooseRendezvous(remoteHosts, launcher, exports)
	if err != nil {
		return nil, err
	}
	p.rank0Local = local[slots[0].Host]
	p.chooseForeign(exports)
	if err := p.checkPortRange(slots, local); err != nil {
		return nil, err
	}
	// The environment and command of every rank, and of every remote host.
	_, inheritedCUDA := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	cudaLocal := !userCUDA && !inheritedCUDA
	p.rprog, p.cudaRank = remoteProg, cudaLocal
	localGPUs := HostGPUs()
	hostIndex := map[string]int{}
	for _, s := range slots {
		sp := rankSpec{slot: s, remote: !local[s.Host]}
		if !sp.remote {
			sp.env = p.localEnv(s, np, exports, iface, cudaLocal, localGPUs)
			sp.argv = append([]string{prog}, cfg.Args...)
		} else {
			hi, ok := hostIndex[s.Host]
			if !ok {
				hi = len(p.remote)
				hostIndex[s.Host] = hi
				p.remote = append(p.remote, &hostSpec{name: s.Host})
			}
			p.remote[hi].ranks = append(p.remote[hi].ranks, s.Rank)
		}
		p.specs = append(p.specs, sp)
	}
	for _, hs := range p.remote {
		env := p.remoteEnv(hs, np, exports, iface, userCUDA)
		hs.argv = append(append(append([]string(nil), launcher...), hs.name), p.remoteCommand(hs, env, agentPath, dir, cudaLocal))
	}
	p.cfg.Dir = dir
	return p, nil
}

// check fills in cfg's defaults and refuses flags that make no sense.
func (cfg *Config) check() error {
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if cfg.Program == "" {
		return usagef("no program to run (usage: gorun [flags] PROGRAM [ARGS...])")
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Timeout < 0 {
		return usagef("--timeout %s is negative", cfg.Timeout)
	}
	switch cfg.Tag {
	case "":
		cfg.Tag = TagRank
	case TagRank, TagMPI, TagNone:
	default:
		return usagef("output tag style %q: want rank, mpi or none", cfg.Tag)
	}
	if cfg.NP < 0 {
		return usagef("-np %d: need at least 1 rank", cfg.NP)
	}
	if cfg.PerNode < 0 {
		return usagef("-N %d: need at least 1 rank per host", cfg.PerNode)
	}
	if n, ok, err := mapByPPR(cfg.MapBy); err != nil {
		return err
	} else if ok {
		// OpenMPI's ppr:N:node is -N N, its ranks filling each node in turn
		if cfg.PerNode != 0 && cfg.PerNode != n {
			return usagef("--map-by %s and -N %d disagree: give one of them", cfg.MapBy, cfg.PerNode)
		}
		cfg.PerNode, cfg.MapBy = n, MapBySlot
	}
	return nil
}

// OpenMPI's MCA parameters in the environment that concern the launcher.
// Kubeflow's MPIJob sets the first and third on its launcher pod (with
// OMPI_MCA_orte_keep_fqdn_hostnames, which gorun's habit already is: host
// names are used as written), its v1 API the second, a kubexec.sh script
// called as "kubexec.sh POD COMMAND", gorun's --launch-agent convention.
const (
	EnvOMPIHostfile = "OMPI_MCA_orte_default_hostfile"
	EnvOMPIRSHAgent = "OMPI_MCA_plm_rsh_agent"
	EnvOMPIRSHArgs  = "OMPI_MCA_plm_rsh_args"
)

// fromOMPIEnv takes what OpenMPI's mpirun would take from its MCA
// parameters in the environment, where the command line says nothing:
// the hosts from OMPI_MCA_orte_default_hostfile, the launch agent from
// OMPI_MCA_plm_rsh_agent (OpenMPI's default "ssh : rsh" is ssh), and more
// ssh arguments from OMPI_MCA_plm_rsh_args, after --ssh-args (ssh keeps
// the first value of an option, so the command line's win). It returns
// gorun's notes on what it took.
func (cfg *Config) fromOMPIEnv() ([]string, error) {
	var notes []string
	if hf := os.Getenv(EnvOMPIHostfile); hf != "" && len(cfg.Hosts) == 0 {
		hosts, err := ReadHostfile(hf)
		if err != nil {
			return nil, usagef("%s=%s: %v", EnvOMPIHostfile, hf, err)
		}
		if len(hosts) == 0 {
			return nil, usagef("%s=%s: no hosts in the file", EnvOMPIHostfile, hf)
		}
		cfg.Hosts = hosts
		notes = append(notes, fmt.Sprintf("hosts from %s=%s (as mpirun reads it; Kubeflow's MPIJob sets it)", EnvOMPIHostfile, hf))
	}
	ssh := true
	if a := strings.TrimSpace(os.Getenv(EnvOMPIRSHAgent)); a != "" && cfg.LaunchAgent == "" {
		// a list of alternatives, "ssh : rsh": the first
		first, _, _ := strings.Cut(a, " : ")
		first = strings.TrimSpace(first)
		words, err := splitWords(first)
		if err != nil || len(words) == 0 {
			return nil, usagef("%s=%q: not a command", EnvOMPIRSHAgent, a)
		}
		if filepath.Base(words[0]) == "ssh" {
			cfg.SSH = words[0]
			cfg.SSHArgs = strings.TrimSpace(cfg.SSHArgs + " " + shellJoin(words[1:]))
		} else {
			cfg.LaunchAgent, ssh = first, false
			notes = append(notes, fmt.Sprintf("remote hosts through %s=%s, called as: %s HOST COMMAND (it must pass gorun's stdin on, as kubectl exec -i does)", EnvOMPIRSHAgent, a, first))
		}
	}
	if a := strings.TrimSpace(os.Getenv(EnvOMPIRSHArgs)); a != "" && ssh && cfg.LaunchAgent == "" {
		if _, err := splitWords(a); err != nil {
			return nil, usagef("%s=%q: %v", EnvOMPIRSHArgs, a, err)
		}
		cfg.SSHArgs = strings.TrimSpace(cfg.SSHArgs + " " + a)
	}
	return notes, nil
}

// mapByPPR reads --map-by ppr:N:node (OpenMPI's N processes per node, as
// -N N); ok is false for any other policy. ppr over sockets, NUMA
// nodes or cores is an error: gorun sees hosts only.
func mapByPPR(mapBy string) (n int, ok bool, err error) {
	rest, ok := strings.CutPrefix(strings.ToLower(mapBy), "ppr:")
	if !ok {
		return 0, false, nil
	}
	count, unit, _ := strings.Cut(rest, ":")
	n, err = strconv.Atoi(count)
	if err != nil || n < 1 {
		return 0, true, usagef("--map-by %s: want ppr:N:node with N >= 1", mapBy)
	}
	if unit != "node" {
		return 0, true, usagef("--map-by %s: gorun places ranks per node only (ppr:N:node, the same as -N N); it does not place by socket, NUMA node or core", mapBy)
	}
	return n, true, nil
}

// checkPortRange refuses a --port-range narrower than one host needs:
// each rank takes a UDP and a TCP port (the first free of the range, the
// same number or not), and gorun's rendezvous one more UDP port on this
// host unless --rendezvous-addr names its port. Ports other programs hold
// are found only when the ranks listen (rank.PortsTakenError).
func (p *plan) checkPortRange(slots []Slot, local map[string]bool) error {
	pr := p.cfg.PortRange
	if pr.IsZero() {
		return nil
	}
	rdv := 0
	if p.rdvPort == "0" {
		rdv = 1
	}
	perHost := map[string]int{}
	for _, s := range slots {
		perHost[s.Host]++
	}
	need, why := rdv, "gorun's rendezvous takes a UDP port"
	for _, h := range p.hostList {
		n := perHost[h.Name]
		w := fmt.Sprintf("host %s runs %s, each with a UDP and a TCP port", h.Name, plural(n, "rank"))
		// (MASTER_PORT needs no port of its own: a program listens either
		// on it, as torch.distributed does, or on the ports of gorun's
		// mesh, as gorun's own ranks do, not on both)
		if local[h.Name] && rdv > 0 {
			n++
			w += ", and gorun's rendezvous takes one more UDP port there"
		}
		if n > need {
			need, why = n, w
		}
	}
	if need <= pr.Size() {
		return nil
	}
	hint := ""
	if pr.Lo+need-1 <= 65535 {
		hint = fmt.Sprintf(" (at least %d-%d)", pr.Lo, pr.Lo+need-1)
	}
	return usagef("--port-range %s has %s, too few: %s; widen it%s", pr, plural(pr.Size(), "port"), why, hint)
}

// placeRanks places the job's ranks on cfg's hosts (this machine when
// none are given) and returns their slots, one per rank, and the hosts
// that got ranks, in node-rank order.
func placeRanks(cfg Config) ([]Slot, []Host, error) {
	hosts := cfg.Hosts
	if len(hosts) == 0 {
		n := cfg.NP
		if cfg.PerNode > 0 {
			n = cfg.PerNode
		}
		if n == 0 {
			n = runtime.NumCPU()
		}
		hosts = []Host{{Name: "localhost", Slots: n, Where: "default"}}
	}
	hosts = mergeLocalHosts(hosts)
	if cfg.PerNode > 0 {
		// mpirun -N / torchrun --nproc-per-node: every host gets exactly
		// that many ranks, whatever its slots say (within max_slots)
		hosts = append([]Host(nil), hosts...)
		for i := range hosts {
			if hosts[i].MaxSlots > 0 && hosts[i].MaxSlots < cfg.PerNode {
				return nil, nil, usagef("-N %d: host %s has max_slots=%d (%s)", cfg.PerNode, hosts[i].Name, hosts[i].MaxSlots, hosts[i].Where)
			}
			hosts[i].Slots = cfg.PerNode
		}
		if cfg.NP > 0 && cfg.NP != cfg.PerNode*len(hosts) {
			return nil, nil, usagef("-np %d with -N %d on %d host(s): want -np %d, or no -np", cfg.NP, cfg.PerNode, len(hosts), cfg.PerNode*len(hosts))
		}
		// --map-by still orders the ranks: slot (default) fills each host
		// in turn, node deals them round-robin, N on each host either way
	}
	np := cfg.NP
	if np == 0 {
		for _, h := range hosts {
			np += h.Slots
		}
	}
	slots, err := Place(hosts, np, cfg.MapBy, cfg.Oversubscribe)
	if err != nil {
		return nil, nil, usagef("%v", err)
	}
	if cfg.StdinRank >= np {
		return nil, nil, usagef("--stdin %d: the job has ranks 0..%d", cfg.StdinRank, np-1)
	}
	var used []Host
	seen := map[string]bool{}
	for _, s := range slots {
		if !seen[s.Host] {
			seen[s.Host] = true
			for _, h := range hosts {
				if h.Name == s.Host {
					used = append(used, h)
					break
				}
			}
		}
	}
	return slots, used, nil
}

// locateProgram returns the ranks' working directory (absolute), the
// program as local ranks run it (checked when anyLocal) and as remote
// agents run it.
func locateProgram(cfg Config, anyLocal bool) (dir, prog, remoteProg string, err error) {
	dir = cfg.Dir
	if dir == "" {
		if dir, err = os.Getwd(); err != nil {
			return "", "", "", fmt.Errorf("cannot find the working directory: %v", err)
		}
	} else if anyLocal { // some local rank: the directory must exist here
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return "", "", "", usagef("working directory %s does not exist", dir)
		}
	}
	if !filepath.IsAbs(dir) {
		if dir, err = filepath.Abs(dir); err != nil {
			return "", "", "", err
		}
	}
	prog, remoteProg = cfg.Program, cfg.Program
	if strings.Contains(cfg.Program, "/") {
		if !filepath.IsAbs(prog) {
			prog = filepath.Join(dir, prog)
		}
		remoteProg = prog
	}
	if anyLocal {
		if prog, err = checkProgram(cfg.Program, prog); err != nil {
			return "", "", "", err
		}
	}
	return dir, prog, remoteProg, nil
}

// rdvIface is the interface the ranks are told to use (GORUN_IFACE):
// a rank.IfaceSpec, empty for none; localOnly when it is an address, which
// names this machine only.
type rdvIface struct {
	name      string
	localOnly bool
}

// chooseRendezvous sets the address the rendezvous is served on: the one
// given, the chosen interface's (--iface, or what --mca and the interface
// variables say: chooseIface), or one the remote hosts can reach; and
// returns the interface the ranks are told.
func (p *plan) chooseRendezvous(remoteHosts, launcher, exports []string) (rdvIface, error) {
	cfg := p.cfg
	var sshWords []string
	if cfg.LaunchAgent == "" {
		sshWords = launcher
	}
	defaultIP := func() (string, error) { return rendezvousIP(remoteHosts, sshWords), nil }
	resolve := func(s rank.IfaceSpec) (string, error) { return s.Resolve(defaultIP) }
	name, from, line, err := chooseIface(cfg, exports, resolve)
	if err != nil {
		return rdvIface{}, err
	}
	if line != "" {
		p.notes = append(p.notes, line)
	}
	spec, _ := rank.ParseIfaceSpec(name)
	iface := rdvIface{name, spec.Addr != ""}
	switch {
	case cfg.RendezvousAddr != "":
		h, port, err := net.SplitHostPort(cfg.RendezvousAddr)
		if err != nil {
			h, port = cfg.RendezvousAddr, "0"
		}
		if ip := net.ParseIP(h); ip == nil || ip.IsUnspecified() {
			return iface, usagef("--rendezvous-addr %q: want an IP address the ranks can reach, optionally with :port", cfg.RendezvousAddr)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return iface, usagef("--rendezvous-addr %q: bad port", cfg.RendezvousAddr)
		}
		p.rdvIP, p.rdvPort = h, port
	case name != "":
		ip, err := resolve(spec)
		if err != nil {
			return iface, usagef("%s: %v", from, err)
		}
		p.rdvIP = ip
	default:
		p.rdvIP, _ = defaultIP()
	}
	return iface, nil
}

// localEnv is what gorun adds to its own environment for the local rank in
// slot s of np.
func (p *plan) localEnv(s Slot, np int, exports []string, iface rdvIface, cudaLocal bool, localGPUs int) []string {
	env := append([]string(nil), exports...)
	if iface.name != "" && !hasVar(exports, rank.EnvIface) {
		env = append(env, rank.EnvIface+"="+iface.name)
	}
	if !p.cfg.PortRange.IsZero() && !hasVar(exports, rank.EnvPortRange) {
		env = append(env, rank.EnvPortRange+"="+p.cfg.PortRange.String())
	}
	env = append(env, rank.EnvRank+"="+strconv.Itoa(s.Rank), rank.EnvLocalRank+"="+strconv.Itoa(s.LocalRank))
	env = append(env, p.jobEnv(np, s.LocalSize, s.NodeRank, s.Host, strconv.Itoa(s.Rank), strconv.Itoa(s.LocalRank))...)
	if cudaLocal {
		env = append(env, "CUDA_VISIBLE_DEVICES="+visibleDevice(s.LocalRank, localGPUs))
	}
	if p.pl != nil {
		env = append(env, EnvProgressLine+"=1")
	}
	return env
}

// jobEnv is what every rank on host is told of the job and its host: the
// world size, the ranks on the host and the host's index, where the
// rendezvous is, the job's ID, the same in torchrun's and OpenMPI's words
// (foreignEnv, with rankWord and localWord for the rank and local rank),
// and which start this is.
func (p *plan) jobEnv(np, localSize, nodeRank int, host, rankWord, localWord string) []string {
	env := []string{
		rank.EnvSize + "=" + strconv.Itoa(np),
		rank.EnvLocalSize + "=" + strconv.Itoa(localSize),
		rank.EnvNodeRank + "=" + strconv.Itoa(nodeRank),
		rank.EnvRendezvous + "=" + net.JoinHostPort(p.rdvIP, rdvPortPlaceholder),
		rank.EnvJobID + "=" + p.jobID,
	}
	env = append(env, p.foreignEnv(np, localSize, nodeRank, rankWord, localWord)...)
	return append(env, rank.EnvHost+"="+host, rank.EnvRestart+"="+restartPlaceholder)
}

// ForeignVars are the variables that torchrun and OpenMPI's mpirun give
// their ranks, which gorun gives every rank too, so that programs written
// for those launchers (PyTorch's init_process_group("env://"), mpi4py
// scripts reading their rank) run unchanged: each unless the user set it
// (with -x; MASTER_ADDR and MASTER_PORT also in gorun's environment).
// gorun's own ranks read GORUN_* first (rank.FromEnv), so these change
// nothing for them.
var ForeignVars = []string{
	"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", EnvMasterAddr, EnvMasterPort,
	"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
}

// MASTER_ADDR and MASTER_PORT: where rank 0's host can be reached, and a
// TCP port free there (torch.distributed's store listens on it).
const (
	EnvMasterAddr = "MASTER_ADDR"
	EnvMasterPort = "MASTER_PORT"
)

// foreignPerRank are the ForeignVars that differ between the ranks of a
// host: the remote agent fills them in for each rank (local: the local
// rank; else the rank).
var foreignPerRank = map[string]bool{"RANK": false, "OMPI_COMM_WORLD_RANK": false, "LOCAL_RANK": true, "OMPI_COMM_WORLD_LOCAL_RANK": true}

// chooseForeign works out which ForeignVars gorun sets: every one the
// user did not set with -x. MASTER_ADDR and MASTER_PORT set in gorun's
// environment are the user's too, and go to every rank, remote ones
// included. The others found in gorun's environment were left there by a
// launcher that started gorun (torchrun, mpirun, a PyTorchJob's pod): one
// value for every rank would be wrong, so each rank gets its own, with a
// note. Inside a rank of a gorun job (GORUN_RANK set) all of them are
// that job's and are replaced without a word, as its GORUN_* are.
func (p *plan) chooseForeign(exports []string) {
	_, enclosing := os.LookupEnv(rank.EnvRank)
	p.foreign = map[string]bool{}
	var replaced []string
	for _, k := range ForeignVars {
		if hasVar(exports, k) {
			continue
		}
		if v, ok := os.LookupEnv(k); ok && !enclosing {
			if k == EnvMasterAddr || k == EnvMasterPort {
				p.userMaster = append(p.userMaster, k+"="+v)
				continue
			}
			replaced = append(replaced, k+"="+v)
		}
		p.foreign[k] = true
	}
	if len(replaced) > 0 {
		p.notes = append(p.notes, fmt.Sprintf("%s in gorun's environment (from the launcher that started gorun?): each rank gets its own value instead (-x NAME=VALUE gives every rank one value)", strings.Join(replaced, " ")))
	}
}

// foreignEnv is what gorun sets of ForeignVars for a rank: rankWord and
// localWord are its rank and local rank, or the placeholders the remote
// agent fills in. MASTER_ADDR is the rendezvous address when rank 0 runs
// here (the address the other hosts reach this one by); otherwise, and
// for MASTER_PORT always, a placeholder filled in when the job starts.
func (p *plan) foreignEnv(np, localSize, nodeRank int, rankWord, localWord string) []string {
	addr := masterAddrPlaceholder
	if p.rank0Local {
		addr = p.rdvIP
	}
	vals := map[string]string{
		"RANK": rankWord, "OMPI_COMM_WORLD_RANK": rankWord, "LOCAL_RANK": localWord, "OMPI_COMM_WORLD_LOCAL_RANK": localWord,
		"WORLD_SIZE": strconv.Itoa(np), "OMPI_COMM_WORLD_SIZE": strconv.Itoa(np),
		"LOCAL_WORLD_SIZE": strconv.Itoa(localSize), "OMPI_COMM_WORLD_LOCAL_SIZE": strconv.Itoa(localSize),
		"GROUP_RANK": strconv.Itoa(nodeRank), EnvMasterAddr: addr, EnvMasterPort: masterPortPlaceholder,
	}
	var env []string
	for _, k := range ForeignVars {
		if p.foreign[k] {
			env = append(env, k+"="+vals[k])
		}
	}
	return env
}

// masterNone is the value of MASTER_ADDR or MASTER_PORT that could not be
// picked: the ranks get no such variable.
const masterNone = "-"

// masterPortWarning is gorun's (or the agent's) line when no port for
// MASTER_PORT is free on host.
func masterPortWarning(host string, err error) string {
	return fmt.Sprintf("MASTER_PORT on %s (rank 0's host): %v: the ranks get no MASTER_PORT (torch.distributed's env:// needs it); widen --port-range (%s), or set MASTER_PORT", host, err, rank.EnvPortRange)
}

// pickMaster says whether MASTER_ADDR or MASTER_PORT is gorun's to pick
// at each start (the user set neither, or one of them).
func (p *plan) pickMaster() bool { return p.foreign[EnvMasterAddr] || p.foreign[EnvMasterPort] }

// PickMasterPort returns a TCP port that is free on every address of this
// host, for MASTER_PORT: the highest free port of pr, or with the zero
// range one the kernel picks. The ranks of gorun's own mesh take the
// lowest ports of the range; a program listens on those or on
// MASTER_PORT (torch.distributed's store), not on both, so the range needs
// no port for it. It is closed again for the rank 0 that listens on it;
// like torchrun's own pick, another program could take it in between.
func PickMasterPort(pr rank.PortRange) (int, error) {
	try := func(port int) (int, error) {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			return 0, err
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port, nil
	}
	if pr.IsZero() {
		return try(0)
	}
	for port := pr.Hi; port >= pr.Lo; port-- {
		n, err := try(port)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return n, err
		}
	}
	return 0, &rank.PortsTakenError{Proto: "TCP", Range: pr}
}

// remoteEnv is the environment the agent on remote host hs starts with
// (its ranks' own variables it adds itself).
func (p *plan) remoteEnv(hs *hostSpec, np int, exports []string, iface rdvIface, userCUDA bool) []string {
	first := p.specs[hs.ranks[0]].slot
	env := append([]string(nil), exports...)
	for _, k := range tuningVars {
		if v, ok := os.LookupEnv(k); ok && !hasVar(exports, k) {
			env = append(env, k+"="+v)
		}
	}
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok && !userCUDA {
		env = append(env, "CUDA_VISIBLE_DEVICES="+v)
	}
	if iface.name != "" && !iface.localOnly && !hasVar(exports, rank.EnvIface) {
		env = append(env, rank.EnvIface+"="+iface.name)
	}
	if !p.cfg.PortRange.IsZero() && !hasVar(exports, rank.EnvPortRange) {
		env = append(env, rank.EnvPortRange+"="+p.cfg.PortRange.String())
	}
	env = append(env, p.userMaster...)
	env = append(env, p.jobEnv(np, first.LocalSize, first.NodeRank, hs.name, rankPlaceholder, localRankPlaceholder)...)
	if p.cfg.MaxRestarts > 0 {
		env = append(env, causePlaceholder) // the whole word: none on the first start
	}
	if p.pl != nil {
		env = append(env, EnvProgressLine+"=1")
	}
	return env
}

// remoteCommand is the shell command that runs gorun's agent on remote
// host hs with env, in dir.
func (p *plan) remoteCommand(hs *hostSpec, env []string, agentPath, dir string, cudaLocal bool) string {
	cfg := p.cfg
	var ars []AgentRank
	stdinRank := -1
	for _, r := range hs.ranks {
		ars = append(ars, AgentRank{Rank: r, Local: p.specs[r].slot.LocalRank})
		if r == cfg.StdinRank && cfg.Stdin != nil {
			stdinRank = r
		}
	}
	agent := []string{agentPath, "--" + AgentFlag, "--grace", cfg.Grace.String(), "--ranks", formatAgentRanks(ars)}
	if cudaLocal {
		agent = append(agent, "--cuda-local")
	}
	if stdinRank >= 0 {
		agent = append(agent, "--agent-stdin", strconv.Itoa(stdinRank))
	}
	agent = append(agent, "--", p.rprog)
	agent = append(agent, cfg.Args...)
	words := append([]string{"exec", "env"}, env...)
	words = append(words, agent...)
	return "cd " + shellQuote(dir) + " && " + shellJoin(words)
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
const (
	rdvPortPlaceholder = "<port>"
	restartPlaceholder = "@restart@" // shell-safe: the word stays unquoted
	causePlaceholder   = "@cause@"   // in a remote command: GORUN_RESTART_CAUSE=the cause, shell-quoted, on a restart; nothing on the first start
	// In a remote host's command, the agent fills these in for each rank
	// (agent.go): the rank and the local rank.
	rankPlaceholder      = "@rank@"
	localRankPlaceholder = "@local-rank@"
	// MASTER_ADDR and MASTER_PORT, picked when the job starts: by gorun
	// when rank 0 runs here, else by the agent on rank 0's host.
	masterAddrPlaceholder = "@master-addr@"
	masterPortPlaceholder = "@master-port@"
)

func hasVar(env []string, name string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			return true
		}
	}
	return false
}

// exportVars resolves -x NAME[=VALUE] into NAME=VALUE pairs. A NAME
// alone that is not set in gorun's environment is left out and listed in
// unset (mpirun warns and goes on).
func exportVars(xs []string) (env []string, cuda bool, unset []string, err error) {
	seen := map[string]bool{}
	for _, x := range xs {
		name, val, hasVal := strings.Cut(x, "=")
		if !validEnvName(name) {
			return nil, false, nil, usagef("-x %q: %q is not a valid environment variable name", x, name)
		}
		for _, c := range contractVars {
			if name == c {
				return nil, false, nil, usagef("-x %s: gorun sets %s itself for every rank", name, name)
			}
		}
		if seen[name] {
			return nil, false, nil, usagef("-x %s given twice", name)
		}
		seen[name] = true
		if !hasVal {
			v, ok := os.LookupEnv(name)
			if !ok {
				unset = append(unset, name)
				continue
			}
			val = v
		}
		if name == "CUDA_VISIBLE_DEVICES" {
			cuda = true
		}
		env = append(env, name+"="+val)
	}
	return env, cuda, unset, nil
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

// commandLine renders a local rank's command for --dry-run and -v, with
// the secret redacted.
func (p *plan) commandLine(sp rankSpec, port string) string {
	words := []string{"env"}
	for _, kv := range sp.env {
		if kv = p.fill(kv, port); kv != "" {
			words = append(words, kv)
		}
	}
	words = append(words, rank.EnvSecret+"=<redacted>")
	words = append(words, sp.argv...)
	return "cd " + shellQuote(p.cfg.Dir) + " && " + shellJoin(words)
}

// hostCommandLine renders a remote host's command.
func (p *plan) hostCommandLine(hs *hostSpec, port string) string {
	w := make([]string, len(hs.argv))
	for i, a := range hs.argv {
		w[i] = p.fill(a, port)
	}
	return shellJoin(w) + "   # job secret on stdin"
}

// fill puts the rendezvous port, the number of this start and, once
// known, MASTER_ADDR and MASTER_PORT into a word of a rank's environment or
// command.
func (p *plan) fill(s, port string) string {
	s = strings.ReplaceAll(strings.ReplaceAll(s, rdvPortPlaceholder, port), restartPlaceholder, strconv.Itoa(p.restart))
	for _, m := range [2][3]string{{EnvMasterAddr, masterAddrPlaceholder, p.masterAddr}, {EnvMasterPort, masterPortPlaceholder, p.masterPort}} {
		switch name, ph, v := m[0], m[1], m[2]; v {
		case "": // not known yet
		case masterNone: // none: the variable is left out ("" for a whole word)
			if s == name+"="+ph {
				return ""
			}
			s = strings.ReplaceAll(s, " "+name+"="+ph+" ", " ")
		default:
			s = strings.ReplaceAll(s, ph, v)
		}
	}
	cause := ""
	if p.restart > 0 {
		cause = rank.EnvRestartCause + "=" + shellQuote(p.cause)
	}
	return strings.ReplaceAll(s, causePlaceholder, cause)
}

// printCommands writes every local rank's and remote host's command.
func (p *plan) printCommands(w io.Writer, prefix, port string) {
	for _, sp := range p.specs {
		if !sp.remote {
			fmt.Fprintf(w, "%s[%d] %s\n", prefix, sp.slot.Rank, p.commandLine(sp, port))
		}
	}
	for _, hs := range p.remote {
		fmt.Fprintf(w, "%s[%s: %s] %s\n", prefix, hs.name, rankList(hs.ranks), p.hostCommandLine(hs, port))
		for _, r := range hs.ranks {
			words := []string{"env", rank.EnvRank + "=" + strconv.Itoa(r), rank.EnvLocalRank + "=" + strconv.Itoa(p.specs[r].slot.LocalRank)}
			if p.cudaRank {
				words = append(words, "CUDA_VISIBLE_DEVICES="+strconv.Itoa(p.specs[r].slot.LocalRank))
			}
			words = append(words, rank.EnvSecret+"=<redacted>", p.rprog)
			words = append(words, p.cfg.Args...)
			fmt.Fprintf(w, "%s[%d] the agent on %s adds to the host's environment and runs: %s\n", prefix, r, hs.name, shellJoin(words))
		}
	}
}

func rankList(rs []int) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = strconv.Itoa(r)
	}
	if len(rs) == 1 {
		return "rank " + parts[0]
	}
	return "ranks " + strings.Join(parts, ",")
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
	p.printCommands(w, "", p.displayPort())
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

// outcome is how a rank ended.
type outcome struct {
	p      *proc
	status int    // exit status
	signal int    // > 0: died of this signal
	fail   string // the rank could not be started, or contact was lost
}

func (p *plan) run() (int, error) {
	cfg := p.cfg
	p.failure = ""
	secretBytes, _ := hex.DecodeString(p.secret)
	var rdv *rank.RendezvousServer
	var err error
	if p.rdvPort == "0" {
		rdv, err = rank.ListenRendezvousIn(p.rdvIP, cfg.PortRange, len(p.specs), secretBytes)
	} else {
		rdv, err = rank.ListenRendezvous(net.JoinHostPort(p.rdvIP, p.rdvPort), len(p.specs), secretBytes)
	}
	if err != nil {
		return ExitSetup, err
	}
	defer rdv.Close()
	_, port, _ := net.SplitHostPort(rdv.Addr())
	p.rdvPort = port
	// MASTER_ADDR and MASTER_PORT, afresh at every start: picked here when
	// rank 0 runs here; else by the agent on rank 0's host, which says
	// them in its "master" frame, before the ranks elsewhere start.
	p.masterAddr, p.masterPort = "", ""
	var masterCh chan [2]string
	if p.pickMaster() {
		if !p.rank0Local {
			masterCh = make(chan [2]string, 1)
		} else if p.foreign[EnvMasterPort] {
			// Not fatal: gorun's own ranks do not need it (and say
			// themselves when the range is full for them too)
			if mp, err := PickMasterPort(cfg.PortRange); err != nil {
				fmt.Fprintf(cfg.Stderr, "gorun: warning: %s\n", masterPortWarning(p.specs[0].slot.Host, err))
				p.masterPort = masterNone
			} else {
				p.masterPort = strconv.Itoa(mp)
			}
		}
	}

	// gorun's stdout or stderr closed by its reader stops the job (a
	// terminal is never such a pipe).
	outGone := make(chan string, 2)
	if p.pl == nil {
		cfg.Stdout = newBrokenPipe(cfg.Stdout, "stdout", outGone)
	}
	if !p.plErr {
		cfg.Stderr = newBrokenPipe(cfg.Stderr, "stderr", outGone)
	}
	stdout, stderr := &sink{w: cfg.Stdout, pl: p.pl}, &sink{w: cfg.Stderr}
	if p.pl != nil {
		defer p.pl.end()
		if p.plErr {
			stderr.pl = p.pl
			cfg.Stderr = lineWriter{p.pl, cfg.Stderr}
		}
	}
	if cfg.OutputDir != "" {
		for _, sp := range p.specs {
			if err := os.MkdirAll(filepath.Join(cfg.OutputDir, fmt.Sprintf("rank.%d", sp.slot.Rank)), 0o755); err != nil {
				return ExitSetup, fmt.Errorf("--output-dir: %v", err)
			}
		}
	}
	if cfg.Verbose {
		fmt.Fprintf(cfg.Stderr, "gorun: job %s: %s on %s, rendezvous %s\n", p.jobID, plural(len(p.specs), "rank"), plural(p.hosts, "host"), rdv.Addr())
		p.printCommands(cfg.Stderr, "gorun: ", port)
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
	abort := func(err error) (int, error) {
		for _, q := range procs {
			q.signal(syscall.SIGKILL)
			q.killLocal()
		}
		for range procs {
			<-results
		}
		return ExitSetup, err
	}
	// startLocals starts the ranks on this machine; on an error, those
	// it started are in procs, and the error is returned.
	startLocals := func() error {
		for _, sp := range p.specs {
			if sp.remote {
				continue
			}
			pr, err := p.startLocal(sp, port, stdout, stderr)
			if err != nil {
				return err
			}
			pr.reaper = rp
			rp.send("g", pr.cmd.Process.Pid)
			if cfg.ReportBindings {
				stderr.writeLine([]byte(bindingLine(sp.slot, pr.pid)))
			}
			procs = append(procs, pr)
			go pr.wait(results)
		}
		return nil
	}
	// localsWait: the local ranks wait for MASTER_ADDR and MASTER_PORT
	// from the agent on rank 0's host (then so do the other agents).
	localsWait := masterCh != nil
	if !localsWait {
		if err := startLocals(); err != nil {
			return abort(err)
		}
	}
	hostOf := map[*hostSpec]*remoteHost{}
	for _, hs := range p.remote {
		var mc chan [2]string
		if hs.ranks[0] == 0 {
			mc = masterCh
		}
		h, hprocs, err := p.startHost(hs, port, stdout, stderr, results, rp, mc)
		if err != nil {
			return abort(err)
		}
		hostOf[hs] = h
		procs = append(procs, hprocs...)
		go h.wait()
	}

	// The lifecycle: the first failure (or a signal, or the timeout) stops
	// everyone: SIGTERM (or the signal received), SIGKILL after the grace.
	status, stopping := 0, false
	// byGorun: the stop came from outside the job (a signal to gorun, or
	// its output's reader gone), so its status is gorun's own (128+N) and
	// ExitKilled when a rank had to be killed.
	byGorun := false
	var grace, hard <-chan time.Time
	var timeout <-chan time.Time
	if cfg.Timeout > 0 {
		t := time.NewTimer(cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	done := map[*proc]bool{}
	// killing: the ranks still running when gorun sent SIGKILL, and why
	// it did; killed: those of them that died of it (or were lost).
	killing := map[*proc]bool{}
	var killed []int
	killWhy := ""
	stopAll := func(sig syscall.Signal) {
		for _, q := range procs {
			if !done[q] {
				q.signal(sig)
				if sig == syscall.SIGKILL {
					killing[q] = true
				}
			}
		}
		if !stopping {
			stopping = true
			grace = time.After(cfg.Grace)
		}
	}
	startErr := false // the local ranks could not start after MASTER_PORT came
	for len(done) < len(procs) || localsWait && !stopping {
		select {
		case m := <-masterCh:
			if !localsWait || stopping {
				continue
			}
			localsWait = false
			if p.foreign[EnvMasterAddr] {
				p.masterAddr = m[0]
			}
			if p.foreign[EnvMasterPort] {
				p.masterPort = m[1]
			}
			for _, hs := range p.remote {
				if hs.ranks[0] != 0 {
					hostOf[hs].ctl.send("m " + m[0] + " " + m[1])
				}
			}
			if err := startLocals(); err != nil {
				fmt.Fprintln(cfg.Stderr, "gorun: "+err.Error())
				startErr, status, p.failure = true, ExitSetup, ""
				stopAll(syscall.SIGTERM)
			}
		case r := <-results:
			done[r.p] = true
			if killing[r.p] && (r.signal == int(syscall.SIGKILL) || r.fail != "") {
				killed = append(killed, r.p.spec.slot.Rank)
			}
			if stopping {
				continue
			}
			if code, msg := r.describe(); code != 0 {
				fmt.Fprintln(cfg.Stderr, "gorun: "+msg)
				status, p.failure = code, msg
				stopAll(syscall.SIGTERM)
			}
		case s := <-cfg.Signals:
			p.failure = "" // a signal to gorun ends the job: no restart
			sig, _ := s.(syscall.Signal)
			if sig == 0 {
				sig = syscall.SIGTERM
			}
			if stopping {
				if killWhy == "" {
					killWhy = fmt.Sprintf(" at a second signal (%v)", sig)
					if !byGorun { // the job was stopping after a failure or --timeout
						killWhy = fmt.Sprintf(" at a signal (%v) while the job was stopping", sig)
					}
				}
				stopAll(syscall.SIGKILL)
				continue
			}
			fmt.Fprintf(cfg.Stderr, "gorun: %v: stopping the job: forwarded to every rank, which are killed if still running after --grace %s; a second signal kills them at once\n", sig, cfg.Grace)
			status, byGorun = 128+int(sig), true
			stopAll(sig)
		case name := <-outGone:
			if stopping {
				continue // the job is ending already; its output is dropped
			}
			p.failure = ""
			fmt.Fprintf(cfg.Stderr, "gorun: %s: broken pipe (its reader exited): stopping the job as for SIGTERM\n", name)
			status, byGorun = ExitBrokenPipe, true
			stopAll(syscall.SIGTERM)
		case <-timeout:
			if !stopping {
				fmt.Fprintf(cfg.Stderr, "gorun: job timed out after %s (--timeout); stopping %d ranks\n", cfg.Timeout, len(procs)-len(done))
				status = ExitTimeout
				stopAll(syscall.SIGTERM)
			}
		case <-grace:
			if killWhy == "" {
				killWhy = fmt.Sprintf(": still running %s after the stop began (--grace)", cfg.Grace)
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
	if len(killed) > 0 {
		sort.Ints(killed)
		fmt.Fprintf(cfg.Stderr, "gorun: %s killed with SIGKILL%s\n", rankList(killed), killWhy)
		if byGorun {
			status = ExitKilled
		}
	}
	if startErr {
		return ExitSetup, nil
	}
	return status, nil
}

// outputFiles opens DIR/rank.N/stdout and stderr, or returns nils.
func (p *plan) outputFiles(r int) (of, ef *os.File, err error) {
	if p.cfg.OutputDir == "" {
		return nil, nil, nil
	}
	d := filepath.Join(p.cfg.OutputDir, fmt.Sprintf("rank.%d", r))
	if of, err = os.Create(filepath.Join(d, "stdout")); err != nil {
		return nil, nil, fmt.Errorf("--output-dir: %v", err)
	}
	if ef, err = os.Create(filepath.Join(d, "stderr")); err != nil {
		of.Close()
		return nil, nil, fmt.Errorf("--output-dir: %v", err)
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
	// gorun's environment, less what gorun sets for the rank (RANK left
	// there by another launcher, say), then the rank's own
	own := map[string]bool{}
	for _, kv := range sp.env {
		k, _, _ := strings.Cut(kv, "=")
		own[k] = true
	}
	var env []string
	for _, kv := range cleanEnviron() {
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
		return nil, fmt.Errorf("cannot start rank %d (%s): %v", sp.slot.Rank, sp.argv[0], unwrapExec(err))
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

// describe says how a rank ended: status 0 and "" for success, else gorun's
// exit status and its one-line message.
func (o outcome) describe() (int, string) {
	s := o.p.spec.slot
	where := fmt.Sprintf("rank %d (host %s, pid %d)", s.Rank, s.Host, o.p.getPid())
	switch {
	case o.fail != "":
		return ExitLaunch, o.fail
	case o.signal > 0:
		return 128 + o.signal, fmt.Sprintf("%s killed by signal %d (%v)", where, o.signal, syscall.Signal(o.signal))
	case o.status != 0:
		return o.status, fmt.Sprintf("%s exited with status %d", where, o.status)
	}
	return 0, ""
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

// DefaultGrace is the time between SIGTERM and SIGKILL when a job stops:
// Slurm's KillWait. It must cover a training step and a stop checkpoint
// (nmt-train's Transformer-base writes about 700 MB with fsync); a rank
// that exits sooner is not waited for, so a well-behaved job pays nothing
// for it, and a second signal to gorun kills at once.
const DefaultGrace = 30 * time.Second

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
