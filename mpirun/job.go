package mpirun

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/rank"
)

// The job as gorun's caller sees it: its Config (with the defaults and
// checks of the flags, and what OpenMPI's MCA variables in the environment
// give), Run and its restarts, gorun's exit statuses and usage errors. The
// job's plan is plan.go's, one start of it lifecycle.go's.

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

	// Environ is gorun's environment, NAME=VALUE each as in exec.Cmd's
	// Env (cmd/gorun passes its process's, the os package's Environ());
	// of a name given twice the last counts, as with exec.Cmd's Env. It
	// holds the variables that configure the job (OpenMPI's MCA ones,
	// MASTER_ADDR and MASTER_PORT, CUDA_VISIBLE_DEVICES, the mesh's tuning
	// variables forwarded to remote hosts, an enclosing job's GORUN_RANK)
	// and -x NAME's values, and is the environment that local ranks, ssh
	// (or the launch agent) and the reaper start with, less an enclosing
	// job's rank variables. mpirun reads no other (but os/exec looks a
	// program named without a slash up in this process's PATH). Unlike
	// exec.Cmd's Env, nil is an empty environment, not this process's:
	// the ranks then get only what gorun sets.
	Environ []string
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

// UsageError is bad input, found before anything started; Err is its
// cause, where it has one.
type UsageError struct {
	Msg string
	Err error
}

func (e *UsageError) Error() string { return e.Msg }

func (e *UsageError) Unwrap() error { return e.Err }

// usagef formats as fmt.Errorf does: a %w operand is the error's cause.
func usagef(format string, a ...any) error {
	err := fmt.Errorf(format, a...)
	return &UsageError{Msg: err.Error(), Err: errors.Unwrap(err)}
}

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
// parameters in the environment (cfg.Environ), where the command line says nothing:
// the hosts from OMPI_MCA_orte_default_hostfile, the launch agent from
// OMPI_MCA_plm_rsh_agent (OpenMPI's default "ssh : rsh" is ssh), and more
// ssh arguments from OMPI_MCA_plm_rsh_args, after --ssh-args (ssh keeps
// the first value of an option, so the command line's win). It returns
// gorun's notes on what it took.
func (cfg *Config) fromOMPIEnv() ([]string, error) {
	var notes []string
	if hf := getenv(cfg.Environ, EnvOMPIHostfile); hf != "" && len(cfg.Hosts) == 0 {
		hosts, err := ReadHostfile(hf)
		if err != nil {
			return nil, usagef("%s=%s: %w", EnvOMPIHostfile, hf, err)
		}
		if len(hosts) == 0 {
			return nil, usagef("%s=%s: no hosts in the file", EnvOMPIHostfile, hf)
		}
		cfg.Hosts = hosts
		notes = append(notes, fmt.Sprintf("hosts from %s=%s (as mpirun reads it; Kubeflow's MPIJob sets it)", EnvOMPIHostfile, hf))
	}
	ssh := true
	if a := strings.TrimSpace(getenv(cfg.Environ, EnvOMPIRSHAgent)); a != "" && cfg.LaunchAgent == "" {
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
	if a := strings.TrimSpace(getenv(cfg.Environ, EnvOMPIRSHArgs)); a != "" && ssh && cfg.LaunchAgent == "" {
		if _, err := splitWords(a); err != nil {
			return nil, usagef("%s=%q: %w", EnvOMPIRSHArgs, a, err)
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

// DefaultGrace is the time between SIGTERM and SIGKILL when a job stops:
// Slurm's KillWait. It must cover a training step and a stop checkpoint
// (nmt-train's Transformer-base writes about 700 MB with fsync); a rank
// that exits sooner is not waited for, so a well-behaved job pays nothing
// for it, and a second signal to gorun kills at once.
const DefaultGrace = 30 * time.Second
