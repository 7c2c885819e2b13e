package cuda

import (
	"fmt"
	"unsafe"

	"github.com/gorun/gorun/kernels"
)

// stage is the device side of one pinned host buffer that CopyOutAsync
// fills: the bucket cast to the wire format on the device (nothing when
// the wire is float32), and the events that order the copy.
type stage struct {
	dev   uintptr // wire-format copy on the device (0 for F32)
	bytes int
	cast  uintptr // event: the cast (or the gradient) is ready on the compute stream
	done  uintptr // event: the copy to the host has finished
	used  bool
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

func (b *Backend) event() uintptr {
	var ev uintptr
	b.drv.must("cuEventCreate", b.drv.call(b.drv.eventCreate, uintptr(unsafe.Pointer(&ev)), eventBlockingSync|eventDisableTiming))
	return ev
}

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

func wireCheck(src kernels.Tensor, dst []byte, wire kernels.DType, op string) int {
	if src.DType != kernels.F32 || wire == kernels.I32 {
		panic(fmt.Sprintf("cuda: %s of %v as %v", op, src, wire))
	}
	n := src.Len() * wire.Size()
	if len(dst) < n {
		panic(fmt.Sprintf("cuda: %s: %d host bytes for %v as %v (%d bytes)", op, len(dst), src, wire, n))
	}
	return n
}

// stageFor returns the stage of a pinned buffer, made on first use.
func (b *Backend) stageFor(host []byte, n int, wire kernels.DType) *stage {
	key := uintptr(unsafe.Pointer(&host[0]))
	s := b.staging[key]
	if s == nil || s.bytes < n {
		if s != nil && s.dev != 0 {
			b.mem.free(s.dev)
		}
		s = &stage{bytes: n, cast: b.event(), done: b.event()}
		if wire != kernels.F32 {
			s.dev = b.mem.alloc(n)
		}
		b.staging[key] = s
	}
	if wire != kernels.F32 && s.dev == 0 {
		s.dev = b.mem.alloc(s.bytes)
	}
	return s
}

// CopyOutAsync implements kernels.HostStaging: the cast runs on the
// compute stream after the gradient's kernels, the copy on the copy
// stream, so backward goes on while the bucket crosses the bus.
func (b *Backend) CopyOutAsync(dst []byte, src kernels.Tensor, wire kernels.DType) kernels.Fence {
	n := wireCheck(src, dst, wire, "CopyOutAsync")
	d := b.drv
	s := b.stageFor(dst, n, wire)
	from := src.Ptr
	if s.used {
		// the previous copy out of this stage must be over before the
		// cast overwrites its device buffer
		d.must("cuStreamWaitEvent", d.call(d.streamWaitEvent, b.stream, s.done, 0))
	}
	if wire != kernels.F32 {
		b.kern(kCast[[2]string{"f32", typeName(wire)}]).ptr(s.dev).ptr(src.Ptr).i64(src.Len()).flat(src.Len())
		from = s.dev
	}
	d.must("cuEventRecord", d.call(d.eventRecord, s.cast, b.stream))
	d.must("cuStreamWaitEvent", d.call(d.streamWaitEvent, b.copy, s.cast, 0))
	if n > 0 {
		d.must("cuMemcpyDtoHAsync", d.call(d.memcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), from, uintptr(n), b.copy))
	}
	d.must("cuEventRecord", d.call(d.eventRecord, s.done, b.copy))
	s.used = true
	return fence{d: d, ev: s.done}
}

// CopyIn implements kernels.HostStaging.
func (b *Backend) CopyIn(dst kernels.Tensor, src []byte, wire kernels.DType) {
	n := wireCheck(dst, src, wire, "CopyIn")
	if n == 0 {
		return
	}
	d := b.drv
	if wire == kernels.F32 {
		b.begin()
		d.must("cuMemcpyHtoDAsync", d.call(d.memcpyHtoDAsync, dst.Ptr, uintptr(unsafe.Pointer(&src[0])), uintptr(n), b.stream))
		b.end(opHostToDevice)
		return
	}
	s := b.stageFor(src, n, wire)
	if s.used {
		d.must("cuStreamWaitEvent", d.call(d.streamWaitEvent, b.stream, s.done, 0))
	}
	b.begin()
	d.must("cuMemcpyHtoDAsync", d.call(d.memcpyHtoDAsync, s.dev, uintptr(unsafe.Pointer(&src[0])), uintptr(n), b.stream))
	b.end(opHostToDevice)
	b.kern(kCast[[2]string{typeName(wire), "f32"}]).ptr(dst.Ptr).ptr(s.dev).i64(dst.Len()).flat(dst.Len())
}
