package mpirun

import (
	"errors"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
)

// Signal notices: how a rank tells a stop signal gorun sent it from one it
// got directly.
//
// A job stopped by Slurm at its time limit, scancel, systemd
// (KillMode=control-group) or Kubernetes gets SIGTERM in every process at
// once: each rank has it directly, and again from gorun, which forwards
// what it receives. A rank that exits at a second signal (nmt-train: the
// first stops after the step with a checkpoint, a second exits at once)
// must not count gorun's copy as that second signal, and a process cannot
// ask who sent a signal (Go's os/signal gives no siginfo).
//
// So gorun (and the remote agent, for the ranks it starts) gives every
// rank a pipe, the rank's file descriptor 3, named in its environment
// (EnvSignalNotices=3), and writes on it one byte, the signal's number,
// before each stop signal (SIGINT, SIGTERM, SIGHUP) it sends the rank's
// process group. The byte is in the pipe before the kill: when the rank
// handles a signal, the notices of every signal gorun has sent so far
// are there to read, so
//
//	direct signals handled >= signals handled - notices read
//
// and a rank that exits only when signals handled - notices read >= 2
// exits on two direct signals and never on gorun's copies, whatever the
// order in which they arrive. It can miss a deliberate second signal only
// where the kernel or Go's runtime merged two of the same signal that
// arrived together (then the next one counts). No time window is involved.
//
// A program that does not read the pipe loses nothing: it gets the same
// signals as before, and gorun never waits on the pipe.

// EnvSignalNotices names, in a rank's environment, the file descriptor of
// its signal notices (see SignalNotices).
const EnvSignalNotices = "GORUN_SIGNAL_NOTICES"

// noticeFD is the rank's end of the notices: the first of ExtraFiles.
const noticeFD = 3

// isStopSignal: the signals gorun forwards to stop a job, the ones a rank
// counts; only these get a notice, so that the counts stay comparable.
func isStopSignal(sig syscall.Signal) bool {
	return sig == syscall.SIGINT || sig == syscall.SIGTERM || sig == syscall.SIGHUP
}

// noticePipe makes a rank's notice pipe: r goes to the rank as fd 3, w
// stays with gorun.
func noticePipe() (r, w *os.File, err error) {
	return os.Pipe()
}

// sendNotice writes sig's notice on w without waiting: a rank that does not
// read its pipe may let it fill, and then loses notices it does not read
// anyway. Nothing is written for signals other than the stop signals.
func sendNotice(w *os.File, sig syscall.Signal) {
	if w == nil || !isStopSignal(sig) {
		return
	}
	rc, err := w.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Write(func(fd uintptr) bool {
		_, _ = syscall.Write(int(fd), []byte{byte(sig)})
		return true // one attempt: never wait for room
	})
}

// signalGroup sends sig to the process group pgid, after its notice on w
// (nil: none).
func signalGroup(pgid int, w *os.File, sig syscall.Signal) {
	sendNotice(w, sig)
	_ = syscall.Kill(-pgid, sig)
}

// SignalNotices is a rank's end of its signal notices: how many stop
// signals gorun (or its remote agent) has sent this process so far.
type SignalNotices struct {
	fd int // -1: none (not under gorun)
	n  int
}

// OpenSignalNotices opens the notices gorun gave this process: value is
// EnvSignalNotices's in its environment ("" when it is not set), which the
// program reads at its edge. Without them (not under gorun, or the
// descriptor is not a pipe: the variable was inherited by a process that
// does not have the pipe), Forwarded is always 0.
func OpenSignalNotices(value string) *SignalNotices {
	s := &SignalNotices{fd: -1}
	fd, err := strconv.Atoi(value)
	if err != nil || fd < 0 {
		return s
	}
	var st syscall.Stat_t
	if syscall.Fstat(fd, &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		return s
	}
	syscall.CloseOnExec(fd) // the rank's own children are not told
	if syscall.SetNonblock(fd, true) != nil {
		return s
	}
	s.fd = fd
	return s
}

// Forwarded reads the notices that have arrived, without waiting, and
// returns how many there have been in all.
func (s *SignalNotices) Forwarded() int {
	if s == nil || s.fd < 0 {
		return 0
	}
	var buf [64]byte
	for {
		n, err := syscall.Read(s.fd, buf[:])
		if n > 0 {
			s.n += n
			continue
		}
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		return s.n // EAGAIN: nothing more now; 0 (EOF) or an error: no more ever
	}
}

// StopSignals counts the stop signals a rank handles, for the rule "the
// first stops gracefully, a second exits at once": signals gorun sent do
// not count as a second (see SignalNotices).
type StopSignals struct {
	notices *SignalNotices
	got     int
}

// CountStopSignals counts against notices (OpenSignalNotices; nil: none,
// as outside gorun).
func CountStopSignals(notices *SignalNotices) *StopSignals {
	return &StopSignals{notices: notices}
}

// Again is called for each stop signal the process handles; it reports
// whether this one is a second stop request: at least two of the signals
// handled so far did not come from gorun. The first signal is never one.
func (c *StopSignals) Again() bool {
	c.got++
	return c.got-c.notices.Forwarded() >= 2
}

// brokenPipe watches one of gorun's output streams: the first write that
// fails with EPIPE (its reader exited: `gorun ... | head`, an ssh session
// gone) is reported on gone, and from then on the stream's writes are
// dropped. (gorun notifies SIGPIPE, so that such a write returns EPIPE
// instead of killing it.)
type brokenPipe struct {
	w      io.Writer
	name   string
	gone   chan<- string
	broken atomic.Bool
	once   sync.Once
}

func newBrokenPipe(w io.Writer, name string, gone chan<- string) *brokenPipe {
	return &brokenPipe{w: w, name: name, gone: gone}
}

func (b *brokenPipe) Write(p []byte) (int, error) {
	if b.broken.Load() {
		return len(p), nil
	}
	n, err := b.w.Write(p)
	if err != nil && errors.Is(err, syscall.EPIPE) {
		b.broken.Store(true)
		b.once.Do(func() {
			select {
			case b.gone <- b.name:
			default:
			}
		})
		return len(p), nil
	}
	return n, err
}
