//go:build linux

package rank

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// echoRound sends message i (n bytes) to the "echo" child and returns a
// channel that gets the result of receiving it back.
func echoRound(t *testing.T, m *Mesh, i, n int) <-chan error {
	t.Helper()
	ctx := context.Background()
	if err := sendHeader(ctx, m, i, n, 0); err != nil {
		t.Fatal(err)
	}
	if err := m.Send(ctx, 1, 1, Tag{Seq: uint64(i), Chunk: 1}, pattern(i, n)); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- m.Recv(ctx, 1, 1, Tag{Seq: uint64(i), Chunk: 2}, make([]byte, n)) }()
	return errc
}

// stopChild stops the child with SIGSTOP and waits until it is stopped
// (the signal is delivered asynchronously).
func stopChild(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Process.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGCONT) })
	for i := 0; !processStopped(cmd.Process.Pid); i++ {
		if i == 1000 {
			t.Fatal("the child did not stop")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPausedPeerSurvivesQUIC (issue 15, defect 2): a rank across hosts
// (QUIC) paused for longer than the 15 s the QUIC idle timeout used to be
// capped at, but for less than the mesh timeout, costs a wait, not the job:
// keep-alives decide whether a connection is alive, the timeout decides
// when a wait is too long.
func TestPausedPeerSurvivesQUIC(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 17 s")
	}
	t.Setenv(EnvShm, "0")
	m, cmd, _, out := startChildTimeout(t, "echo", 30*time.Second, 30*time.Second)
	if tr := m.PeerTransport(1); tr != "quic" {
		t.Fatalf("rank 0 reaches rank 1 over %s", tr)
	}
	if err := <-echoRound(t, m, 0, 1000); err != nil {
		t.Fatal(err)
	}
	stopChild(t, cmd)
	errc := echoRound(t, m, 1, 1000)
	const pause = 17 * time.Second // more than the old 15 s cap
	select {
	case err := <-errc:
		t.Fatalf("the wait for a paused rank ended after less than %v: %v\nchild: %s", pause, err, out)
	case <-time.After(pause):
	}
	cmd.Process.Signal(syscall.SIGCONT)
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("after the pause: %v\nchild: %s", err, out)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no answer 10 s after the paused rank continued\nchild: %s", out)
	}
	if err := <-echoRound(t, m, 2, 100000); err != nil {
		t.Fatalf("the connection is broken after the pause: %v\nchild: %s", err, out)
	}
}

// TestStoppedPeerBlamedAtTimeout: a stopped rank (SIGSTOP: a frozen
// process, as good as dead to its peers) is named when the wait for it
// reaches the timeout, over QUIC (it stops answering keep-alives) and
// through shared memory (its process state says so), and the error says
// how long this rank really waited.
func TestStoppedPeerBlamedAtTimeout(t *testing.T) {
	const timeout = 2 * time.Second
	for _, k := range []struct{ shm, want string }{{"0", "sent nothing"}, {"1", "is stopped"}} {
		t.Run(map[string]string{"0": "quic", "1": "shm"}[k.shm], func(t *testing.T) {
			t.Setenv(EnvShm, k.shm)
			m, cmd, _, out := startChildTimeout(t, "echo", timeout, timeout)
			if err := <-echoRound(t, m, 0, 10); err != nil {
				t.Fatal(err)
			}
			stopChild(t, cmd)
			start := time.Now()
			var err error
			select {
			case err = <-echoRound(t, m, 1, 10):
			case <-time.After(4 * timeout):
				t.Fatalf("still waiting for the stopped rank after %v\nchild: %s", 4*timeout, out)
			}
			d := time.Since(start)
			var pe *PeerError
			if !errors.As(err, &pe) || pe.Peer != 1 || !strings.Contains(err.Error(), k.want) {
				t.Fatalf("want an error naming rank 1 that %s, got %v", k.want, err)
			}
			if d < timeout {
				t.Errorf("gave up after %v, before the timeout (%v)", d, timeout)
			}
			if !strings.Contains(err.Error(), "waited "+pe.Waited.Round(100*time.Millisecond).String()) || pe.Waited < timeout || pe.Waited > d {
				t.Errorf("the error does not say how long rank 0 waited (%v, measured %v): %v", pe.Waited, d, err)
			}
			t.Logf("after %v: %v", d, err)
		})
	}
}

// TestLivePeerGetsLonger: a wait for a rank that is alive (it answers
// keep-alives, or its process runs) but sends nothing lasts up to twice the
// timeout, so that the rank it waits for, if it is waiting itself, can
// report whom it waits for; past that the live rank is named.
func TestLivePeerGetsLonger(t *testing.T) {
	const timeout = time.Second
	for _, shm := range []string{"0", "1"} {
		t.Run(map[string]string{"0": "quic", "1": "shm"}[shm], func(t *testing.T) {
			t.Setenv(EnvShm, shm)
			m, _, _, out := startChildTimeout(t, "echo", timeout, 10*time.Second)
			ctx := context.Background()
			late := func(i int, delay time.Duration) error {
				if err := sendHeader(ctx, m, i, int(delay/time.Millisecond), 2); err != nil {
					t.Fatal(err)
				}
				return m.Recv(ctx, 1, 1, Tag{Seq: uint64(i), Chunk: 2}, nil)
			}
			if err := late(0, timeout+timeout/2); err != nil {
				t.Fatalf("an answer %v after the timeout from a live rank was lost: %v\nchild: %s", timeout/2, err, out)
			}
			start := time.Now()
			err := late(1, 4*timeout)
			d := time.Since(start)
			var pe *PeerError
			if !errors.As(err, &pe) || pe.Peer != 1 || !strings.Contains(err.Error(), "alive") {
				t.Fatalf("want an error naming rank 1 as alive but silent, got %v", err)
			}
			if d < 2*timeout {
				t.Errorf("gave up on a live rank after %v, before twice the timeout", d)
			}
			t.Logf("after %v: %v", d, err)
		})
	}
}
