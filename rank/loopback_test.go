package rank

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
)

// loopbackGroup is ranktest.Loopback for this package's own tests, which
// cannot import ranktest (it imports rank): n meshes of this process over
// sockets on 127.0.0.1, shared memory off unless opt asks for it.
func loopbackGroup(ctx context.Context, n int, opt Options) ([]Transport, error) {
	if n < 1 {
		return nil, fmt.Errorf("loopback group of %d ranks", n)
	}
	secret, _ := hex.DecodeString(NewSecret())
	var rdvAddr string
	if n > 1 {
		rdv, err := ListenRendezvous("127.0.0.1:0", n, secret)
		if err != nil {
			return nil, err
		}
		defer rdv.Close()
		rdvAddr = rdv.Addr()
	}
	if opt.SharedMemory == "" {
		opt.SharedMemory = "off"
	}
	meshes := make([]*Mesh, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			id := Identity{Rank: r, Size: n, LocalRank: r, LocalSize: n, Rendezvous: rdvAddr,
				Secret: secret, Launcher: "loopback", Host: "localhost"}
			meshes[r], errs[r] = Connect(ctx, id, opt)
		}(r)
	}
	wg.Wait()
	out := make([]Transport, n)
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

// closeAll is ranktest.CloseAll: the meshes close at once, not each
// waiting for its peers in turn.
func closeAll(ts []Transport) {
	var wg sync.WaitGroup
	for _, t := range ts {
		if t == nil {
			continue
		}
		wg.Add(1)
		go func(t Transport) { defer wg.Done(); t.Close() }(t)
	}
	wg.Wait()
}

// envShmCMA is GORUN_SHM_CMA, which the two-process tests set for both
// processes (internal/envconf declares it for programs).
const envShmCMA = "GORUN_SHM_CMA"

// envOptions fills opt as a program's edge does (internal/envconf.Mesh,
// which imports this package) from the variables the two-process tests set
// for both processes: GORUN_SHM, GORUN_TRANSPORT, GORUN_SHM_CMA and
// GORUN_SHM_DIR.
func envOptions(opt Options) Options {
	if opt.SharedMemory == "" {
		opt.SharedMemory = os.Getenv(EnvShm)
	}
	if opt.Transport == "" {
		opt.Transport = os.Getenv(EnvTransport)
	}
	if v := os.Getenv(envShmCMA); v == "1" || v == "on" || v == "true" {
		opt.SingleCopy = true
	}
	if opt.ShmDir == "" {
		opt.ShmDir = os.Getenv("GORUN_SHM_DIR")
	}
	return opt
}
