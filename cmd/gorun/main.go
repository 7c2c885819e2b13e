// Command gorun starts a program as the ranks of a job, like mpirun or
// horovodrun: one process per slot on local and ssh-reachable hosts, each
// with its rank in the environment and the job secret that authenticates
// its mesh.
//
//	gorun -np 4 ./prog args
//	gorun -np 8 -hostfile hosts --map-by node ./prog
//	gorun -H node1:4,node2:4 -x NCCL_DEBUG=INFO ./prog
//	gorun --allow-run-as-root -n 4 -H vm1:2,vm2:2 -bind-to none -map-by slot \
//	      --mca btl_tcp_if_include eth0 -x NCCL_SOCKET_IFNAME=eth0 python run.py
//
// The launcher itself is package mpirun; this file only turns flags into
// an mpirun.Config. See docs/launcher.md.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/gorun/gorun/internal/version"
	"github.com/gorun/gorun/mpirun"
	"github.com/gorun/gorun/rank"
	"github.com/urfave/cli/v2"
)

func main() {
	// A write to a pipe whose reader exited (`gorun ... | head`, an ssh
	// session gone) returns EPIPE instead of killing gorun with SIGPIPE
	// (Go's rule for stdout and stderr without this), which would leave
	// the ranks to die without their stop: package mpirun then says so in
	// one line and stops the job as for SIGTERM. The ranks, exec'd, get
	// SIGPIPE's default back.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	os.Exit(run(os.Args, os.Environ(), os.Stdin, os.Stdout, os.Stderr))
}

// usageError marks a flag problem found by the CLI (exit status 2).
type usageError struct{ error }

// run is gorun with the command line args and the environment environ
// (NAME=VALUE each, the process's: package mpirun reads no other).
func run(args, environ []string, stdin io.Reader, stdout, stderr io.Writer) int {
	status := 0
	args, mca := mcaArgs(args)
	app := &cli.App{
		Name:                      "gorun",
		Usage:                     "start a program as the ranks of a job (mpirun / horovodrun style)",
		UsageText:                 "gorun [flags] PROGRAM [ARGS...]\n\nFlags take one or two dashes (-np 4 = --np 4); everything from PROGRAM on belongs to the program.",
		HideHelpCommand:           true,
		DisableSliceFlagSeparator: true,
		Writer:                    stdout,
		ErrWriter:                 stderr,
		Flags:                     flags(),
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return usageError{fmt.Errorf("%w (see gorun --help)", err)}
		},
		ExitErrHandler: func(*cli.Context, error) {},
		Action: func(c *cli.Context) error {
			if c.Bool("version") {
				gpus := "none found (no /dev/nvidiaN)"
				if n := mpirun.HostGPUs(); n > 0 {
					gpus = fmt.Sprintf("%d (/dev/nvidia0..%d)", n, n-1)
				}
				fmt.Fprint(stdout, version.String("gorun", gpus))
				return nil
			}
			if c.Bool(mpirun.AgentFlag) {
				return runAgent(c, environ, stdin, &status)
			}
			if c.Bool(mpirun.ReaperFlag) {
				status = mpirun.RunReaper(c.Duration("grace"), stdin)
				return nil
			}
			cfg, err := config(c, environ)
			if err != nil {
				return usageError{err}
			}
			cfg.MCA = mca
			cfg.Stdin, cfg.Stdout, cfg.Stderr = stdin, stdout, stderr
			if cfg.StdinRank < 0 {
				cfg.Stdin = nil
			}
			if self, err := os.Executable(); err == nil {
				cfg.Reaper = self
			}
			if !cfg.DryRun {
				cfg.Signals = make(chan os.Signal, 4)
				sigs := []os.Signal{syscall.SIGINT, syscall.SIGTERM}
				if !signal.Ignored(syscall.SIGHUP) {
					// under nohup (the lab's habit) SIGHUP stays ignored, by
					// gorun and by the ranks, which inherit that
					sigs = append(sigs, syscall.SIGHUP)
				}
				signal.Notify(cfg.Signals, sigs...)
				defer signal.Stop(cfg.Signals)
			}
			code, err := mpirun.Run(cfg)
			status = code
			if err != nil {
				fmt.Fprintln(stderr, "gorun: "+err.Error())
			}
			return nil
		},
	}
	if err := app.Run(args); err != nil {
		fmt.Fprintln(stderr, "gorun: "+err.Error())
		var ue usageError
		if errors.As(err, &ue) {
			return mpirun.ExitUsage
		}
		return 1
	}
	return status
}

