package fusion

import (
	"fmt"
	"time"
)

// Bucket is one fused message: the gradients of parameters Lo..Hi
// (inclusive, indices into the parameter list). Readiness runs from Hi down
// to Lo, so a bucket is complete when Lo's gradient (usually the last of
// its run) is ready.
type Bucket struct {
	Index  int
	Lo, Hi int
	Elems  int // float32 elements
	Offset int // of parameter Lo in the flat gradient buffer (AttachFlat, AttachDevice)
}

// Bytes is the bucket's size in float32 bytes.
func (b Bucket) Bytes() int { return 4 * b.Elems }

// Layout is the buckets NewBucketer cuts from params with cfg's caps
// (before any CycleTime rebuild): the same pure function, without a
// communicator, for a run's record and for planning.
func Layout(params []ParamInfo, cfg BucketConfig) []Bucket {
	cfg = cfg.withDefaults()
	offsets := make([]int, len(params))
	off := 0
	for i, p := range params {
		offsets[i] = off
		off += p.Len
	}
	return layout(params, offsets, cfg.CapBytes, cfg.FirstCapBytes, nil, nil, 0)
}

// layout forms buckets in readiness order (last parameter first). As in
// PyTorch DDP, a bucket is closed as soon as it holds at least its cap
// (firstCap for bucket 0), so it overshoots the cap by less than its last
// parameter; a parameter of capBytes or more never joins a non-empty
// bucket and is closed alone. A bucket is also closed before every
// parameter i with cut[i] set (when cut is given), and before a parameter
// that became ready more than cycle after the bucket's first one (when
// ready times are given).
func layout(params []ParamInfo, offsets []int, capBytes, firstCap int, cut []bool, ready []time.Time, cycle time.Duration) []Bucket {
	var out []Bucket
	open, hi, bytes := false, 0, 0
	closeAt := func(lo int) {
		out = append(out, Bucket{Lo: lo, Hi: hi})
		open = false
	}
	for i := len(params) - 1; i >= 0; i-- {
		pb := 4 * params[i].Len
		if open && (pb >= capBytes || cut != nil && cut[i] || ready != nil && ready[i].Sub(ready[hi]) > cycle) {
			closeAt(i + 1)
		}
		if !open {
			open, hi, bytes = true, i, 0
		}
		bytes += pb
		limit := capBytes
		if len(out) == 0 {
			limit = firstCap
		}
		if bytes >= limit || pb >= capBytes {
			closeAt(i)
		}
	}
	if open {
		closeAt(0)
	}
	for k := range out {
		bk := &out[k]
		bk.Index = k
		bk.Offset = offsets[bk.Lo]
		bk.Elems = offsets[bk.Hi] + params[bk.Hi].Len - bk.Offset
	}
	return out
}

func (b *Bucketer) setLayout(bs []Bucket) {
	b.buckets = bs
	b.of = make([]int, len(b.params))
	for _, bk := range bs {
		for i := bk.Lo; i <= bk.Hi; i++ {
			b.of[i] = bk.Index
		}
	}
	b.bufs, b.wbufs = nil, nil
	if b.psgd != nil {
		b.pbk = b.psgd.buckets(b.params, b.offsets, bs)
	}
	if b.attached() {
		b.makeBufs()
	}
}

// rebuild re-lays out the buckets from rank 0's readiness times of the
// step just finished (see BucketConfig.CycleTime) and broadcasts the cuts.
func (b *Bucketer) rebuild(s *stepState) error {
	cut := make([]byte, len(b.params)) // 1: a bucket starts (in readiness order) at this parameter
	if b.c.Rank() == 0 {
		for _, bk := range layout(b.params, b.offsets, b.cfg.CapBytes, b.cfg.FirstCapBytes, nil, s.readyAt, b.cfg.CycleTime) {
			if bk.Index > 0 {
				cut[bk.Hi] = 1
			}
		}
	}
	if err := b.c.Broadcast(b.ctx, cut, 0); err != nil {
		return fmt.Errorf("bucketer: broadcasting the rebuilt layout: %w", err)
	}
	cuts := make([]bool, len(cut))
	for i, c := range cut {
		cuts[i] = c != 0
	}
	b.mu.Lock()
	b.setLayout(layout(b.params, b.offsets, b.cfg.CapBytes, b.cfg.FirstCapBytes, cuts, nil, 0))
	b.rebuilt = true
	b.mu.Unlock()
	return nil
}
