package ranktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorun/gorun/rank"
)

func TestInMemoryContract(t *testing.T) {
	g := InMemory(3, 2)
	ctx := context.Background()
	if g[1].Rank() != 1 || g[1].Size() != 3 || g[1].Channels() != 2 {
		t.Fatal("identity")
	}
	// in order, per channel, copied on send
	buf := []byte("abc")
	for i := 0; i < 5; i++ {
		buf[0] = byte('0' + i)
		if err := g[0].Send(ctx, 2, 1, rank.Tag{Seq: uint64(i)}, buf); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 5; i++ {
		dst := make([]byte, 3)
		if err := g[2].Recv(ctx, 0, 1, rank.Tag{Seq: uint64(i)}, dst); err != nil || dst[0] != byte('0'+i) {
			t.Fatalf("msg %d: %q %v", i, dst, err)
		}
	}
	// tag mismatch
	g[0].Send(ctx, 1, 0, rank.Tag{Seq: 7, Kind: 1}, nil)
	err := g[1].Recv(ctx, 0, 0, rank.Tag{Seq: 7, Kind: 2}, nil)
	var me *rank.MismatchError
	if !errors.As(err, &me) || me.Got.Kind != 1 || me.Want.Kind != 2 || me.Peer != 0 || me.Self != 1 {
		t.Fatalf("want tag mismatch, got %v", err)
	}
	// length mismatch
	g[0].Send(ctx, 1, 0, rank.Tag{Seq: 8}, make([]byte, 4))
	err = g[1].Recv(ctx, 0, 0, rank.Tag{Seq: 8}, make([]byte, 5))
	if !errors.As(err, &me) || me.GotLen != 4 || me.WantLen != 5 {
		t.Fatalf("want length mismatch, got %v", err)
	}
	// ctx cancellation of a blocked Recv
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := g[1].Recv(cctx, 2, 0, rank.Tag{}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline, got %v", err)
	}
	// a blocked Send fails once the buffer is full and ctx ends
	for i := 0; i < localDepth; i++ {
		if err := g[2].Send(ctx, 1, 1, rank.Tag{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	cctx2, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if err := g[2].Send(cctx2, 1, 1, rank.Tag{}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline on a full lane, got %v", err)
	}
	if s := g[2].Stats(); s[0].BytesRecv != 15 {
		t.Fatalf("stats %+v", s)
	}
	// Close: a peer blocked in Recv gets a PeerError naming the closed rank,
	// after the messages sent before Close are delivered.
	g[0].Send(ctx, 1, 1, rank.Tag{Seq: 1}, []byte{9})
	done := make(chan error, 1)
	go func() {
		b := make([]byte, 1)
		if err := g[1].Recv(ctx, 0, 1, rank.Tag{Seq: 1}, b); err != nil || b[0] != 9 {
			done <- err
			return
		}
		done <- g[1].Recv(ctx, 0, 1, rank.Tag{Seq: 2}, b)
	}()
	time.Sleep(20 * time.Millisecond)
	g[0].Close()
	var pe *rank.PeerError
	if err := <-done; !errors.As(err, &pe) || pe.Peer != 0 || pe.Self != 1 {
		t.Fatalf("want PeerError naming rank 0, got %v", err)
	}
	if err := g[2].Send(ctx, 0, 0, rank.Tag{}, nil); !errors.As(err, &pe) {
		t.Fatalf("send to a closed rank: %v", err)
	}
	if err := g[0].Send(ctx, 2, 0, rank.Tag{}, nil); !errors.As(err, &pe) {
		t.Fatalf("send from a closed rank: %v", err)
	}
	if err := g[0].Send(ctx, 0, 0, rank.Tag{}, nil); err == nil {
		t.Fatal("send to self accepted")
	}
}
