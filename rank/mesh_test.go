package rank

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"
)

func group(t *testing.T, n int, opt Options) []Transport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g, err := loopbackGroup(ctx, n, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(g) })
	return g
}

// Every rank sends a distinct message to every other rank on every channel,
// concurrently, and checks what it receives.
func TestMeshAllPairs(t *testing.T) {
	for _, tr := range []string{"quic", "tcp"} {
		for _, n := range []int{1, 2, 3, 5} {
			t.Run(fmt.Sprintf("%s/np%d", tr, n), func(t *testing.T) {
				g := group(t, n, Options{Transport: tr, ConnsPerPeer: 2, Channels: 3, Timeout: 10 * time.Second})
				ctx := context.Background()
				msg := func(from, to, ch, i int) []byte {
					r := rand.New(rand.NewSource(int64(from*1000 + to*100 + ch*10 + i)))
					b := make([]byte, r.Intn(200000))
					r.Read(b)
					return b
				}
				var wg sync.WaitGroup
				errc := make(chan error, 1000)
				for me := 0; me < n; me++ {
					for p := 0; p < n; p++ {
						if p == me {
							continue
						}
						for ch := 0; ch < g[me].Channels(); ch++ {
							wg.Add(2)
							go func(me, p, ch int) {
								defer wg.Done()
								for i := 0; i < 3; i++ {
									if err := g[me].Send(ctx, p, ch, Tag{Seq: uint64(i), Kind: 7, Chunk: uint32(ch)}, msg(me, p, ch, i)); err != nil {
										errc <- err
										return
									}
								}
							}(me, p, ch)
							go func(me, p, ch int) {
								defer wg.Done()
								for i := 0; i < 3; i++ {
									want := msg(p, me, ch, i)
									got := make([]byte, len(want))
									if err := g[me].Recv(ctx, p, ch, Tag{Seq: uint64(i), Kind: 7, Chunk: uint32(ch)}, got); err != nil {
										errc <- err
										return
									}
									if !bytes.Equal(got, want) {
										errc <- fmt.Errorf("rank %d from %d ch %d msg %d: wrong bytes", me, p, ch, i)
									}
								}
							}(me, p, ch)
						}
					}
				}
				wg.Wait()
				close(errc)
				for err := range errc {
					t.Error(err)
				}
				if n > 1 {
					s := g[0].Stats()
					if s[1].BytesSent == 0 || s[1].BytesRecv == 0 || s[0].BytesSent != 0 {
						t.Errorf("byte counters look wrong: %+v", s)
					}
				}
			})
		}
	}
}

func TestMeshMismatchNamesBothRanks(t *testing.T) {
	g := group(t, 2, Options{Timeout: 5 * time.Second})
	ctx := context.Background()
	go g[0].Send(ctx, 1, 0, Tag{Seq: 4, Kind: 1}, make([]byte, 16))
	err := g[1].Recv(ctx, 0, 0, Tag{Seq: 5, Kind: 1}, make([]byte, 16))
	var me *MismatchError
	if !errors.As(err, &me) || me.Got.Seq != 4 || me.Want.Seq != 5 {
		t.Fatalf("want a MismatchError seq 4 vs 5, got %v", err)
	}
	if !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), "rank 0") {
		t.Errorf("error does not name both ranks: %v", err)
	}
	// Length mismatch: the lane stays framed, so the next message still arrives.
	go func() {
		g[0].Send(ctx, 1, 0, Tag{Seq: 6}, make([]byte, 10))
		g[0].Send(ctx, 1, 0, Tag{Seq: 7}, []byte("hello"))
	}()
	if err := g[1].Recv(ctx, 0, 0, Tag{Seq: 6}, make([]byte, 12)); !errors.As(err, &me) || me.GotLen != 10 {
		t.Fatalf("want a length mismatch, got %v", err)
	}
	b := make([]byte, 5)
	if err := g[1].Recv(ctx, 0, 0, Tag{Seq: 7}, b); err != nil || string(b) != "hello" {
		t.Fatalf("lane out of step after a mismatch: %v %q", err, b)
	}
}

func TestMeshRecvTimeoutNamesPeer(t *testing.T) {
	g := group(t, 2, Options{Timeout: 700 * time.Millisecond})
	start := time.Now()
	err := g[0].Recv(context.Background(), 1, 1, Tag{Seq: 1}, make([]byte, 4))
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Peer != 1 || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("want a timeout PeerError naming rank 1, got %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("timeout took %v", d)
	}
	// ctx cancellation ends a wait early too.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	if err := g[0].Recv(ctx, 1, 0, Tag{}, make([]byte, 4)); !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
}

