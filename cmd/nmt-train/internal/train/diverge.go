package train

import (
	"fmt"
	"path/filepath"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/transformer"
)

// Divergence: a loss, weight or Adam moment that is not finite ends the
// run at that step, with nothing saved (divergedError).

// divergedError ends a run that diverged: a loss, weight or Adam moment
// that is not finite, at a step in the log's numbering. Every rank meets
// it at the same step (the loss is all ranks', the weights and moments are
// the same on every rank), and only rank 0 prints it (see run). Nothing of
// the diverged state is saved: latest keeps naming the last good
// checkpoint.
type divergedError struct {
	step   int
	what   string
	latest string // rank 0: what latest names, for the line
}

func (e *divergedError) Error() string {
	return fmt.Sprintf("step %d: diverged: %s; nothing saved (%s); try a smaller --learning-rate or more --warmup-steps", e.step, e.what, e.latest)
}

// diverged is the error that stops a run diverged at step.
func (t *Trainer) diverged(step int, what string) error {
	e := &divergedError{step: step, what: what, latest: "no checkpoint yet"}
	if t.leader() {
		if ck, err := checkpoint.Latest(t.o.RunDir); err == nil {
			e.latest = "latest still names " + filepath.Base(ck)
		}
	}
	return e
}

// firstNonFinite names the first NaN or infinite value of x, a tensor laid
// out like the weights (prefix "m/" or "v/" for Adam's moments). It copies
// x to the host: for the error, not for the check.
func (t *Trainer) firstNonFinite(x kernels.Tensor, prefix string) string {
	host := make([]float32, x.Len())
	t.m.Backend().Download(host, x)
	if e := transformer.FirstNonFinite(t.m, prefix, host); e != nil {
		return e.Error()
	}
	return "a value that is not finite"
}
