package fusion

import (
	"fmt"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/dtype"
)

// A PowerSGD bucket's step. The launcher (one goroutine per step, which
// issues every collective of the step, in bucket order, so that the
// sequence is the same on every rank) starts, for bucket k:
//
//  1. the ordinary allreduce of the bucket's other gradients (packed);
//  2. phase 1, M = scale*G + E and P = M orth(Q), then P's allreduce;
//  3. when P is reduced, phase 2, P = orth(P) and Q = Mᵀ P, then Q's
//     allreduce;
//
// and hands both handles to the finisher, which unpacks the other
// gradients, checks P and Q, and (host gradients) runs phase 3, the
// decompression G = P Qᵀ and E = M - G/W. With host gradients the
// launcher and the finisher run the phases on PowerSGD.Backend. With
// device gradients every phase runs on the device's goroutine: phase 1 in
// the MarkReady that completes the bucket (with the copies out of P and
// of the other gradients), phase 2 when the launcher asks for it on
// devReq (MarkReady, WaitBucket and Wait serve the requests), phase 3 in
// the copy back that WaitBucket and Wait queue.

// outScale is what the decompressed sum is multiplied by: 1, or 1/W with
// Average.
func (b *Bucketer) outScale() float32 {
	if b.cfg.Average {
		return 1 / float32(b.c.Size())
	}
	return 1
}

func (b *Bucketer) launchPSGD(s *stepState, k int, op collective.Op, opts []collective.CallOption) (launched, error) {
	c, pb, st := b.psgd, &s.pbk[k], &s.stats[k]
	tl := b.cfg.Timeline
	l := launched{k: k}
	ws := b.wire.Size()
	if s.dev != nil {
		for _, f := range s.cfences[k] {
			if err := f.Wait(); err != nil {
				return l, fmt.Errorf("bucketer: rank %d: copying bucket %d to the host: %w", b.c.Rank(), k, err)
			}
		}
		now := time.Now()
		s.psgdNs.Add(int64(now.Sub(s.p1Start[k])))
		tl.Span("fusion", fmt.Sprintf("compress P b%d", k), st.Ready, now)
		if pb.dense > 0 {
			l.h = b.c.AllreduceAsync(b.ctx, nil, s.wbufs[k][:pb.dense*ws], b.wire, op)
		}
	} else {
		if pb.dense > 0 {
			buf, pos := s.dbufs[k], 0
			for _, r := range pb.runs {
				pos += copy(buf[pos:], b.flat[r.off:r.off+r.n])
			}
			l.h = b.c.AllreduceAsync(b.ctx, nil, collective.Float32Bytes(buf), dtype.Float32, op, opts...)
		}
		t0 := time.Now()
		c.mu.Lock()
		c.phase1(pb, s.scale)
		c.mu.Unlock()
		now := time.Now()
		s.psgdNs.Add(int64(now.Sub(t0)))
		tl.Span("fusion", fmt.Sprintf("compress P b%d", k), t0, now)
	}
	st.Start = time.Now()
	hp := b.c.AllreduceAsync(b.ctx, nil, c.pWire[4*pb.pLo:4*pb.pHi], dtype.Float32, collective.Sum)
	if err := hp.Wait(); err != nil {
		return l, err
	}
	t1 := time.Now()
	tl.SpanArgs("allreduce", fmt.Sprintf("allreduce P b%d", k), st.Start, t1, map[string]any{"bytes": 4 * (pb.pHi - pb.pLo)})
	if s.dev != nil {
		select {
		case s.devReq <- k:
		case <-s.abort:
			return l, s.abortE
		}
		select {
		case <-s.q2done[k]:
		case <-s.abort:
			return l, s.abortE
		}
		if err := s.qfence[k].Wait(); err != nil {
			return l, fmt.Errorf("bucketer: rank %d: copying bucket %d's Q to the host: %w", b.c.Rank(), k, err)
		}
	} else {
		c.mu.Lock()
		c.phase2(pb)
		c.mu.Unlock()
	}
	now := time.Now()
	s.psgdNs.Add(int64(now.Sub(t1)))
	tl.Span("fusion", fmt.Sprintf("compress Q b%d", k), t1, now)
	l.hq = b.c.AllreduceAsync(b.ctx, nil, c.qWire[4*pb.qLo:4*pb.qHi], dtype.Float32, collective.Sum)
	return l, nil
}

