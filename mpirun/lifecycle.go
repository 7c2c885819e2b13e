package mpirun

import (
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/words"
	"github.com/gorun/gorun/rank"
)

// One start of a job: the rendezvous, MASTER_ADDR and MASTER_PORT, the
// start of every rank, and the watch over them: the first failure, a
// signal to gorun, its output's reader gone or --timeout stops every rank
// (SIGTERM, then SIGKILL after --grace), and how the job ended is gorun's
// exit status.

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
				return ExitSetup, fmt.Errorf("--output-dir: %w", err)
			}
		}
	}
	if cfg.Verbose {
		fmt.Fprintf(cfg.Stderr, "gorun: job %s: %s on %s, rendezvous %s\n", p.jobID, words.Plural(len(p.specs), "rank"), words.Plural(p.hosts, "host"), rdv.Addr())
		p.printCommands(cfg.Stderr, "gorun: ", port)
	}

	var rp *reaper
	if cfg.Reaper != "" {
		if rp, err = startReaper(cfg.Reaper, cfg.Grace, cfg.Environ); err != nil {
			return ExitSetup, fmt.Errorf("cannot start the reaper %s: %w", cfg.Reaper, err)
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
		fmt.Fprintf(cfg.Stderr, "gorun: %s killed with SIGKILL%s\n", rank.List(killed), killWhy)
		if byGorun {
			status = ExitKilled
		}
	}
	if startErr {
		return ExitSetup, nil
	}
	return status, nil
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
