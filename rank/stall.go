package rank

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/rank/internal/waitctx"
)

// How a wait ends (every transport: socket lanes, shared-memory rings, the
// shared-memory group).
//
// A wait that makes no progress for the timeout (Options.Timeout,
// GORUN_TIMEOUT, or WithTimeout's value for one call) asks whether the peer
// it waits for is alive:
//
//   - a peer that is stopped (SIGSTOP, a debugger: its process state says
//     so on this host), dead (its pidfd), or silent (over QUIC: nothing
//     received from it, not even an answer to a keep-alive, for half the
//     timeout) is named at once: it is the rank that froze or died;
//   - a peer that is alive (it answers keep-alives, or its process runs) is
//     most likely waiting itself, for the rank that really froze, and will
//     say so in an abort that reaches this wait as a message: the wait goes
//     on, up to twice the timeout, and only then names the live peer;
//   - a peer whose liveness is unknown (another host with
//     GORUN_TRANSPORT=tcp, which connects no QUIC; the in-process
//     transports) is named at the timeout. With the default (auto) the
//     QUIC connections stay open whichever transport carries the data, so
//     their keep-alives tell.
//
// So whichever rank's wait ends first, and whatever algorithm made the
// ranks wait for each other, the rank named is the frozen or dead one. The
// QUIC idle timeout is three times the timeout, past any wait: keep-alives
// keep a connection to a live but quiet peer open however long it is quiet,
// and a paused peer costs a wait, never the connection.

// WithTimeout returns a context whose Send and Recv calls (on a Mesh, on
// ranktest.InMemory's transports, or in the shared-memory group) wait at
// most d without progress, instead of the transport's timeout, before they
// ask whether the peer is alive (see above). d <= 0 leaves ctx unchanged.
func WithTimeout(ctx context.Context, d time.Duration) context.Context {
	return waitctx.With(ctx, d)
}

// keepAlivePeriod is how often an idle QUIC connection is pinged (each side
// pings when it has received nothing for this long, and the peer's ACK
// answers): an eighth of the timeout, within [25ms, 2s].
func keepAlivePeriod(timeout time.Duration) time.Duration {
	return min(max(timeout/8, 25*time.Millisecond), 2*time.Second)
}

// silentAfter is how long a QUIC peer must have sent nothing at all for a
// wait to call it silent: half the timeout (and half the wait's own, if
// longer), and at least four keep-alive periods.
func silentAfter(timeout time.Duration) time.Duration {
	return max(timeout/2, 4*keepAlivePeriod(timeout))
}

// liveTimeoutFactor: a wait for a live peer lasts up to this many timeouts.
const liveTimeoutFactor = 2

type liveness int

const (
	liveUnknown liveness = iota
	liveAlive
	liveSilent  // QUIC: nothing received for silentAfter
	liveStopped // its process is stopped
	liveDead    // its process is gone
)

// liveness says whether peer is alive (for a wait with the given timeout);
// for liveSilent also for how long nothing came from it.
func (m *Mesh) liveness(peer int, timeout time.Duration) (liveness, time.Duration) {
	if sp := m.shmPeer(peer); sp != nil {
		if !sp.alive() {
			return liveDead, 0
		}
		if processStopped(sp.pid) {
			return liveStopped, 0
		}
		return liveAlive, 0
	}
	if m.live == nil {
		return liveUnknown, 0
	}
	silent := m.sampleLive(peer)
	if silent >= max(timeout/2, silentAfter(m.opt.Timeout)) {
		return liveSilent, silent
	}
	return liveAlive, silent
}

// processStopped reports whether process pid (on this host) is stopped
// (state T: SIGSTOP, SIGTSTP; t: stopped by a tracer).
func processStopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold anything
	if i < 0 || i+2 >= len(s) {
		return false
	}
	return s[i+2] == 'T' || s[i+2] == 't'
}

// stallError ends a wait that made no progress for the timeout. Waited is
// how long the wait really went without progress.
type stallError struct {
	msg    string
	waited time.Duration
}

func (e *stallError) Error() string { return e.msg }
func (e *stallError) Timeout() bool { return true }

// round is d as messages print it.
func round(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }

// judge is asked when a wait for peer has made no progress for idle (at
// least timeout): it returns how long to wait before asking again, or the
// error that ends the wait.
func (m *Mesh) judge(peer int, idle, timeout time.Duration) (time.Duration, error) {
	if idle < timeout {
		return timeout - idle, nil
	}
	live, silent := m.liveness(peer, timeout)
	pid := ""
	if sp := m.shmPeer(peer); sp != nil {
		pid = fmt.Sprintf(" (pid %d)", sp.pid)
	}
	waited := fmt.Sprintf("waited %s (timeout %s)", round(idle), timeout)
	var msg string
	switch live {
	case liveAlive:
		if idle < liveTimeoutFactor*timeout {
			return min(keepAlivePeriod(timeout), liveTimeoutFactor*timeout-idle), nil
		}
		msg = fmt.Sprintf("waited %s (timeout %s, doubled for a live rank): rank %d is alive but sent nothing", round(idle), timeout, peer)
	case liveSilent:
		msg = fmt.Sprintf("%s: rank %d sent nothing for %s, not even keep-alives (stopped, dead or cut off)", waited, peer, round(silent))
	case liveStopped:
		msg = fmt.Sprintf("%s: rank %d%s is stopped (SIGSTOP or a debugger)", waited, peer, pid)
	case liveDead:
		msg = fmt.Sprintf("%s: rank %d%s died", waited, peer, pid)
	default:
		msg = waited + " with no progress"
	}
	return 0, &stallError{msg: msg, waited: idle}
}

// unknownStall is the error of a wait that cannot go on past idle, whatever
// the peer's state (a deadline that the stall judge did not set, or the
// in-process transport's wait).
func unknownStall(idle, timeout time.Duration) error {
	return &stallError{msg: fmt.Sprintf("waited %s (timeout %s) with no progress", round(idle), timeout), waited: idle}
}

// startLiveness starts sampling what each QUIC peer sends: the time its
// connections' received-packet counts last moved is the time it was last
// heard from (keep-alives make a live peer heard at least every keep-alive
// period).
func (m *Mesh) startLiveness() {
	m.live = make([]peerLive, m.id.Size)
	now := time.Now().UnixNano()
	for p := range m.live {
		m.live[p].heard = now
	}
	tick := keepAlivePeriod(m.opt.Timeout) / 2
	go func() {
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-m.closed:
				return
			case <-t.C:
				for p := range m.live {
					if p != m.id.Rank {
						m.sampleLive(p)
					}
				}
			}
		}
	}()
}

type peerLive struct {
	packets uint64
	heard   int64 // unix nanoseconds
}

// sampleLive updates what is known of peer's packets and returns for how
// long nothing has come from it.
func (m *Mesh) sampleLive(peer int) time.Duration {
	m.mu.Lock()
	var sum uint64
	for _, c := range m.pconns[peer] {
		sum += c.ConnectionStats().PacketsReceived
	}
	pl := &m.live[peer]
	now := time.Now()
	if sum != pl.packets {
		pl.packets, pl.heard = sum, now.UnixNano()
	}
	heard := pl.heard
	m.mu.Unlock()
	return now.Sub(time.Unix(0, heard))
}
