package mpirun

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/gorun/gorun/rank"
)

// What a rank's environment holds: gorun's contract variables
// (GORUN_*), the tuning variables forwarded to every rank, -x exports,
// the variables of torchrun and OpenMPI (ForeignVars) with MASTER_ADDR and
// MASTER_PORT, and the placeholders filled in at each start.

// contractVars are set by gorun itself; -x may not override them.
var contractVars = []string{rank.EnvRank, rank.EnvSize, rank.EnvLocalRank, rank.EnvLocalSize, rank.EnvNodeRank,
	rank.EnvRendezvous, rank.EnvJobID, rank.EnvSecret, rank.EnvHost, rank.EnvRestart, rank.EnvRestartCause, EnvProgressLine, EnvSignalNotices}

// tuningVars are forwarded from gorun's environment to every rank, remote
// ones included, because the mesh needs them equal everywhere (the TCP
// cipher need not be, but whoever sets it means the whole job).
var tuningVars = []string{rank.EnvTransport, rank.EnvConns, rank.EnvTimeout, rank.EnvTCPCipher, rank.EnvQUICGRO}

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

// remoteEnv is the environment the agent on remote host hs starts with
// (its ranks' own variables it adds itself).
func (p *plan) remoteEnv(hs *hostSpec, np int, exports []string, iface rdvIface, userCUDA bool) []string {
	first := p.specs[hs.ranks[0]].slot
	env := append([]string(nil), exports...)
	for _, k := range tuningVars {
		if v, ok := LookupEnv(p.cfg.Environ, k); ok && !hasVar(exports, k) {
			env = append(env, k+"="+v)
		}
	}
	if v, ok := LookupEnv(p.cfg.Environ, "CUDA_VISIBLE_DEVICES"); ok && !userCUDA {
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
	_, enclosing := LookupEnv(p.cfg.Environ, rank.EnvRank)
	p.foreign = map[string]bool{}
	var replaced []string
	for _, k := range ForeignVars {
		if hasVar(exports, k) {
			continue
		}
		if v, ok := LookupEnv(p.cfg.Environ, k); ok && !enclosing {
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

func hasVar(env []string, name string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			return true
		}
	}
	return false
}

// exportVars resolves -x NAME[=VALUE] into NAME=VALUE pairs, a NAME
// alone with its value in environ (gorun's environment). A NAME alone
// that is not set there is left out and listed in unset (mpirun warns and
// goes on).
func exportVars(xs, environ []string) (env []string, cuda bool, unset []string, err error) {
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
			v, ok := LookupEnv(environ, name)
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

// cleanEnviron is environ (gorun's environment) without the rank contract
// of an enclosing job. It is never nil, so that as an exec.Cmd's Env it is
// always this environment, an empty one included, never the one of the
// process that runs mpirun.
func cleanEnviron(environ []string) []string {
	env := make([]string, 0, len(environ))
	for _, kv := range environ {
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

// LookupEnv is the os package's LookupEnv over env, an environment as
// exec.Cmd's Env and Config.Environ hold it (NAME=VALUE each): of a name
// given more than once the last value counts, as with os/exec.
func LookupEnv(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
			return v, true
		}
	}
	return "", false
}

// getenv is the os package's Getenv over env (LookupEnv).
func getenv(env []string, name string) string {
	v, _ := LookupEnv(env, name)
	return v
}

// childEnv is env as an exec.Cmd's Env: never nil, which would start the
// child with the environment of the process that runs mpirun instead.
func childEnv(env []string) []string {
	if env == nil {
		return []string{}
	}
	return env
}