func flags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "np", Aliases: []string{"n"}, Usage: "`N` ranks (default: every slot of the hosts; without hosts, the CPU count)"},
		&cli.StringFlag{Name: "hostfile", Aliases: []string{"machinefile"}, Usage: "hosts, one a line: `FILE` in OpenMPI (host slots=N max_slots=M) or Horovod (host:N) syntax"},
		&cli.StringSliceFlag{Name: "H", Aliases: []string{"host"}, Usage: "hosts as a `LIST` like host1:2,host2:2 (a host without :N has 1 slot)"},
		&cli.BoolFlag{Name: "oversubscribe", Usage: "allow more ranks than slots (never more than max_slots)"},
		&cli.IntFlag{Name: "npernode", Aliases: []string{"N", "nproc-per-node", "nproc_per_node"}, Usage: "exactly `N` ranks on every host (mpirun -N, torchrun --nproc-per-node); -np defaults to N x hosts"},
		&cli.StringFlag{Name: "bind-to", Value: "none", Usage: "`WHAT` to bind ranks to: gorun binds nothing (mpirun's none); core and socket are accepted with a note"},
		&cli.BoolFlag{Name: "allow-run-as-root", Usage: "accepted for mpirun habits (gorun runs as root without it)"},
		&cli.BoolFlag{Name: "version", Usage: "print the version, commit, Go version, CPU features and GPUs found"},
		&cli.StringFlag{Name: "map-by", Value: mpirun.MapBySlot, Usage: "`POLICY` slot: fill a host's slots before the next; node: round-robin over hosts; ppr:N:node: N ranks on every host (as -N N)"},
		&cli.StringSliceFlag{Name: "x", Usage: "export `NAME[=VALUE]` to every rank (repeatable; NAME alone takes gorun's value)"},
		&cli.StringFlag{Name: "wdir", Usage: "working `DIR` of every rank (default: gorun's, the same path on remote hosts)"},
		&cli.IntFlag{Name: "ssh-port", Aliases: []string{"p"}, Usage: "ssh `PORT` of the remote hosts"},
		&cli.StringFlag{Name: "ssh-identity", Aliases: []string{"i"}, Usage: "ssh identity `FILE` (ssh -i)"},
		&cli.StringFlag{Name: "ssh-args", Usage: "extra ssh `ARGS`, split like a shell does (e.g. \"-F ./ssh_config -o StrictHostKeyChecking=no\")"},
		&cli.StringFlag{Name: "launch-agent", Usage: "use `CMD` instead of ssh, invoked as CMD host remote-command (OpenMPI's plm_rsh_agent)"},
		&cli.StringFlag{Name: "remote-gorun", Usage: "`PATH` of gorun on remote hosts, run as the remote agent (default: this gorun's path)"},
		&cli.StringFlag{Name: "iface", Usage: "`ADDR`, interface name or list (eth0,ens5; eth*; ^docker*,lo; 10.0.0.0/24) the ranks bind and advertise and the rendezvous is served on (GORUN_IFACE; --mca btl_tcp_if_include, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME and HOROVOD_GLOO_IFACE choose it too)"},
		&cli.StringFlag{Name: "port-range", Usage: "`LO-HI`: every port the job listens on comes from this range: the rendezvous's UDP port, and each rank's UDP and TCP port (default: any free port; env " + rank.EnvPortRange + ")"},
		&cli.StringFlag{Name: "rendezvous-addr", Usage: "`IP[:PORT]` to serve the rendezvous on (default: loopback for local jobs, else the source address of the route to the first remote host)"},
		&cli.BoolFlag{Name: "tag-output", Usage: "tag lines as mpirun does: [1,RANK]<stdout>: (default tag: [RANK] )"},
		&cli.StringFlag{Name: "tag", Value: mpirun.TagRank, Usage: "output tag `STYLE`: rank ([3] line), mpi ([1,3]<stdout>:line) or none"},
		&cli.StringFlag{Name: "output-dir", Aliases: []string{"output-filename"}, Usage: "also write each rank's output to `DIR`/rank.N/stdout and stderr"},
		&cli.StringFlag{Name: "stdin", Value: "0", Usage: "`RANK` that receives gorun's stdin, or none"},
		&cli.DurationFlag{Name: "grace", Value: mpirun.DefaultGrace, Usage: "`DURATION` between SIGTERM and SIGKILL when stopping ranks (a rank that exits sooner is not waited for; a second signal to gorun kills at once)"},
		&cli.DurationFlag{Name: "timeout", Usage: "stop the job after this `DURATION` (exit status 124)"},
		&cli.IntFlag{Name: "max-restarts", Usage: "when a rank fails, stop the job and start it again, up to `N` times (torchrun's --max-restarts; the ranks see GORUN_RESTART=1, 2, ...)"},
		&cli.BoolFlag{Name: "dry-run", Usage: "print the placement and each rank's command (secret redacted), start nothing"},
		&cli.BoolFlag{Name: "display-map", Usage: "print the placement as mpirun's JOB MAP (hosts, slots, ranks) before starting"},
		&cli.BoolFlag{Name: "report-bindings", Usage: "print mpirun's line for each rank as it starts: gorun binds none"},
		&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "print the commands and lifecycle events on stderr"},
		// The remote agent (started by gorun through ssh; not for people).
		&cli.BoolFlag{Name: mpirun.AgentFlag, Hidden: true},
		&cli.IntFlag{Name: "agent-stdin", Value: -1, Hidden: true},
		&cli.StringFlag{Name: "ranks", Hidden: true},
		&cli.BoolFlag{Name: "cuda-local", Hidden: true},
		&cli.BoolFlag{Name: mpirun.ReaperFlag, Hidden: true},
	}
}

