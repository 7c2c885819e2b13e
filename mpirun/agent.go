package mpirun

import (
	"bufio"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
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

// The remote agent is gorun itself, started on a remote host by ssh (or by
// --launch-agent) as
//
//	cd DIR && exec env NAME=VALUE... GORUN --internal-remote-agent [--grace D] [--agent-stdin] -- PROG ARGS
//
// Its stdin is the control channel from the launcher: the first line is the
// job secret (so it never appears in a command line); the lines after it are
//
//	s N        send signal N to the program's process group
//	i BASE64   bytes for the program's stdin (only with --agent-stdin)
//	e          end of the program's stdin
//
// and the end of the channel (the launcher or its ssh is gone) stops the
// program: SIGTERM, then SIGKILL after the grace period. SIGTERM, SIGINT and
// SIGHUP to the agent do the same. The agent reports to the launcher on its
// stderr with lines that start with agentMark, which the launcher swallows.

// AgentFlag is the hidden command-line flag that makes gorun the remote agent.
const AgentFlag = "internal-remote-agent"

const agentMark = "\x1fgorun-agent "

// AgentConfig is what the remote agent is told on its command line.
type AgentConfig struct {
	Grace time.Duration
	Stdin bool // forward 'i' lines to the program's stdin
	Prog  string
	Args  []string
}

// RunAgent runs the remote agent and returns the exit status for the agent
// process: the program's, or 128+N if it died of signal N.
func RunAgent(cfg AgentConfig, ctl io.Reader, stderr io.Writer) int {
	report := func(format string, a ...any) {
		fmt.Fprintf(stderr, agentMark+format+"\n", a...)
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 5 * time.Second
	}
	br := bufio.NewReader(ctl)
	secret, err := br.ReadString('\n')
	secret = strings.TrimSpace(secret)
	if err != nil {
		report("error no job secret on stdin (the remote agent is started by gorun, not by hand)")
		return 127
	}
	if b, err := hex.DecodeString(secret); err != nil || len(b) < 16 {
		report("error malformed job secret on stdin")
		return 127
	}
	os.Setenv(rank.EnvSecret, secret)

	cmd := exec.Command(cfg.Prog, cfg.Args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = procAttr(syscall.SIGKILL)
	var stdinW io.WriteCloser
	if cfg.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			report("error %v", err)
			return 127
		}
		cmd.Stdin, stdinW = r, w
		defer r.Close()
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		host, _ := os.Hostname()
		report("error cannot start %s on %s: %v", cfg.Prog, host, unwrapExec(err))
		return 127
	}
	if r, ok := cmd.Stdin.(*os.File); ok {
		r.Close()
	}
	pgid := cmd.Process.Pid
	report("started %d", pgid)

	var once sync.Once
	stop := func() { // SIGTERM now, SIGKILL after the grace period
		once.Do(func() {
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			time.AfterFunc(cfg.Grace, func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
		})
	}
	go func() {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				stop()
				if stdinW != nil {
					stdinW.Close()
				}
				return
			}
			line = strings.TrimRight(line, "\n")
			op, arg, _ := strings.Cut(line, " ")
			switch op {
			case "s":
				if n, err := strconv.Atoi(arg); err == nil && n > 0 && n < 65 {
					_ = syscall.Kill(-pgid, syscall.Signal(n))
				}
			case "i":
				if b, err := base64.StdEncoding.DecodeString(arg); err == nil && stdinW != nil {
					_, _ = stdinW.Write(b)
				}
			case "e":
				if stdinW != nil {
					stdinW.Close()
				}
			}
		}
	}()
	go func() {
		for s := range sigs {
			_ = syscall.Kill(-pgid, s.(syscall.Signal))
			once.Do(func() {
				time.AfterFunc(cfg.Grace, func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
			})
		}
	}()
	err = cmd.Wait()
	// Nothing the rank left behind in its process group outlives it.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		report("signal %d", int(ws.Signal()))
		return 128 + int(ws.Signal())
	}
	if err != nil && cmd.ProcessState == nil {
		report("error %v", err)
		return 127
	}
	return cmd.ProcessState.ExitCode()
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
