package mpirun

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/gorun/gorun/internal/words"
	"github.com/gorun/gorun/rank"
)

// The plan of a job, worked out before anything starts: where every
// rank runs (placement, the local and remote hosts), the program and its
// working directory, how remote hosts are reached, the rendezvous address,
// and the checks of --port-range.

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
	exports, userCUDA, unset, err := exportVars(cfg.Export, cfg.Environ)
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
				return nil, fmt.Errorf("cannot find gorun's own path for the remote agent (give --remote-gorun): %w", err)
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
	_, inheritedCUDA := LookupEnv(cfg.Environ, "CUDA_VISIBLE_DEVICES")
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
		return nil, nil, usagef("%w", err)
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
		w := fmt.Sprintf("host %s runs %s, each with a UDP and a TCP port", h.Name, words.Plural(n, "rank"))
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
	return usagef("--port-range %s has %s, too few: %s; widen it%s", pr, words.Plural(pr.Size(), "port"), why, hint)
}

// locateProgram returns the ranks' working directory (absolute), the
// program as local ranks run it (checked when anyLocal) and as remote
// agents run it.
func locateProgram(cfg Config, anyLocal bool) (dir, prog, remoteProg string, err error) {
	dir = cfg.Dir
	if dir == "" {
		if dir, err = os.Getwd(); err != nil {
			return "", "", "", fmt.Errorf("cannot find the working directory: %w", err)
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
		return "", usagef("program %s: %w", given, unwrapExec(err))
	case st.IsDir():
		return "", usagef("program %s is a directory", given)
	case st.Mode()&0o111 == 0:
		return "", usagef("program %s is not executable (chmod +x it)", given)
	}
	if err := syscall.Access(path, 1 /* X_OK */); err != nil {
		return "", usagef("program %s is not executable by this user: %w", given, err)
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
		return nil, usagef("--ssh-args: %w", err)
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
	defaultIP := func() (string, error) { return rendezvousIP(remoteHosts, sshWords, cfg.Environ), nil }
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
			return iface, usagef("%s: %w", from, err)
		}
		p.rdvIP = ip
	default:
		p.rdvIP, _ = defaultIP()
	}
	return iface, nil
}
