package fusion

import (
	"errors"
	"fmt"
)

// AttachFlat hands the Bucketer the flat gradient buffer: parameter i's
// gradient is flat[o_i : o_i+Len_i] with o_i the sum of the lengths before
// it (the transformer's Grads buffer). Buckets are views of it: nothing is
// copied, and the reduced gradients are written back in place.
func (b *Bucketer) AttachFlat(flat []float32) error {
	if len(flat) != b.total {
		return fmt.Errorf("bucketer: flat gradient buffer has %d elements, the parameters %d", len(flat), b.total)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st != nil {
		return errors.New("bucketer: Attach during a step")
	}
	b.flat, b.grads, b.dev = flat, nil, nil
	b.makeBufs()
	if b.psgd != nil {
		if err := b.psgd.attachHost(flat); err != nil {
			b.flat = nil
			return err
		}
	}
	return b.describe()
}

// Attach hands the Bucketer one gradient slice per parameter. Each bucket
// is packed into a buffer of its own before its allreduce and unpacked
// after it (AttachFlat avoids both copies).
func (b *Bucketer) Attach(grads [][]float32) error {
	if len(grads) != len(b.params) {
		return fmt.Errorf("bucketer: %d gradient slices for %d parameters", len(grads), len(b.params))
	}
	for i, g := range grads {
		if len(g) != b.params[i].Len {
			return fmt.Errorf("bucketer: gradient of parameter %d %q has %d elements, want %d", i, b.params[i].Name, len(g), b.params[i].Len)
		}
	}
	if b.psgd != nil {
		return errors.New("bucketer: PowerSGD needs the gradients as one flat buffer (AttachFlat or AttachDevice), not Attach")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st != nil {
		return errors.New("bucketer: Attach during a step")
	}
	b.flat, b.grads, b.dev = nil, append([][]float32(nil), grads...), nil
	b.makeBufs()
	return b.describe()
}

// AttachDevice hands the Bucketer a flat gradient buffer that the host
// cannot read, laid out as for AttachFlat. When a bucket's last gradient
// is marked ready, MarkReady queues its copy to host memory in the wire
// format (s.CopyOut: the cast to float16 or bfloat16 runs on the device);
// the bucket's communication goroutine waits for the copy, all-reduces the
// host buffer and checks it for Inf and NaN there; WaitBucket and Wait
// queue the copy back (s.CopyIn, which also applies SetScale's factor to
// the float32 gradients). The host buffer, one for all the buckets, is
// taken from s.Pinned once.
func (b *Bucketer) AttachDevice(s GradStaging) error {
	if n := s.Len(); n != b.total {
		return fmt.Errorf("bucketer: device gradient buffer has %d elements, the parameters %d", n, b.total)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st != nil {
		return errors.New("bucketer: Attach during a step")
	}
	if b.dev != s || len(b.pinned) != b.total*b.wire.Size() {
		b.pinned = nil
		if b.total > 0 {
			b.pinned = s.Pinned(b.total * b.wire.Size())
			if len(b.pinned) < b.total*b.wire.Size() {
				return fmt.Errorf("bucketer: %d bytes of pinned host memory for %d", len(b.pinned), b.total*b.wire.Size())
			}
		}
	}
	b.flat, b.grads, b.dev = nil, nil, s
	b.makeBufs()
	if b.psgd != nil {
		if err := b.psgd.attachDevice(s); err != nil {
			b.dev = nil
			return err
		}
	}
	return b.describe()
}

func (b *Bucketer) attached() bool { return b.flat != nil || b.grads != nil || b.dev != nil }

func (b *Bucketer) makeBufs() {
	b.dbufs = nil
	if b.psgd != nil && b.flat != nil {
		b.dbufs = make([][]float32, len(b.buckets))
		for k := range b.pbk {
			if pb := &b.pbk[k]; pb.compressed() && pb.dense > 0 {
				b.dbufs[k] = make([]float32, pb.dense)
			}
		}
	}
	if b.dev != nil {
		ws := b.wire.Size()
		b.bufs, b.wbufs = nil, make([][]byte, len(b.buckets))
		for k, bk := range b.buckets {
			lo, hi := bk.Offset*ws, (bk.Offset+bk.Elems)*ws
			b.wbufs[k] = b.pinned[lo:hi:hi]
		}
		return
	}
	b.bufs, b.wbufs = make([][]float32, len(b.buckets)), nil
	for k, bk := range b.buckets {
		if b.flat != nil {
			b.bufs[k] = b.flat[bk.Offset : bk.Offset+bk.Elems : bk.Offset+bk.Elems]
		} else {
			b.bufs[k] = make([]float32, bk.Elems)
		}
	}
}
