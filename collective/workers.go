package collective

import "sync/atomic"

// The goroutines that run a call's senders and receivers (run.goFn) are
// kept for the next call. A new goroutine starts on a small stack and
// grows it, copying it each time, when its first Send or Recv goes down
// through the transport and the cipher: at np 2, 1 MiB between hosts that
// was 2.4 % of a rank's CPU (docs/performance.md, "AEGIS on the lanes").
// A worker that has run its function waits for the next; at most maxIdle
// wait, and any more end.
const maxIdle = 64

var (
	work = make(chan func()) // unbuffered: a send succeeds only into a waiting worker
	idle atomic.Int32        // workers waiting on work
)

// spawn runs f on a waiting worker, or on a new goroutine that then
// becomes one.
func spawn(f func()) {
	select {
	case work <- f:
	default:
		go worker(f)
	}
}

func worker(f func()) {
	for {
		f()
		f = nil // hold nothing of the call while waiting
		if idle.Add(1) > maxIdle {
			idle.Add(-1)
			return
		}
		f = <-work
		idle.Add(-1)
	}
}
