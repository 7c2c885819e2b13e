// Command ring passes a token around the ranks of a job and then meets at a
// barrier: the smallest program that proves the launcher, the rendezvous and
// the authenticated mesh work.
//
//	bin/gorun -np 4 bin/ring
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/gorun/gorun/internal/envconf"
	"github.com/gorun/gorun/internal/version"
	"github.com/gorun/gorun/rank"
)

var errPrinted = errors.New("(printed)")

func main() {
	rounds := flag.Int("rounds", 3, "times the token goes around the ring")
	size := flag.Int("bytes", 8, "token size in bytes (>= 8)")
	hold := flag.Duration("hold", 0, "sleep this long before the barrier (for tests)")
	failRank := flag.Int("fail-rank", -1, "this rank exits with status 3 before the barrier (for tests)")
	timeout := flag.Duration("timeout", 0, "give up waiting on a peer after this long (default 60s or GORUN_TIMEOUT)")
	showVersion := flag.Bool("version", false, "print the version, commit, Go version and CPU features")
	flag.Parse()
	if *showVersion {
		fmt.Print(version.String("ring", ""))
		return
	}
	if err := run(*rounds, *size, *hold, *failRank, *timeout); err != nil {
		if err != errPrinted {
			fmt.Fprintln(os.Stderr, "ring:", err)
		}
		os.Exit(1)
	}
}

func run(rounds, size int, hold time.Duration, failRank int, timeout time.Duration) (err error) {
	if size < 8 {
		size = 8
	}
	id, err := rank.FromEnv()
	if err != nil {
		return err
	}
	ctx := context.Background()
	start := time.Now()
	opt, err := envconf.Mesh(os.LookupEnv, rank.Options{Timeout: timeout})
	if err != nil {
		return err
	}
	m, err := rank.Connect(ctx, id, opt)
	if err != nil {
		return err
	}
	defer func() {
		// Say what failed before closing: a launcher may stop this process
		// as soon as its peers notice the closed connections.
		if err != nil {
			fmt.Fprintln(os.Stderr, "ring:", err)
			err = errPrinted
		}
		m.Close()
	}()
	connected := time.Since(start)
	me, n := id.Rank, id.Size
	next, prev := (me+1)%n, (me+n-1)%n
	buf := make([]byte, size)
	var lap time.Duration
	for r := 0; r < rounds; r++ {
		tag := rank.Tag{Seq: uint64(r), Kind: 1}
		t0 := time.Now()
		if n == 1 {
			binary.LittleEndian.PutUint64(buf, 0)
		} else if me == 0 {
			binary.LittleEndian.PutUint64(buf, 0)
			if err := m.Send(ctx, next, 0, tag, buf); err != nil {
				return err
			}
			if err := m.Recv(ctx, prev, 0, tag, buf); err != nil {
				return err
			}
		} else {
			if err := m.Recv(ctx, prev, 0, tag, buf); err != nil {
				return err
			}
			binary.LittleEndian.PutUint64(buf, binary.LittleEndian.Uint64(buf)+uint64(me))
			if err := m.Send(ctx, next, 0, tag, buf); err != nil {
				return err
			}
		}
		lap = time.Since(t0)
		if me == 0 {
			got, want := binary.LittleEndian.Uint64(buf), uint64(n*(n-1)/2)
			if got != want {
				return fmt.Errorf("round %d: token came back with sum %d, want %d", r, got, want)
			}
		}
	}
	if me == 0 {
		fmt.Printf("ring: token of %d bytes went %d times around %d ranks (sum %d ok); connect %.1f ms, last lap %.3f ms\n",
			size, rounds, n, n*(n-1)/2, connected.Seconds()*1e3, lap.Seconds()*1e3)
	}
	if hold > 0 {
		time.Sleep(hold)
	}
	if me == failRank {
		fmt.Fprintf(os.Stderr, "ring: rank %d failing on purpose (--fail-rank)\n", me)
		os.Exit(3)
	}
	if err := barrier(ctx, m); err != nil {
		return err
	}
	fmt.Printf("rank %d of %d (local %d, host %s, launcher %s): barrier passed\n", me, n, id.LocalRank, m.HostNames()[me], id.Launcher)
	return nil
}

// barrier: everyone reports to rank 0, then rank 0 releases everyone.
func barrier(ctx context.Context, m *rank.Mesh) error {
	n := m.Size()
	tag := rank.Tag{Seq: 1 << 40, Kind: 2}
	if m.Rank() == 0 {
		for p := 1; p < n; p++ {
			if err := m.Recv(ctx, p, 1, tag, nil); err != nil {
				return err
			}
		}
		for p := 1; p < n; p++ {
			if err := m.Send(ctx, p, 1, tag, nil); err != nil {
				return err
			}
		}
		return nil
	}
	if err := m.Send(ctx, 0, 1, tag, nil); err != nil {
		return err
	}
	return m.Recv(ctx, 0, 1, tag, nil)
}
