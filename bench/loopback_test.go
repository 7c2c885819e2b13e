package bench

import (
	"context"
	"os"

	"github.com/gorun/gorun/internal/envconf"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/rank/ranktest"
)

// loopback is ranktest.Loopback with the mesh's variables read as a program
// reads them (envconf.Mesh), so that GORUN_QUIC_GRO, GORUN_TCP_CIPHER and
// the like reach the benchmarks; the fields a benchmark sets win.
func loopback(ctx context.Context, np int, opt rank.Options) ([]rank.Transport, error) {
	opt, err := envconf.Mesh(os.LookupEnv, opt)
	if err != nil {
		return nil, err
	}
	return ranktest.Loopback(ctx, np, opt)
}