func TestMeshPeerClosedIsAnError(t *testing.T) {
	for _, tr := range []string{"quic", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			g := group(t, 3, Options{Transport: tr, Timeout: 8 * time.Second})
			done := make(chan error, 1)
			go func() { done <- g[0].Recv(context.Background(), 2, 0, Tag{}, make([]byte, 1<<20)) }()
			time.Sleep(100 * time.Millisecond)
			g[2].Close()
			select {
			case err := <-done:
				var pe *PeerError
				if !errors.As(err, &pe) || pe.Peer != 2 {
					t.Fatalf("want PeerError naming rank 2, got %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("recv from a closed peer hung")
			}
		})
	}
}

// TestMeshCancelAfterWaitsUnderOneContext: a lane arms its cut once per
// context, so a wait that blocks after others under the same context
// completed still ends as soon as that context is cancelled, and a
// later wait under another context still completes. (A stray cut of that
// later wait would not show here: the wait's stall judge re-arms its
// deadline and it carries on.)
func TestMeshCancelAfterWaitsUnderOneContext(t *testing.T) {
	for _, tr := range []string{"quic", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			g := group(t, 2, Options{Transport: tr, Timeout: time.Minute})
			exchange := func(ctx context.Context, seq uint64) error {
				errc := make(chan error, 1)
				go func() { errc <- g[1].Send(ctx, 0, 0, Tag{Seq: seq}, make([]byte, 100<<10)) }()
				if err := g[0].Recv(ctx, 1, 0, Tag{Seq: seq}, make([]byte, 100<<10)); err != nil {
					return err
				}
				return <-errc
			}
			first, cancelFirst := context.WithCancel(context.Background())
			for seq := range uint64(3) {
				if err := exchange(first, seq); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan error, 1)
			go func() { done <- g[0].Recv(first, 1, 0, Tag{Seq: 3}, make([]byte, 4)) }()
			time.Sleep(50 * time.Millisecond)
			cancelFirst()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("want context.Canceled, got %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a Recv under a cancelled context went on waiting")
			}
			// The cancelled context's cut stays armed on the lane until a wait
			// under another context replaces it; this one still completes.
			second, cancelSecond := context.WithCancel(context.Background())
			defer cancelSecond()
			go func() {
				time.Sleep(100 * time.Millisecond)
				g[1].Send(second, 0, 0, Tag{Seq: 4}, []byte("late"))
			}()
			b := make([]byte, 4)
			if err := g[0].Recv(second, 1, 0, Tag{Seq: 4}, b); err != nil || string(b) != "late" {
				t.Fatalf("a Recv under a live context after another was cancelled: %v %q", err, b)
			}
		})
	}
}

// TestMeshSendMore: messages sent with SendMore, gathered behind the next,
// arrive whole and in order with those sent with Send, at every size
// against the sealed lane's gathering buffer, over both transports.
func TestMeshSendMore(t *testing.T) {
	for _, tr := range []string{"quic", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			g := group(t, 2, Options{Transport: tr, Timeout: 20 * time.Second})
			ctx := context.Background()
			sizes := []int{0, 1, 24, 16 << 10, 87 << 10, 87 << 10, sealRecord, 100, sealRecord + 3, 3 * sealRecord, 5}
			r := rand.New(rand.NewSource(3))
			msgs := make([][]byte, len(sizes))
			for i, n := range sizes {
				msgs[i] = make([]byte, n)
				r.Read(msgs[i])
			}
			errc := make(chan error, 1)
			go func() {
				more := g[0].(MoreSender)
				for i, m := range msgs {
					send := more.SendMore
					if i%4 == 3 || i == len(msgs)-1 {
						send = g[0].Send
					}
					if err := send(ctx, 1, 0, Tag{Seq: uint64(i)}, m); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			for i, m := range msgs {
				got := make([]byte, len(m))
				if err := g[1].Recv(ctx, 0, 0, Tag{Seq: uint64(i)}, got); err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				if !bytes.Equal(got, m) {
					t.Fatalf("message %d (%d bytes) differs", i, len(m))
				}
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		})
	}
}
