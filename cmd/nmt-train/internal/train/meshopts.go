package train

import (
	"context"
	"os"
	"time"

	"github.com/gorun/gorun/internal/envconf"
	"github.com/gorun/gorun/rank"
)

// connect joins the job's mesh with the settings gorun's variables ask for
// (envconf.Mesh) and timeout, which wins over GORUN_TIMEOUT.
func (t *Trainer) connect(ctx context.Context, timeout time.Duration) (*rank.Mesh, error) {
	opt, err := envconf.Mesh(os.LookupEnv, rank.Options{Timeout: timeout})
	if err != nil {
		return nil, err
	}
	return rank.Connect(ctx, t.id, opt)
}
