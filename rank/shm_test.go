//go:build linux

package rank

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// shmGroup is a loopback group whose ranks reach each other through shared
// memory (each segment in dir, so that the test can see what stays behind).
func shmGroup(t *testing.T, n int, opt Options) ([]Transport, string) {
	t.Helper()
	dir := t.TempDir()
	opt.SharedMemory, opt.ShmDir = "on", dir
	g := group(t, n, opt)
	for r := range g {
		for p := range g {
			if want, got := map[bool]string{true: "self", false: "shm"}[p == r], g[r].(*Mesh).PeerTransport(p); got != want {
				t.Fatalf("rank %d reaches rank %d over %s, want %s", r, p, got, want)
			}
		}
	}
	return g, dir
}

func shmFiles(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

var (
	patOnce sync.Once
	patBase []byte
)

// pattern returns n bytes that differ with seed (a read-only view of one
// random buffer, which keeps the race-detected tests fast).
func pattern(seed, n int) []byte {
	patOnce.Do(func() {
		patBase = make([]byte, 10<<20)
		rand.New(rand.NewSource(1)).Read(patBase)
	})
	off := (seed * 4099) % (1 << 20)
	return patBase[off : off+n : off+n]
}

// Every pair exchanges bulk (several times the ring) and small messages on
// every channel at once, both ways.
func TestShmAllPairs(t *testing.T) {
	for _, mode := range []string{"ring", "cma"} {
		t.Run(mode, func(t *testing.T) {
			testShmAllPairs(t, mode)
		})
	}
}

func testShmAllPairs(t *testing.T, mode string) {
	const n, msgs = 3, 6
	g, dir := shmGroup(t, n, Options{Channels: 3, Timeout: 20 * time.Second, SingleCopy: mode == "cma"})
	if got, want := g[0].(*Mesh).shmPeer(1).peerReads.Load() == 1, mode == "cma"; got != want {
		t.Fatalf("single copy in use: %v, want %v", got, want)
	}
	if f := shmFiles(t, dir); len(f) != 0 {
		t.Errorf("segments left in %s after the handshake: %v", dir, f)
	}
	size := func(from, to, ch, i int) int {
		switch i % 3 {
		case 0:
			return 2*shmRingBytes + 12345*(ch+1) // bigger than the ring, odd length
		case 1:
			return i + from // tiny, 0 included
		}
		return 100000 + to
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	errc := make(chan error, 1000)
	for me := 0; me < n; me++ {
		for p := 0; p < n; p++ {
			if p == me {
				continue
			}
			for ch := 0; ch < g[me].Channels(); ch++ {
				wg.Add(2)
				go func() {
					defer wg.Done()
					for i := 0; i < msgs; i++ {
						if err := g[me].Send(ctx, p, ch, Tag{Seq: uint64(i), Chunk: uint32(ch)}, pattern(me*1000+p*100+ch*10+i, size(me, p, ch, i))); err != nil {
							errc <- err
							return
						}
					}
				}()
				go func() {
					defer wg.Done()
					for i := 0; i < msgs; i++ {
						want := pattern(p*1000+me*100+ch*10+i, size(p, me, ch, i))
						got := make([]byte, len(want))
						if err := g[me].Recv(ctx, p, ch, Tag{Seq: uint64(i), Chunk: uint32(ch)}, got); err != nil {
							errc <- err
							return
						}
						if !bytes.Equal(got, want) {
							errc <- fmt.Errorf("rank %d from %d channel %d message %d: wrong bytes", me, p, ch, i)
						}
					}
				}()
			}
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	// Every byte is counted, header included, per peer.
	var total uint64
	for ch := 0; ch < 3; ch++ {
		for i := 0; i < msgs; i++ {
			total += uint64(headerBytes + size(0, 1, ch, i))
		}
	}
	if s := g[0].Stats(); s[1].BytesSent != total || s[0].BytesSent != 0 {
		t.Errorf("rank 0 counted %+v, want %d bytes sent to rank 1", s, total)
	}
	if s := g[1].Stats(); s[0].BytesRecv != total {
		t.Errorf("rank 1 counted %+v, want %d bytes received from rank 0", s, total)
	}
}

func TestShmMismatch(t *testing.T) {
	g, _ := shmGroup(t, 2, Options{Timeout: 10 * time.Second})
	ctx := context.Background()
	go g[0].Send(ctx, 1, 0, Tag{Seq: 4, Kind: 1}, make([]byte, 16))
	err := g[1].Recv(ctx, 0, 0, Tag{Seq: 5, Kind: 1}, make([]byte, 16))
	var me *MismatchError
	if !errors.As(err, &me) || me.Got.Seq != 4 || me.Want.Seq != 5 || me.Peer != 0 || me.Self != 1 {
		t.Fatalf("want a MismatchError seq 4 vs 5, got %v", err)
	}
	// A length mismatch on a message bigger than the ring: the payload is
	// skipped and the next message arrives intact.
	big := pattern(1, 2*shmRingBytes+7)
	go func() {
		g[0].Send(ctx, 1, 1, Tag{Seq: 6}, big)
		g[0].Send(ctx, 1, 1, Tag{Seq: 7}, []byte("hello"))
	}()
	if err := g[1].Recv(ctx, 0, 1, Tag{Seq: 6}, make([]byte, 12)); !errors.As(err, &me) || me.GotLen != len(big) || me.WantLen != 12 {
		t.Fatalf("want a length mismatch, got %v", err)
	}
	b := make([]byte, 5)
	if err := g[1].Recv(ctx, 0, 1, Tag{Seq: 7}, b); err != nil || string(b) != "hello" {
		t.Fatalf("ring out of step after a mismatch: %v %q", err, b)
	}
}

func TestShmTimeoutAndCancel(t *testing.T) {
	g, _ := shmGroup(t, 2, Options{Timeout: 600 * time.Millisecond})
	start := time.Now()
	err := g[0].Recv(context.Background(), 1, 1, Tag{Seq: 1}, make([]byte, 4))
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Peer != 1 || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("want a timeout PeerError naming rank 1, got %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("timeout took %v", d)
	}
	// A full ring: Send times out too.
	err = g[0].Send(context.Background(), 1, 0, Tag{}, make([]byte, 2*shmRingBytes))
	if !errors.As(err, &pe) || pe.Peer != 1 || pe.Op != "send" || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("want a send timeout naming rank 1, got %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	if err := g[1].Recv(ctx, 0, 1, Tag{}, make([]byte, 4)); !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
}

// A single-copy Send that gives up retracts its message: the receiver gets
// an error, never bytes from memory the sender no longer owns, and the
// channel keeps working.
func TestShmSendCancelled(t *testing.T) {
	g, _ := shmGroup(t, 2, Options{Timeout: 20 * time.Second, SingleCopy: true})
	if g[0].(*Mesh).shmPeer(1).peerReads.Load() != 1 {
		t.Skip("process_vm_readv is not allowed here: no single-copy path to test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	big := pattern(5, 3*shmCMAMin)
	if err := g[0].Send(ctx, 1, 0, Tag{Seq: 1}, big); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want the send to time out, got %v", err)
	}
	err := g[1].Recv(context.Background(), 0, 0, Tag{Seq: 1}, make([]byte, len(big)))
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Peer != 0 || !strings.Contains(err.Error(), "gave up") {
		t.Fatalf("want an error saying rank 0 gave up, got %v", err)
	}
	for i := 2; i < 5; i++ {
		go g[0].Send(context.Background(), 1, 0, Tag{Seq: uint64(i)}, big)
		got := make([]byte, len(big))
		if err := g[1].Recv(context.Background(), 0, 0, Tag{Seq: uint64(i)}, got); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("message %d after a retracted one: %v", i, err)
		}
	}
}

// Messages sent before a Close are still delivered; after them the peer's
// Recv fails naming the rank that closed, and so does a Send to it.
func TestShmPeerClosed(t *testing.T) {
	g, _ := shmGroup(t, 3, Options{Timeout: 20 * time.Second})
	ctx := context.Background()
	msg := pattern(3, shmCMAMin-1) // buffered in the ring (a bigger one would wait for the reader)
	if err := g[2].Send(ctx, 0, 0, Tag{Seq: 1}, msg); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- g[1].Recv(ctx, 2, 1, Tag{}, make([]byte, 1<<20)) }()
	time.Sleep(100 * time.Millisecond)
	g[2].Close()
	select {
	case err := <-done:
		var pe *PeerError
		if !errors.As(err, &pe) || pe.Peer != 2 || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("want PeerError naming rank 2, got %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("recv from a closed peer hung")
	}
	got := make([]byte, len(msg))
	if err := g[0].Recv(ctx, 2, 0, Tag{Seq: 1}, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("message sent before Close lost: %v", err)
	}
	if err := g[0].Recv(ctx, 2, 0, Tag{Seq: 2}, got); err == nil {
		t.Fatal("recv after the peer's last message and Close succeeded")
	}
	if err := g[0].Send(ctx, 2, 0, Tag{Seq: 2}, got); err == nil || !strings.Contains(err.Error(), "rank 2") {
		t.Fatalf("send to a closed peer: %v", err)
	}
	// The closed rank's own calls fail, without touching the unmapped segment.
	if err := g[2].Send(ctx, 0, 0, Tag{}, got); err == nil {
		t.Fatal("send on a closed mesh succeeded")
	}
}

func TestShmOffFallsBackToSockets(t *testing.T) {
	g := group(t, 2, Options{SharedMemory: "off", Timeout: 10 * time.Second})
	if tr := g[0].(*Mesh).PeerTransport(1); tr != "quic" {
		t.Fatalf("with shared memory off rank 0 reaches rank 1 over %s", tr)
	}
	go g[0].Send(context.Background(), 1, 0, Tag{Seq: 9}, []byte("x"))
	if err := g[1].Recv(context.Background(), 0, 0, Tag{Seq: 9}, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := loopbackGroup(context.Background(), 2, Options{SharedMemory: "maybe"}); err == nil || err.Error() != `Options.SharedMemory="maybe": want on or off (1 or 0)` {
		t.Fatalf("bad Options.SharedMemory accepted: %v", err)
	}
}

// Two real processes: this test binary re-executed as rank 1.
const (
	shmChildEnv        = "GORUN_SHM_TEST_CHILD"
	shmChildTimeoutEnv = "GORUN_SHM_TEST_TIMEOUT" // the child's mesh timeout (default 20s)
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(shmChildEnv); mode != "" {
		if err := shmChild(mode); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func childIdentity(rank int) (Identity, error) {
	secret, err := hex.DecodeString(os.Getenv(EnvSecret))
	if err != nil {
		return Identity{}, err
	}
	return Identity{Rank: rank, Size: 2, LocalRank: rank, LocalSize: 2, Rendezvous: os.Getenv(EnvRendezvous),
		Secret: secret, JobID: "shmtest", Launcher: "test", Host: "localhost"}, nil
}

// shmChild is rank 1: "echo" returns every message it gets until a message
// with Kind 1 (a header of kind 2 asks for an empty answer after a delay);
// "stall" receives one message and then waits to be killed.
func shmChild(mode string) error {
	id, err := childIdentity(1)
	if err != nil {
		return err
	}
	ctx := context.Background()
	timeout := 20 * time.Second
	if d, err := time.ParseDuration(os.Getenv(shmChildTimeoutEnv)); err == nil {
		timeout = d
	}
	m, err := Connect(ctx, id, envOptions(Options{Timeout: timeout})) // GORUN_SHM from the parent
	if err != nil {
		return err
	}
	defer m.Close()
	if want, _ := shmEnabled(os.Getenv(EnvShm)); want && m.PeerTransport(0) != "shm" {
		return fmt.Errorf("reaches rank 0 over %s", m.PeerTransport(0))
	}
	switch mode {
	case "pong": // 8-byte ping-pong on channel 0 until the parent hangs up
		var b [8]byte
		for i := 0; ; i++ {
			if err := m.Recv(ctx, 0, 0, Tag{Seq: uint64(i)}, b[:]); err != nil {
				return nil
			}
			if err := m.Send(ctx, 0, 0, Tag{Seq: uint64(i)}, b[:]); err != nil {
				return nil
			}
		}
	case "sink": // receive GORUN_SHM_TEST_SIZE-byte messages, acknowledge each
		var n int
		fmt.Sscan(os.Getenv("GORUN_SHM_TEST_SIZE"), &n)
		buf := make([]byte, n)
		for i := 0; ; i++ {
			if err := m.Recv(ctx, 0, 0, Tag{Seq: uint64(i)}, buf); err != nil {
				return nil
			}
			if err := m.Send(ctx, 0, 1, Tag{Seq: uint64(i)}, buf[:1]); err != nil {
				return nil
			}
		}
	}
	buf := make([]byte, 8<<20)
	for i := 0; ; i++ {
		var hdr [12]byte // size, kind
		if err := m.Recv(ctx, 0, 0, Tag{Seq: uint64(i)}, hdr[:]); err != nil {
			return err
		}
		n, kind := int(leU64(hdr[:8])), leU64(hdr[8:])
		if kind == 1 {
			return nil
		}
		if kind == 2 { // answer with an empty message after n milliseconds
			time.Sleep(time.Duration(n) * time.Millisecond)
			if err := m.Send(ctx, 0, 1, Tag{Seq: uint64(i), Chunk: 2}, nil); err != nil {
				return err
			}
			continue
		}
		if err := m.Recv(ctx, 0, 1, Tag{Seq: uint64(i), Chunk: 1}, buf[:n]); err != nil {
			return err
		}
		if mode == "stall" {
			time.Sleep(time.Hour)
		}
		if err := m.Send(ctx, 0, 1, Tag{Seq: uint64(i), Chunk: 2}, buf[:n]); err != nil {
			return err
		}
	}
}

func leU64(b []byte) uint64 {
	var v uint64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

func putU64(b []byte, v uint64) {
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
}

// startChild serves a rendezvous, starts rank 1 in a child process and
// connects as rank 0; the child's output collects in the buffer.
func startChild(t testing.TB, mode string) (*Mesh, *exec.Cmd, string, *testenv.Buffer) {
	t.Helper()
	return startChildTimeout(t, mode, 20*time.Second, 20*time.Second)
}

// startChildTimeout is startChild with the mesh timeout of this rank set
// to timeout and that of the child to childTimeout.
func startChildTimeout(t testing.TB, mode string, timeout, childTimeout time.Duration) (*Mesh, *exec.Cmd, string, *testenv.Buffer) {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("GORUN_SHM_DIR", dir)
	if os.Getenv(EnvShm) == "" {
		t.Setenv(EnvShm, "1")
	}
	secretHex := NewSecret()
	secret, _ := hex.DecodeString(secretHex)
	rdv, err := ListenRendezvous("127.0.0.1:0", 2, secret)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdv.Close() })
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), shmChildEnv+"="+mode, EnvSecret+"="+secretHex, EnvRendezvous+"="+rdv.Addr(), "GORUN_SHM_DIR="+dir,
		shmChildTimeoutEnv+"="+childTimeout.String())
	var out testenv.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id := Identity{Rank: 0, Size: 2, LocalSize: 2, Rendezvous: rdv.Addr(), Secret: secret, JobID: "shmtest", Launcher: "test", Host: "localhost"}
	m, err := Connect(ctx, id, envOptions(Options{Timeout: timeout}))
	if err != nil {
		t.Fatalf("%v\nchild: %s", err, out.String())
	}
	t.Cleanup(func() { m.Close() })
	if want, _ := shmEnabled(os.Getenv(EnvShm)); want && m.PeerTransport(1) != "shm" {
		t.Fatalf("rank 0 reaches rank 1 over %s", m.PeerTransport(1))
	}
	if f := shmFiles(t, dir); len(f) != 0 {
		t.Errorf("segments left in %s after the handshake: %v", dir, f)
	}
	return m, cmd, dir, &out
}

func sendHeader(ctx context.Context, m *Mesh, i, n int, kind uint64) error {
	var hdr [12]byte
	putU64(hdr[:8], uint64(n))
	putU64(hdr[8:], kind)
	return m.Send(ctx, 1, 0, Tag{Seq: uint64(i)}, hdr[:])
}

func TestShmTwoProcesses(t *testing.T) {
	for _, mode := range []string{"ring", "cma"} {
		t.Run(mode, func(t *testing.T) { testShmTwoProcesses(t, mode) })
	}
}

func testShmTwoProcesses(t *testing.T, mode string) {
	t.Setenv(envShmCMA, map[string]string{"ring": "0", "cma": "1"}[mode]) // the child inherits it
	m, cmd, dir, out := startChild(t, "echo")
	if got, want := m.shmPeer(1).peerReads.Load() == 1, mode == "cma"; got != want {
		t.Fatalf("single copy to the child in use: %v, want %v", got, want)
	}
	ctx := context.Background()
	sizes := []int{0, 1, 24, 4093, shmRingBytes, 5*shmRingBytes + 3, 8 << 20}
	for i := 0; i < 200; i++ {
		n := 8 + i%64
		if i < len(sizes) {
			n = sizes[i]
		}
		msg := pattern(i, n)
		if err := sendHeader(ctx, m, i, n, 0); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- m.Send(ctx, 1, 1, Tag{Seq: uint64(i), Chunk: 1}, msg) }()
		got := make([]byte, n)
		if err := m.Recv(ctx, 1, 1, Tag{Seq: uint64(i), Chunk: 2}, got); err != nil {
			t.Fatalf("message %d (%d bytes): %v\nchild: %s", i, n, err, out)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("message %d (%d bytes) came back different", i, n)
		}
	}
	if err := sendHeader(ctx, m, 200, 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if s := m.Stats()[1]; s.BytesSent == 0 || s.BytesRecv == 0 {
		t.Errorf("no shared-memory bytes counted: %+v", s)
	}
	if f := shmFiles(t, dir); len(f) != 0 {
		t.Errorf("segments left in %s: %v", dir, f)
	}
}

// kill -9 of the peer in the middle of a message: the waiting side fails
// naming it long before the mesh timeout, whether it sends or receives.
func TestShmPeerKilled(t *testing.T) {
	for _, tc := range []string{"send/ring", "recv/ring", "send/cma", "recv/cma"} {
		t.Run(tc, func(t *testing.T) {
			side, copyMode, _ := strings.Cut(tc, "/")
			t.Setenv(envShmCMA, map[string]string{"ring": "0", "cma": "1"}[copyMode])
			mode := map[string]string{"send": "stall", "recv": "echo"}[side]
			m, cmd, dir, out := startChild(t, mode)
			ctx := context.Background()
			n := 4 * shmRingBytes
			if err := sendHeader(ctx, m, 0, n, 0); err != nil {
				t.Fatal(err)
			}
			// The child reads the whole message; then it either stalls
			// ("send": our next message fills the ring and blocks) or
			// echoes it ("recv": its Send blocks with a ring full of the
			// message's first part, as we do not read yet).
			if err := m.Send(ctx, 1, 1, Tag{Seq: 0, Chunk: 1}, make([]byte, n)); err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			if side == "send" {
				go func() { errc <- m.Send(ctx, 1, 0, Tag{Seq: 1}, make([]byte, n)) }()
			}
			time.Sleep(300 * time.Millisecond)
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait() // gone: a message it posted whole could still be read until then
			start := time.Now()
			if side == "recv" {
				go func() { errc <- m.Recv(ctx, 1, 1, Tag{Seq: 0, Chunk: 2}, make([]byte, n)) }()
			}
			select {
			case err := <-errc:
				var pe *PeerError
				if !errors.As(err, &pe) || pe.Peer != 1 || !strings.Contains(err.Error(), "died") {
					t.Fatalf("want a PeerError saying rank 1 died, got %v\nchild: %s", err, out)
				}
				if d := time.Since(start); d > 15*time.Second {
					t.Errorf("death noticed after %v (mesh timeout 20s)", d)
				}
			case <-time.After(19 * time.Second):
				t.Fatal("the survivor waited for the killed peer until the mesh timeout")
			}
			if f := shmFiles(t, dir); len(f) != 0 {
				t.Errorf("segments left in %s after kill -9: %v", dir, f)
			}
		})
	}
}

// BenchmarkShmTwoProcesses measures what BenchmarkP2PShm measures, but
// between two processes (this binary re-executed as rank 1), for shared
// memory and for QUIC and TCP on loopback, side by side:
//
//	go test -run '^$' -bench ShmTwoProcesses ./rank/
func BenchmarkShmTwoProcesses(b *testing.B) {
	for _, tr := range []struct{ name, shm, transport, cma string }{
		{"shm", "1", "quic", "0"}, {"shm-cma", "1", "quic", "1"}, {"quic", "0", "quic", "0"}, {"tcp", "0", "tcp", "0"},
	} {
		b.Run(tr.name+"/rtt-8B", func(b *testing.B) {
			b.Setenv(EnvShm, tr.shm)
			b.Setenv(EnvTransport, tr.transport)
			b.Setenv(envShmCMA, tr.cma)
			m, _, _, _ := startChild(b, "pong")
			var buf [8]byte
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := m.Send(context.Background(), 1, 0, Tag{Seq: uint64(i)}, buf[:]); err != nil {
					b.Fatal(err)
				}
				if err := m.Recv(context.Background(), 1, 0, Tag{Seq: uint64(i)}, buf[:]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N), "us/rtt")
		})
		for _, size := range []int{1 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("%s/%dMiB", tr.name, size>>20), func(b *testing.B) {
				b.Setenv(EnvShm, tr.shm)
				b.Setenv(EnvTransport, tr.transport)
				b.Setenv(envShmCMA, tr.cma)
				b.Setenv("GORUN_SHM_TEST_SIZE", fmt.Sprint(size))
				m, _, _, _ := startChild(b, "sink")
				src := make([]byte, size)
				for i := range src {
					src[i] = byte(i)
				}
				var ack [1]byte
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := m.Send(context.Background(), 1, 0, Tag{Seq: uint64(i)}, src); err != nil {
						b.Fatal(err)
					}
					if err := m.Recv(context.Background(), 1, 1, Tag{Seq: uint64(i)}, ack[:]); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}