// config is the job that the command line and gorun's environment
// (environ) ask for.
func config(c *cli.Context, environ []string) (mpirun.Config, error) {
	cfg := mpirun.Config{Environ: environ}
	lookupEnv := func(name string) (string, bool) { return mpirun.LookupEnv(environ, name) }
	if c.NArg() == 0 {
		return cfg, fmt.Errorf("no program to run (usage: gorun [flags] PROGRAM [ARGS...])")
	}
	cfg.Program = c.Args().First()
	cfg.Args = c.Args().Tail()
	cfg.NP = c.Int("np")
	if c.IsSet("np") && cfg.NP < 1 {
		return cfg, fmt.Errorf("-np %d: need at least 1 rank", cfg.NP)
	}
	hf, hl := c.String("hostfile"), c.StringSlice("H")
	if hf != "" && len(hl) > 0 {
		return cfg, fmt.Errorf("give hosts with -hostfile or with -H, not both")
	}
	if hf != "" {
		hosts, err := mpirun.ReadHostfile(hf)
		if err != nil {
			return cfg, err
		}
		cfg.Hosts = hosts
	}
	if len(hl) > 0 {
		hosts, err := mpirun.ParseHostList(strings.Join(hl, ","))
		if err != nil {
			return cfg, err
		}
		cfg.Hosts = hosts
	}
	if hf == "" && len(hl) == 0 {
		// Inside a Slurm allocation (salloc, a batch script) the hosts and
		// slots are the allocation's, as with OpenMPI's mpirun; remote ranks
		// start with srun unless ssh or a launch agent is asked for.
		alloc, ok, err := mpirun.SlurmHosts(lookupEnv)
		if err != nil {
			return cfg, err
		}
		if ok {
			cfg.Hosts = alloc.Hosts
			srun := !c.IsSet("launch-agent") && !c.IsSet("ssh-args") && !c.IsSet("ssh-identity") && !c.IsSet("ssh-port")
			if srun {
				cfg.LaunchAgent = mpirun.SlurmLaunchAgent
			}
			fmt.Fprintln(c.App.ErrWriter, "gorun: "+alloc.Line(srun))
		}
	}
	cfg.Oversubscribe = c.Bool("oversubscribe")
	cfg.PerNode = c.Int("npernode")
	if c.IsSet("npernode") && cfg.PerNode < 1 {
		return cfg, fmt.Errorf("-N %d: need at least 1 rank per host", cfg.PerNode)
	}
	cfg.MapBy = c.String("map-by")
	cfg.Export = c.StringSlice("x")
	cfg.Dir = c.String("wdir")
	cfg.SSHPort = c.Int("ssh-port")
	cfg.SSHIdentity = c.String("ssh-identity")
	cfg.SSHArgs = c.String("ssh-args")
	if c.IsSet("launch-agent") || cfg.LaunchAgent == "" {
		cfg.LaunchAgent = c.String("launch-agent")
	}
	cfg.RemoteGorun = c.String("remote-gorun")
	cfg.Iface = c.String("iface")
	cfg.RendezvousAddr = c.String("rendezvous-addr")
	cfg.IfaceVars = map[string]string{}
	for _, name := range mpirun.IfaceVars {
		if v, ok := lookupEnv(name); ok {
			cfg.IfaceVars[name] = v
		}
	}
	pr, from := c.String("port-range"), "--port-range "
	if !c.IsSet("port-range") {
		pr, _ = lookupEnv(rank.EnvPortRange)
		from = rank.EnvPortRange + "="
	}
	ports, err := rank.ParsePortRange(pr)
	if err != nil {
		return cfg, fmt.Errorf("%s%w", from, err)
	}
	cfg.PortRange = ports
	cfg.BindTo = c.String("bind-to")
	cfg.Tag = c.String("tag")
	if c.Bool("tag-output") {
		cfg.Tag = mpirun.TagMPI
	}
	cfg.OutputDir = c.String("output-dir")
	switch s := c.String("stdin"); s {
	case "none", "":
		cfg.StdinRank = -1
	default:
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return cfg, fmt.Errorf("--stdin %q: want a rank or none", s)
		}
		cfg.StdinRank = n
	}
	cfg.Grace = c.Duration("grace")
	if cfg.Grace <= 0 {
		return cfg, fmt.Errorf("--grace %s: want a positive duration", cfg.Grace)
	}
	cfg.Timeout = c.Duration("timeout")
	if cfg.Timeout < 0 {
		return cfg, fmt.Errorf("--timeout %s is negative", cfg.Timeout)
	}
	cfg.MaxRestarts = c.Int("max-restarts")
	if cfg.MaxRestarts < 0 {
		return cfg, fmt.Errorf("--max-restarts %d is negative", cfg.MaxRestarts)
	}
	cfg.DryRun = c.Bool("dry-run")
	cfg.Verbose = c.Bool("verbose")
	cfg.DisplayMap = c.Bool("display-map")
	cfg.ReportBindings = c.Bool("report-bindings")
	return cfg, nil
}

