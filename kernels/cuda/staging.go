package cuda

import (
	"fmt"
	"unsafe"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// stage is the device side of one pinned host buffer that CopyOutAsync
// fills: the bucket in the wire format on the device, as it was when the
// copy was queued (the cast's output, or for F32 a device-to-device copy:
// the copy stream never reads the live gradients, which the compute stream
// may change before the copy runs), and the events that order the copy.
type stage struct {
	dev     uintptr // the wire-format snapshot on the device (0 until needed)
	bytes   int     // dev's size
	cast    uintptr // event: the snapshot is ready on the compute stream
	done    uintptr // event: the copy to the host has finished
	copying bool    // done was recorded after the compute stream last waited for it
}

// fence is a recorded event.
type fence struct {
	d  *driver
	ev uintptr
}

// Wait implements kernels.Fence: the thread sleeps in the driver
// (blocking-sync events) instead of spinning a core.
func (f fence) Wait() error {
	return f.d.check("cuEventSynchronize", f.d.call(f.d.eventSynchronize, f.ev))
}

func (b *Backend) event() uintptr { return b.fenceEvent() }

// PinnedHost implements kernels.HostStaging.
func (b *Backend) PinnedHost(n int) []byte {
	if n <= 0 {
		return nil
	}
	var p uintptr
	b.drv.must("cuMemAllocHost", b.drv.call(b.drv.memAllocHost, uintptr(unsafe.Pointer(&p)), uintptr(n)))
	b.pinned = append(b.pinned, p)
	return hostBytes(p, n)
}

func wireCheck(src kernels.Tensor, dst []byte, wire dtype.DType, op string) int {
	if src.DType != dtype.Float32 || wire == dtype.Int32 {
		panic(fmt.Sprintf("cuda: %s of %v as %v", op, src, wire))
	}
	n := src.Len() * wire.Size()
	if len(dst) < n {
		panic(fmt.Sprintf("cuda: %s: %d host bytes for %v as %v (%d bytes)", op, len(dst), src, wire, n))
	}
	return n
}

// stageFor returns the stage of a pinned buffer (made on first use), its
// device buffer at least n bytes, and orders the compute stream after the
// stage's last copy out: the compute stream may then overwrite the device
// buffer, or free it to the allocator, whose next user is on the compute
// stream too (the copy stream may still be reading it otherwise).
func (b *Backend) stageFor(host []byte, n int) *stage {
	key := uintptr(unsafe.Pointer(&host[0]))
	s := b.staging[key]
	if s == nil {
		s = &stage{cast: b.event(), done: b.event()}
		b.staging[key] = s
	}
	if s.copying {
		d := b.drv
		d.must("cuStreamWaitEvent", d.call(d.streamWaitEvent, b.stream, s.done, 0))
		s.copying = false
	}
	if s.bytes < n {
		if s.dev != 0 {
			b.mem.free(s.dev)
		}
		s.dev, s.bytes = b.mem.alloc(n), n
	}
	return s
}

// CopyOutAsync implements kernels.HostStaging: a snapshot of src in the
// wire format (the cast, or a copy for F32) is made on the compute stream
// after the gradient's kernels, and copied to the host on the copy stream,
// so backward goes on while the bucket crosses the bus; the ops queued
// after it may change src at once. The snapshot costs device memory of the
// bucket's wire size (for F32 as much as the gradients), allocated once
// per host buffer.
func (b *Backend) CopyOutAsync(dst []byte, src kernels.Tensor, wire dtype.DType) kernels.Fence {
	n := wireCheck(src, dst, wire, "CopyOutAsync")
	d := b.drv
	if n == 0 {
		// nothing to copy: a fence that opens when the work queued so far
		// is done (one event for every empty copy, under the key 0)
		s := b.staging[0]
		if s == nil {
			s = &stage{cast: b.event(), done: b.event()}
			b.staging[0] = s
		}
		d.must("cuEventRecord", d.call(d.eventRecord, s.done, b.stream))
		return fence{d: d, ev: s.done}
	}
	s := b.stageFor(dst, n)
	if wire == dtype.Float32 {
		b.begin()
		d.must("cuMemcpyDtoDAsync", d.call(d.memcpyDtoDAsync, s.dev, src.Ptr, uintptr(n), b.stream))
		b.end("copy device to device")
	} else {
		b.kern(kCast[[2]string{"f32", typeName(wire)}]).ptr(s.dev).ptr(src.Ptr).i64(src.Len()).flat(src.Len())
	}
	d.must("cuEventRecord", d.call(d.eventRecord, s.cast, b.stream))
	d.must("cuStreamWaitEvent", d.call(d.streamWaitEvent, b.copy, s.cast, 0))
	d.must("cuMemcpyDtoHAsync", d.call(d.memcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), s.dev, uintptr(n), b.copy))
	d.must("cuEventRecord", d.call(d.eventRecord, s.done, b.copy))
	s.copying = true
	return fence{d: d, ev: s.done}
}

// CopyIn implements kernels.HostStaging: the copy and the cast to F32 run
// on the compute stream (for a 16-bit wire through the stage's device
// buffer).
func (b *Backend) CopyIn(dst kernels.Tensor, src []byte, wire dtype.DType) {
	n := wireCheck(dst, src, wire, "CopyIn")
	if n == 0 {
		return
	}
	b.wrote(dst)
	d := b.drv
	if wire == dtype.Float32 {
		b.begin()
		d.must("cuMemcpyHtoDAsync", d.call(d.memcpyHtoDAsync, dst.Ptr, uintptr(unsafe.Pointer(&src[0])), uintptr(n), b.stream))
		b.end(opHostToDevice)
		return
	}
	s := b.stageFor(src, n) // after the last copy out of the stage
	b.begin()
	d.must("cuMemcpyHtoDAsync", d.call(d.memcpyHtoDAsync, s.dev, uintptr(unsafe.Pointer(&src[0])), uintptr(n), b.stream))
	b.end(opHostToDevice)
	b.kern(kCast[[2]string{typeName(wire), "f32"}]).ptr(dst.Ptr).ptr(s.dev).i64(dst.Len()).flat(dst.Len())
}
