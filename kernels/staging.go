package kernels

import "github.com/gorun/gorun/dtype"

// HostStaging is implemented by backends whose tensors live in memory the
// host cannot read (a GPU). It moves gradient buckets to and from the
// host for the collectives, converting to and from the wire format on the
// device so that half the bytes cross the bus when the wire is 16-bit.
//
// Like the rest of a Backend it is used from one goroutine, except that a
// Fence may be waited on from any goroutine.
type HostStaging interface {
	// PinnedHost returns n bytes of page-locked host memory that live as
	// long as the backend (copies from and to it run asynchronously).
	PinnedHost(n int) []byte
	// CopyOutAsync queues, after the work already queued, dst = src
	// converted to wire (F32, F16 or BF16, stored little-endian). src is an
	// F32 tensor, dst holds src.Len()*wire.Size() bytes of PinnedHost
	// memory. It returns at once; the Fence says when dst is filled.
	CopyOutAsync(dst []byte, src Tensor, wire dtype.DType) Fence
	// CopyIn queues dst (F32) = src converted from wire, ordered before
	// every op queued after it. src (PinnedHost memory) must not change
	// until the backend's next Sync.
	CopyIn(dst Tensor, src []byte, wire dtype.DType)
}

// Fence marks a point in a backend's queue of work.
type Fence interface {
	// Wait blocks until the work before the fence has finished, and
	// reports a failure of that work.
	Wait() error
}