// finishPSGD waits for bucket l.k's allreduces and unpacks them (host
// gradients: and decompresses); it sets the bucket's Reduced and
// Overflow.
func (b *Bucketer) finishPSGD(s *stepState, l launched) error {
	k := l.k
	c, pb, st := b.psgd, &s.pbk[k], &s.stats[k]
	var err error
	overflow := false
	if l.h != nil {
		if err = l.h.Wait(); err == nil {
			if s.dev != nil {
				overflow = wireOverflow(s.wbufs[k][:pb.dense*b.wire.Size()], b.wire, s.scale)
			} else {
				buf, pos := s.dbufs[k], 0
				overflow = scaleAndCheck(buf, s.scale)
				for _, r := range pb.runs {
					pos += copy(b.flat[r.off:r.off+r.n], buf[pos:])
				}
			}
		}
	}
	if e := l.hq.Wait(); err == nil {
		err = e
	}
	st.Reduced = time.Now()
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	pq := c.checkQ(pb, s.stepNo)
	s.pqOver[k] = pq
	if s.dev == nil {
		t0 := time.Now()
		c.phase3(pb, b.outScale(), b.c.Size(), pq)
		if !pq {
			for j := pb.mLo; j < pb.mHi; j++ {
				mt := c.mats[j]
				pq = pq || scaleAndCheck(b.flat[mt.off:mt.off+mt.n*mt.m], 1)
			}
		}
		s.psgdNs.Add(int64(time.Since(t0)))
	}
	st.Overflow = overflow || pq
	return nil
}

// devPhase1 queues, on the device's goroutine, the copies out of bucket
// k's other gradients and phase 1 with the copy out of P.
func (b *Bucketer) devPhase1(s *stepState, k int) {
	c, pb := b.psgd, &s.pbk[k]
	s.p1Start[k] = time.Now()
	ws := b.wire.Size()
	var fs []Fence
	pos := 0
	for _, r := range pb.runs {
		fs = append(fs, s.dev.CopyOut(s.wbufs[k][pos*ws:], r.off, r.n, b.wire))
		pos += r.n
	}
	c.phase1(pb, s.scale)
	fs = append(fs, c.hs.CopyOutAsync(c.pWire[4*pb.pLo:4*pb.pHi], c.p.Slice(pb.pLo, pb.pHi-pb.pLo), dtype.Float32))
	s.cfences[k] = fs
}

// devPhase2 queues bucket k's phase 2 on the device's goroutine: the
// reduced P back to the device, phase 2, and Q's copy out.
func (b *Bucketer) devPhase2(s *stepState, k int) {
	c, pb := b.psgd, &s.pbk[k]
	c.hs.CopyIn(c.p.Slice(pb.pLo, pb.pHi-pb.pLo), c.pWire[4*pb.pLo:4*pb.pHi], dtype.Float32)
	c.phase2(pb)
	s.qfence[k] = c.hs.CopyOutAsync(c.qWire[4*pb.qLo:4*pb.qHi], c.q.Slice(pb.qLo, pb.qHi-pb.qLo), dtype.Float32)
	close(s.q2done[k])
}

// devPhase3 queues the copy back of bucket k's other gradients (scaled),
// the reduced Q to the device and phase 3.
func (b *Bucketer) devPhase3(s *stepState, k int) {
	c, pb := b.psgd, &s.pbk[k]
	t0 := time.Now()
	ws := b.wire.Size()
	pos := 0
	for _, r := range pb.runs {
		s.dev.CopyIn(r.off, r.n, s.wbufs[k][pos*ws:], b.wire, s.scale)
		pos += r.n
	}
	if !s.pqOver[k] {
		c.hs.CopyIn(c.q.Slice(pb.qLo, pb.qHi-pb.qLo), c.qWire[4*pb.qLo:4*pb.qHi], dtype.Float32)
	}
	c.phase3(pb, b.outScale(), b.c.Size(), s.pqOver[k])
	s.psgdNs.Add(int64(time.Since(t0)))
}

// serve runs the phase-2 requests waiting on devReq (device's goroutine).
func (b *Bucketer) serve(s *stepState) {
	for {
		select {
		case k := <-s.devReq:
			b.devPhase2(s, k)
		default:
			return
		}
	}
}