func runAgent(c *cli.Context, environ []string, stdin io.Reader, status *int) error {
	if c.NArg() == 0 {
		return usageError{fmt.Errorf("--%s needs a program", mpirun.AgentFlag)}
	}
	ranks, err := mpirun.ParseAgentRanks(c.String("ranks"))
	if err != nil {
		return usageError{err}
	}
	*status = mpirun.RunAgent(mpirun.AgentConfig{
		Grace:     c.Duration("grace"),
		Ranks:     ranks,
		StdinRank: c.Int("agent-stdin"),
		CUDALocal: c.Bool("cuda-local"),
		Prog:      c.Args().First(),
		Args:      c.Args().Tail(),
		Environ:   environ,
	}, stdin, os.Stdout, os.Stderr)
	return nil
}

// mcaArgs takes OpenMPI's --mca KEY VALUE (and -mca, --gmca) out of
// gorun's own flags, which end at the program, for package mpirun: the
// ones that name interfaces choose the ranks' interface, the others are
// dropped with a note.
func mcaArgs(args []string) ([]string, []mpirun.MCAParam) {
	valueFlags := map[string]bool{}
	for _, f := range flags() {
		if _, isBool := f.(*cli.BoolFlag); isBool {
			continue
		}
		for _, n := range f.Names() {
			valueFlags[n] = true
		}
	}
	out := []string{args[0]}
	var mca []mpirun.MCAParam
	for i := 1; i < len(args); i++ {
		a := args[i]
		name := strings.TrimLeft(a, "-")
		if !strings.HasPrefix(a, "-") || a == "--" {
			return append(out, args[i:]...), mca // the program and its arguments
		}
		if (name == "mca" || name == "gmca") && i+2 < len(args) {
			mca = append(mca, mpirun.MCAParam{Flag: a, Key: args[i+1], Value: args[i+2]})
			i += 2
			continue
		}
		out = append(out, a)
		if valueFlags[name] && !strings.Contains(name, "=") && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	return out, mca
}
