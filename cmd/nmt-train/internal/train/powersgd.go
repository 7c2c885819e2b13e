package train

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/fusion"
	"github.com/gorun/gorun/transformer"
)

// PowerSGDFile is the checkpoint file that holds PowerSGD's state
// (--compression powersgd): every rank's error feedback ("error/rankR",
// they differ per rank) and Q ("q", the same on every rank), listed in
// SHA256SUMS with the checkpoint's other files.
const PowerSGDFile = "powersgd.safetensors"

// powerSGD returns the Bucketer when this run compresses with PowerSGD.
func (t *Trainer) powerSGD() *fusion.Bucketer {
	if r, ok := t.red.(*bucketReducer); ok && r.psgd {
		return r.b
	}
	return nil
}

// powerSGDLayout describes the compressed matrices (name, shape, rank):
// a checkpoint's errors and Q fit a run with the same description.
func powerSGDLayout(b *fusion.Bucketer) string {
	var s []string
	for _, m := range b.PowerSGDMatrices() {
		s = append(s, fmt.Sprintf("%s %dx%d r%d", m.Name, m.Rows, m.Cols, m.Rank))
	}
	return strings.Join(s, "; ")
}

// gatherPowerSGD runs on every rank when a checkpoint is due: the ranks'
// error feedback goes to rank 0 (one broadcast from each rank: collective
// has no gather), which returns the checkpoint file; the others return
// nil. Without PowerSGD it does nothing.
func (t *Trainer) gatherPowerSGD(ctx context.Context) (*checkpoint.File, error) {
	b := t.powerSGD()
	if b == nil {
		return nil, nil
	}
	errs, q, err := b.PowerSGDState()
	if err != nil {
		return nil, err
	}
	n := t.comm.Size()
	var f *checkpoint.File
	if t.leader() {
		f = &checkpoint.File{Name: PowerSGDFile, Meta: map[string]string{
			"format": "gorun-powersgd", "ranks": strconv.Itoa(n), "rank": strconv.Itoa(t.o.PowerSGDRank),
			"matrices": powerSGDLayout(b), "error_len": strconv.Itoa(len(errs)), "q_len": strconv.Itoa(len(q)),
		}}
	}
	var scratch []float32
	for r := 0; r < n; r++ {
		buf := errs
		if r != t.id.Rank {
			if t.leader() {
				buf = make([]float32, len(errs))
			} else {
				if scratch == nil {
					scratch = make([]float32, len(errs))
				}
				buf = scratch
			}
		}
		if err := t.comm.Broadcast(ctx, collective.Float32Bytes(buf), r); err != nil {
			return nil, fmt.Errorf("gathering PowerSGD's error feedback: %w", err)
		}
		if f != nil {
			f.Tensors = append(f.Tensors, transformer.STensor{Name: fmt.Sprintf("error/rank%d", r), Shape: []int{len(buf)}, Data: buf})
		}
	}
	if f != nil {
		f.Tensors = append(f.Tensors, transformer.STensor{Name: "q", Shape: []int{len(q)}, Data: q})
	}
	return f, nil
}

// psgdCheckpoint is a checkpoint's PowerSGD file as rank 0 read it.
type psgdCheckpoint struct {
	path   string
	rank   string // --powersgd-rank it was written with
	layout string // powerSGDLayout
	errs   [][]float32
	q      []float32
}

