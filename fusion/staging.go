package fusion

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/kernels"
)

// GradStaging is what the Bucketer needs of a flat float32 gradient buffer
// that the host cannot read (a GPU's): copies of a run of its elements to
// host memory in the wire format and back. The conversions run where the
// gradients are, so that a 16-bit wire also halves the bytes that cross the
// bus. HostStaged adapts a kernels.Backend that implements
// kernels.HostStaging.
//
// The Bucketer calls CopyOut and CopyIn on the goroutine that calls
// MarkReady and Wait (for a device, the goroutine that owns it); a Fence is
// waited on from a bucket's communication goroutine.
type GradStaging interface {
	// Len is the number of float32 elements of the gradient buffer.
	Len() int
	// Pinned returns n bytes of host memory that asynchronous copies may
	// use for as long as the GradStaging lives (page-locked memory, for a
	// GPU). AttachDevice asks once, for every gradient in the wire format.
	Pinned(n int) []byte
	// CopyOut queues dst = elements [off, off+n) converted to wire
	// (Float32, Float16 or BFloat16, little-endian), after the work already
	// queued (the backward pass that computed them), and returns at once;
	// the Fence says when dst is filled.
	CopyOut(dst []byte, off, n int, wire dtype.DType) Fence
	// CopyIn queues elements [off, off+n) = scale * (src converted from
	// wire), ahead of the work queued after it (the optimizer). The
	// Bucketer writes src again only after the Fence of a later CopyOut
	// into it has been waited on: that copy, queued after this one, has
	// then finished, and so has this one.
	CopyIn(off, n int, src []byte, wire dtype.DType, scale float32)
}

// Fence says when a CopyOut has finished (kernels.Fence is one).
type Fence interface {
	// Wait blocks until the copy (and the work queued before it) has
	// finished, and reports a failure of that work.
	Wait() error
}

// HostStaged returns the GradStaging of grads, the flat F32 gradient
// tensor of a model on be, when be implements kernels.HostStaging (a
// device backend), and false when it does not: the CPU backend's gradients
// are host memory, which AttachFlat reduces in place with no copy.
//
// CopyOut is be's CopyOutAsync of a slice of grads, CopyIn be's CopyIn
// followed, when the scale is not 1, by be.Scale of the same slice: the
// scale is applied to the float32 gradients on the device, after the
// conversion from the wire format.
func HostStaged(be kernels.Backend, grads kernels.Tensor) (GradStaging, bool) {
	hs, ok := be.(kernels.HostStaging)
	if !ok {
		return nil, false
	}
	if grads.DType != dtype.Float32 {
		panic(fmt.Sprintf("fusion: HostStaged of a %v gradient tensor (want F32)", grads))
	}
	return &hostStaged{be: be, hs: hs, grads: grads}, true
}

type hostStaged struct {
	be    kernels.Backend
	hs    kernels.HostStaging
	grads kernels.Tensor
}

func (h *hostStaged) Len() int            { return h.grads.Len() }
func (h *hostStaged) Pinned(n int) []byte { return h.hs.PinnedHost(n) }

func (h *hostStaged) CopyOut(dst []byte, off, n int, wire dtype.DType) Fence {
	return h.hs.CopyOutAsync(dst[:n*wire.Size()], h.grads.Slice(off, n), kernelType(wire))
}

func (h *hostStaged) CopyIn(off, n int, src []byte, wire dtype.DType, scale float32) {
	g := h.grads.Slice(off, n)
	h.hs.CopyIn(g, src[:n*wire.Size()], kernelType(wire))
	if scale != 1 {
		h.be.Scale(g, scale)
	}
}

func kernelType(d dtype.DType) dtype.DType {
	switch d {
	case dtype.Float16:
		return dtype.Float16
	case dtype.BFloat16:
		return dtype.BFloat16
	}
	return dtype.Float32
}

// wireOverflow reports whether the reduced bucket buf (wire format) holds
// a value that is Inf or NaN once converted to float32 and multiplied by
// scale: the Bucketer's overflow check on device gradients, which are
// scaled on the device after the copy back. For |scale| <= 1 that is the
// case exactly when a value is Inf or NaN in the wire format (|x*scale| <=
// |x|), which the exponent bits tell: all ones (one OR per element, no
// conversion). A larger scale (or a NaN) needs the conversion.
func wireOverflow(buf []byte, wire dtype.DType, scale float32) bool {
	if !(scale >= -1 && scale <= 1) {
		return decodeOverflow(buf, wire, scale)
	}
	switch wire {
	case dtype.Float16, dtype.BFloat16:
		// (u & exp) + low bit of exp sets bit 15 exactly when the exponent
		// is all ones: 0x7c00+0x0400 = 0x7f80+0x0080 = 0x8000.
		exp, one := uint16(0x7c00), uint16(0x0400)
		if wire == dtype.BFloat16 {
			exp, one = 0x7f80, 0x0080
		}
		var acc uint16
		for _, u := range collective.Uint16s(buf) {
			acc |= (u & exp) + one
		}
		return acc&0x8000 != 0
	default:
		var acc uint32
		for _, f := range collective.Float32s(buf) {
			acc |= (math.Float32bits(f) & 0x7f800000) + 0x00800000
		}
		return acc&0x80000000 != 0
	}
}

// decodeOverflow converts buf to float32 a chunk at a time and checks
// x*scale.
func decodeOverflow(buf []byte, wire dtype.DType, scale float32) bool {
	var chunk [1024]float32
	n := len(buf) / wire.Size()
	for lo := 0; lo < n; lo += len(chunk) {
		hi := min(n, lo+len(chunk))
		x := chunk[:hi-lo]
		switch wire {
		case dtype.Float16:
			half.Float16ToFloat32(x, collective.Uint16s(buf)[lo:hi])
		case dtype.BFloat16:
			half.BFloat16ToFloat32(x, collective.Uint16s(buf)[lo:hi])
		default:
			copy(x, collective.Float32s(buf)[lo:hi])
		}
		if scaleAndCheck(x, scale) {
			return true
		}
	}
	return false
}
