package transformer

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
)

// A checkpoint with a weight or an Adam moment that is not finite (a
// diverged run) is never written: SaveRunCheckpoint refuses it before
// touching the directory, naming the tensor, and latest keeps naming the
// last good checkpoint (today's code wrote it, and latest named it).
func TestSaveRefusesNonFinite(t *testing.T) {
	for _, c := range []struct {
		what   string
		poison func(m *Model, opt *Adam)
		tensor string
	}{
		{"weight +Inf", func(m *Model, _ *Adam) { m.Weights.F32[m.Params[1].Offset+2] = float32(math.Inf(1)) }, ""},
		{"first moment NaN", func(m *Model, opt *Adam) { opt.M.F32[m.Params[0].Offset] = float32(math.NaN()) }, "m/"},
		{"second moment -Inf", func(m *Model, opt *Adam) { opt.V.F32[m.Params[1].Offset+2] = float32(math.Inf(-1)) }, "v/"},
	} {
		t.Run(c.what, func(t *testing.T) {
			dir := t.TempDir()
			m, _ := New(microConfig(), cpu.New(), 1)
			opt := NewLazyAdam(m)
			if _, err := SaveRunCheckpoint(dir, "r", 1, m, opt, "v1", nil); err != nil {
				t.Fatal(err)
			}
			c.poison(m, opt)
			_, err := SaveRunCheckpoint(dir, "r", 2, m, opt, "v1", nil)
			var nf *NonFiniteError
			if !errors.As(err, &nf) {
				t.Fatalf("save of a %s: %v, want a *NonFiniteError", c.what, err)
			}
			p, idx := m.Params[1].Name, 2
			if c.tensor == "m/" {
				p, idx = m.Params[0].Name, 0
			}
			if nf.Tensor != c.tensor+p || nf.Index != idx || !strings.Contains(err.Error(), "ckpt-2: not written: tensor "+c.tensor+p) {
				t.Fatalf("error %q names tensor %q index %d, want %s%s index %d", err, nf.Tensor, nf.Index, c.tensor, p, idx)
			}
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if strings.Contains(e.Name(), "ckpt-2") {
					t.Errorf("%s written", e.Name())
				}
			}
			if ck, err := LatestCheckpoint(dir); err != nil || filepath.Base(ck) != "ckpt-1" {
				t.Fatalf("latest names %q (%v), want ckpt-1", ck, err)
			}
		})
	}
}
