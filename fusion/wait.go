package fusion

import (
	"fmt"
	"strings"
	"time"
)

// unready names the parameters of buckets 0..k not marked yet.
func (b *Bucketer) unready(s *stepState, k int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var names []string
	total := 0
	for j := 0; j <= k && j < len(b.buckets); j++ {
		bk := b.buckets[j]
		for i := bk.Hi; i >= bk.Lo; i-- {
			if !s.marked[i] {
				total++
				if len(names) < 4 {
					names = append(names, fmt.Sprintf("%d %q (%d elements, bucket %d)", i, b.params[i].Name, b.params[i].Len, j))
				}
			}
		}
	}
	msg := strings.Join(names, ", ")
	if total > len(names) {
		msg += fmt.Sprintf(" and %d more", total-len(names))
	}
	return msg
}

// waitBucket waits for bucket k of step s: its readiness (and that of the
// buckets before it) within the timeout, then its allreduce.
func (b *Bucketer) waitBucket(s *stepState, k int) error {
	timer := time.NewTimer(b.cfg.Timeout)
	defer timer.Stop()
	// With PowerSGD on a device, the launcher asks this (the device's)
	// goroutine on s.devReq for each bucket's phase 2 meanwhile (a nil
	// channel otherwise, never ready).
	for j := 0; j <= k; j++ {
	marked:
		for {
			select {
			case <-s.ready[j]:
				break marked
			case <-s.done[j]:
				break marked
			case <-s.abort:
				return s.abortE
			case kk := <-s.devReq:
				b.devPhase2(s, kk)
			case <-timer.C:
				err := fmt.Errorf("bucketer: rank %d: gradient not marked ready within %v: parameter %s", b.c.Rank(), b.cfg.Timeout, b.unready(s, j))
				s.fail(err)
				return err
			}
		}
	}
	for {
		select {
		case <-s.done[k]:
			return s.errs[k]
		case <-s.abort:
			return s.abortE
		case kk := <-s.devReq:
			b.devPhase2(s, kk)
		}
	}
}

// WaitBucket waits until bucket k's gradients are reduced and unpacked
// (AttachDevice: until their copy back is queued, ahead of the work queued
// after it). In passes that only accumulate it returns at once.
func (b *Bucketer) WaitBucket(k int) error {
	b.mu.Lock()
	if b.pass < b.cfg.BackwardPassesPerStep-1 {
		b.mu.Unlock()
		return nil
	}
	if k < 0 || k >= len(b.buckets) {
		b.mu.Unlock()
		return fmt.Errorf("bucketer: no bucket %d (have %d)", k, len(b.buckets))
	}
	s, err := b.step()
	b.mu.Unlock()
	if err != nil {
		return err
	}
	if err := b.waitBucket(s, k); err != nil {
		b.mu.Lock()
		if b.broken == nil {
			b.broken = err
		}
		b.mu.Unlock()
		return err
	}
	if s.dev != nil {
		b.copyIn(s, k)
	}
	return nil
}

// WaitParam waits for the bucket holding parameter i (an optimizer's
// per-parameter wait callback).
func (b *Bucketer) WaitParam(i int) error {
	if i < 0 || i >= len(b.params) {
		return fmt.Errorf("bucketer: no parameter %d (have %d)", i, len(b.params))
	}
	return b.WaitBucket(b.BucketOf(i))
}

// Wait ends the backward pass: in a pass that only accumulates it returns
// StepStats{Reduced: false} at once; otherwise it waits for every bucket
// (an implicit BackwardDone if none was called) and returns the step's
// stats. With AttachDevice it queues the copy back of every bucket that
// WaitBucket did not. Gradients never marked ready make it fail after the
// Timeout with an error naming them.
func (b *Bucketer) Wait() (StepStats, error) {
	now := time.Now()
	b.mu.Lock()
	if b.broken != nil {
		b.mu.Unlock()
		return StepStats{}, b.broken
	}
	if b.pass < b.cfg.BackwardPassesPerStep-1 {
		b.pass++
		b.mu.Unlock()
		return StepStats{}, nil
	}
	s, err := b.step()
	if err != nil {
		b.mu.Unlock()
		return StepStats{}, err
	}
	if s.bwdDone.IsZero() {
		s.bwdDone = now
	}
	b.mu.Unlock()

	if len(s.done) > 0 {
		err = b.waitBucket(s, len(s.done)-1)
		if err == nil {
			for k := range s.done { // all done: errors of earlier buckets
				if err = s.errs[k]; err != nil {
					break
				}
			}
		}
	}
	if err == nil && s.dev != nil {
		for k := range s.done {
			b.copyIn(s, k)
		}
	}
	st := StepStats{Reduced: err == nil, BackwardDone: s.bwdDone}
	if err == nil && s.psgd {
		st.PowerSGD = b.psgd.stats()
		st.PowerSGD.Compressed = true
		st.PowerSGD.Compute = time.Duration(s.psgdNs.Load())
	}
	if err == nil {
		st.Buckets = s.stats
		sent, recv := b.traffic()
		st.BytesSent, st.BytesRecv = sent-s.sent0, recv-s.recv0
		var last, covered time.Time
		for _, bs := range s.stats {
			st.Overflow = st.Overflow || bs.Overflow
			lo := bs.Launch
			if lo.Before(covered) {
				lo = covered
			}
			if bs.End.After(lo) {
				st.CommTime += bs.End.Sub(lo)
			}
			if bs.End.After(covered) {
				covered = bs.End
			}
			if bs.End.After(last) {
				last = bs.End
			}
		}
		if last.After(s.bwdDone) {
			st.Exposed = last.Sub(s.bwdDone)
		}
		if st.CommTime > 0 {
			st.Hidden = min(1, max(0, 1-float64(st.Exposed)/float64(st.CommTime)))
		}
	}
	b.mu.Lock()
	b.st = nil
	b.pass = 0
	b.stepNo++
	if err != nil && b.broken == nil {
		b.broken = err
	}
	rebuild := err == nil && b.cfg.CycleTime > 0 && !b.rebuilt
	b.mu.Unlock()
	if rebuild {
		if err := b.rebuild(s); err != nil {
			b.mu.Lock()
			b.broken = err
			b.mu.Unlock()
			return st, err
		}
	}
	return st, err
}