// readPowerSGD (rank 0, --resume) reads the checkpoint's PowerSGD file,
// checked against SHA256SUMS and whole: nil when the checkpoint has none
// or this run does not compress with PowerSGD.
func (t *Trainer) readPowerSGD(ck string) (*psgdCheckpoint, error) {
	if t.o.Compression != compressPowerSGD {
		return nil, nil
	}
	f, err := checkpoint.ReadFile(ck, PowerSGDFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("--resume: %w", err)
	}
	bad := func(what string) error { return fmt.Errorf("--resume: %s: %s", f.Path, what) }
	ranks, err1 := strconv.Atoi(f.Metadata["ranks"])
	errLen, err2 := strconv.Atoi(f.Metadata["error_len"])
	qLen, err3 := strconv.Atoi(f.Metadata["q_len"])
	if err := errors.Join(err1, err2, err3); err != nil || ranks < 1 || errLen < 0 || qLen < 0 {
		return nil, bad("its metadata (ranks, error_len, q_len) is not a PowerSGD state's")
	}
	c := &psgdCheckpoint{path: f.Path, rank: f.Metadata["rank"], layout: f.Metadata["matrices"], q: make([]float32, qLen)}
	if err := f.Read("q", []int{qLen}, c.q); err != nil {
		return nil, fmt.Errorf("--resume: %w", err)
	}
	for r := 0; r < ranks; r++ {
		e := make([]float32, errLen)
		if err := f.Read(fmt.Sprintf("error/rank%d", r), []int{errLen}, e); err != nil {
			return nil, fmt.Errorf("--resume: %w", err)
		}
		c.errs = append(c.errs, e)
	}
	if n := len(f.Names()); n != ranks+1 {
		return nil, bad(fmt.Sprintf("%d tensors, want %d ranks' errors and q", n, ranks))
	}
	for _, x := range append([][]float32{c.q}, c.errs...) {
		if !finiteAll(x) {
			return nil, bad("holds a NaN or an infinity")
		}
	}
	return c, nil
}

func finiteAll(x []float32) bool {
	for _, v := range x {
		if v-v != 0 {
			return false
		}
	}
	return true
}

// restorePowerSGD gives every rank its error feedback and Q from rank 0's
// checkpoint file c (read by readPowerSGD; nil: none). Errors of another
// number of ranks are dropped (zeros) and Q kept; errors and Q of other
// matrices (another --powersgd-rank) are dropped; each case is said in
// one line. Only rank 0 knows whether the run resumed: the ranks learn
// it in the first broadcast. Without PowerSGD it does nothing.
func (t *Trainer) restorePowerSGD(ctx context.Context, c *psgdCheckpoint) error {
	b := t.powerSGD()
	if b == nil {
		return nil
	}
	var errLen, qLen int
	for _, m := range b.PowerSGDMatrices() {
		errLen += m.Rows * m.Cols
		qLen += m.Cols * m.Rank
	}
	// rank 0 decides: [the errors fit, Q fits]
	hdr := []float32{0, 0}
	if t.leader() && t.resumedFrom >= 0 {
		switch {
		case c == nil:
			t.logf("nmt-train: powersgd: the checkpoint has no %s (written without PowerSGD): the error feedback starts from zero and Q from its seed", PowerSGDFile)
		case c.layout != powerSGDLayout(b) || len(c.q) != qLen || len(c.errs[0]) != errLen:
			t.logf("nmt-train: powersgd: the checkpoint's compressed matrices (--powersgd-rank %s) are not this run's (%d): the error feedback starts from zero and Q from its seed",
				c.rank, t.o.PowerSGDRank)
		case len(c.errs) != t.id.Size:
			hdr[1] = 1
			t.logf("nmt-train: powersgd: the checkpoint's error feedback is of %d ranks, this run has %d: the errors start from zero, Q is kept", len(c.errs), t.id.Size)
		default:
			hdr[0], hdr[1] = 1, 1
		}
	}
	if err := t.comm.Broadcast(ctx, collective.Float32Bytes(hdr), 0); err != nil {
		return fmt.Errorf("broadcast of PowerSGD's state: %w", err)
	}
	var errs, q []float32
	if hdr[1] == 1 {
		q = make([]float32, qLen)
		if t.leader() {
			copy(q, c.q)
		}
		if err := t.comm.Broadcast(ctx, collective.Float32Bytes(q), 0); err != nil {
			return fmt.Errorf("broadcast of PowerSGD's Q: %w", err)
		}
	}
	if hdr[0] == 1 {
		buf := make([]float32, errLen)
		for r := 0; r < t.id.Size; r++ {
			if t.leader() {
				copy(buf, c.errs[r])
			}
			if err := t.comm.Broadcast(ctx, collective.Float32Bytes(buf), 0); err != nil {
				return fmt.Errorf("broadcast of PowerSGD's error feedback: %w", err)
			}
			if r == t.id.Rank {
				errs = append([]float32(nil), buf...)
			}
		}
		if t.leader() {
			t.logf("nmt-train: powersgd: error feedback and Q restored from %s", filepath.Join(filepath.Base(filepath.Dir(c.path)), PowerSGDFile))
		}
	}
	return b.SetPowerSGDState(errs, q)
}
