package ranktest

import (
	"context"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/gorun/gorun/rank"
)

// Loopback connects n meshes inside this process that talk to each other
// over real sockets on 127.0.0.1 (QUIC or TLS/TCP as opt says; shared
// memory only when opt.SharedMemory asks for it), with a private
// rendezvous and a fresh job secret. It is for tests and benchmarks that
// want real transports without starting processes. Close the meshes with
// CloseAll (closing one by one waits for each peer to hang up).
func Loopback(ctx context.Context, n int, opt rank.Options) ([]rank.Transport, error) {
	if n < 1 {
		return nil, fmt.Errorf("loopback group of %d ranks", n)
	}
	secretHex := rank.NewSecret()
	secret, _ := hex.DecodeString(secretHex)
	var rdvAddr string
	if n > 1 {
		rdv, err := rank.ListenRendezvous("127.0.0.1:0", n, secret)
		if err != nil {
			return nil, err
		}
		defer rdv.Close()
		rdvAddr = rdv.Addr()
	}
	if opt.SharedMemory == "" {
		opt.SharedMemory = "off" // sockets, as the name says; ask for "on" to test shared memory
	}
	meshes := make([]*rank.Mesh, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			id := rank.Identity{Rank: r, Size: n, LocalRank: r, LocalSize: n, Rendezvous: rdvAddr,
				Secret: secret, Launcher: "loopback", Host: "localhost"}
			meshes[r], errs[r] = rank.Connect(ctx, id, opt)
		}(r)
	}
	wg.Wait()
	out := make([]rank.Transport, n)
	for r, err := range errs {
		if err != nil {
			for _, m := range meshes {
				if m != nil {
					m.Close()
				}
			}
			return nil, err
		}
		out[r] = meshes[r]
	}
	return out, nil
}

// CloseAll closes transports concurrently. Close waits for each peer to
// close its side (so that the last messages are delivered), so closing the
// ranks of one process one after another would wait needlessly.
func CloseAll(ts []rank.Transport) {
	var wg sync.WaitGroup
	for _, t := range ts {
		if t == nil {
			continue
		}
		wg.Add(1)
		go func(t rank.Transport) { defer wg.Done(); t.Close() }(t)
	}
	wg.Wait()
}
