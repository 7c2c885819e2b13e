package fusion

import (
	"fmt"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/dtype"
)

type launched struct {
	k int
	h *collective.Handle
	// hq: a PowerSGD bucket's Q allreduce (h is then its other
	// gradients', or nil)
	hq *collective.Handle
}

// launch starts the buckets' allreduces in index order as they become
// ready (on a device: and their copy to the host has finished); a
// finisher goroutine unpacks (checks) them in the same order.
func (b *Bucketer) launch(s *stepState, check bool) {
	buckets := s.buckets
	fin := make(chan launched, len(buckets))
	go b.finish(s, fin)
	defer close(fin)
	op := collective.Sum
	if b.cfg.Average {
		op = collective.Average // each rank divides only the part it owns
	}
	var opts []collective.CallOption
	if b.wire != dtype.Float32 && s.dev == nil {
		opts = append(opts, collective.WithWire(b.wire))
	}
	failFrom := func(k int, err error) {
		s.fail(err)
		for j := k; j < len(buckets); j++ {
			s.errs[j] = err
			close(s.done[j])
		}
	}
	for k, bk := range buckets {
		select {
		case <-s.ready[k]:
		case <-s.abort:
			failFrom(k, s.abortE)
			return
		}
		st := &s.stats[k]
		st.Launch = time.Now()
		if k == 0 {
			if check {
				if err := b.verify(); err != nil {
					failFrom(0, err)
					return
				}
			}
			s.sent0, s.recv0 = b.traffic()
		}
		if s.psgd && s.pbk[k].compressed() {
			l, err := b.launchPSGD(s, k, op, opts)
			if err != nil {
				failFrom(k, err)
				return
			}
			fin <- l
			continue
		}
		var h *collective.Handle
		if s.dev != nil {
			if f := s.fences[k]; f != nil {
				if err := f.Wait(); err != nil {
					failFrom(k, fmt.Errorf("bucketer: rank %d: copying bucket %d to the host: %w", b.c.Rank(), k, err))
					return
				}
			}
			b.cfg.Timeline.Span("fusion", fmt.Sprintf("copy out b%d", k), st.Ready, time.Now())
			h = b.c.AllreduceAsync(b.ctx, nil, s.wbufs[k], b.wire, op)
		} else {
			buf := s.bufs[k]
			if s.grads != nil {
				o := 0
				for i := bk.Lo; i <= bk.Hi; i++ {
					o += copy(buf[o:], s.grads[i])
				}
				b.cfg.Timeline.Span("fusion", fmt.Sprintf("pack b%d", k), st.Launch, time.Now())
			}
			h = b.c.AllreduceAsync(b.ctx, nil, collective.Float32Bytes(buf), dtype.Float32, op, opts...)
		}
		st.Start = time.Now() // corrected by finish to when the call could run
		fin <- launched{k: k, h: h}
	}
}

func (b *Bucketer) finish(s *stepState, fin chan launched) {
	var prev time.Time
	for l := range fin {
		k, bk := l.k, s.buckets[l.k]
		st := &s.stats[k]
		var err error
		if l.hq != nil {
			err = b.finishPSGD(s, l)
		} else {
			err = l.h.Wait()
			st.Reduced = time.Now()
		}
		if st.Start.Before(prev) {
			st.Start = prev // the communicator runs calls one at a time
		}
		prev = st.Reduced
		if err == nil && l.hq == nil {
			if s.dev != nil {
				// The scale is applied on the device by the copy back.
				st.Overflow = wireOverflow(s.wbufs[k], b.wire, s.scale)
			} else {
				buf := s.bufs[k]
				st.Overflow = scaleAndCheck(buf, s.scale)
				if s.grads != nil {
					o := 0
					for i := bk.Lo; i <= bk.Hi; i++ {
						o += copy(s.grads[i], buf[o:])
					}
				}
			}
		}
		st.End = time.Now()
		if tl := b.cfg.Timeline; tl != nil {
			args := map[string]any{"bytes": bk.Bytes(), "wire": b.wire.String(), "params": bk.Hi - bk.Lo + 1,
				"first": b.params[bk.Hi].Name, "last": b.params[bk.Lo].Name}
			if l.hq != nil {
				pb := &s.pbk[k]
				args["powersgd_bytes"] = 4 * (pb.pHi - pb.pLo + pb.qHi - pb.qLo)
				args["matrices"] = pb.mHi - pb.mLo
			}
			tl.SpanArgs("allreduce", fmt.Sprintf("allreduce b%d", k), st.Start, st.Reduced, args)
			name := "unpack b%d"
			if l.hq != nil {
				name = "decompress b%d" // host: and unpack; device: the checks
			} else if s.dev != nil {
				name = "check b%d"
			}
			tl.Span("fusion", fmt.Sprintf(name, k), st.Reduced, st.End)
		}
		s.errs[k] = err
		if err != nil {
			s.fail(err)
		}
		close(s.done[k])
	}
}

// copyIn queues the copy of reduced bucket k back to the device gradients
// (AttachDevice mode), once per step; it runs on the device's goroutine.
func (b *Bucketer) copyIn(s *stepState, k int) {
	s.inMu.Lock()
	defer s.inMu.Unlock()
	if s.copiedIn[k] {
		return
	}
	s.copiedIn[k] = true
	t0 := time.Now()
	if s.psgd && s.pbk[k].compressed() {
		b.devPhase3(s, k)
	} else if bk := s.buckets[k]; bk.Elems > 0 {
		s.dev.CopyIn(bk.Offset, bk.Elems, s.wbufs[k], b.wire, s.scale)
	}
	b.cfg.Timeline.Span("fusion", fmt.Sprintf("copy in b%d", k), t0, time.Now())
}

// scaleAndCheck multiplies x by scale (unless it is 1) and reports whether
// x holds an inf or a NaN: x*0 is 0 for a finite x and NaN otherwise, so
// the sum of x[i]*0 is NaN exactly when one x[i] is not finite (one pass,
// no branches, four independent sums).
func scaleAndCheck(x []float32, scale float32) bool {
	var a0, a1, a2, a3 float32
	i := 0
	if scale != 1 {
		for ; i+4 <= len(x); i += 4 {
			v := x[i : i+4 : i+4]
			v[0] *= scale
			v[1] *= scale
			v[2] *= scale
			v[3] *= scale
			a0 += v[0] * 0
			a1 += v[1] * 0
			a2 += v[2] * 0
			a3 += v[3] * 0
		}
		for ; i < len(x); i++ {
			x[i] *= scale
			a0 += x[i] * 0
		}
	} else {
		for ; i+4 <= len(x); i += 4 {
			v := x[i : i+4 : i+4]
			a0 += v[0] * 0
			a1 += v[1] * 0
			a2 += v[2] * 0
			a3 += v[3] * 0
		}
		for ; i < len(x); i++ {
			a0 += x[i] * 0
		}
	}
	s := a0 + a1 + a2 + a3
	return s != s
}
