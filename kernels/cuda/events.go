package cuda

import (
	"errors"
	"log"
	"unsafe"
)

// logf prints the backend's rare notices (a test replaces it).
var logf = log.Printf

// fenceEvent creates an event for a Fence: blocking-sync (a thread waiting
// on it sleeps in the driver instead of spinning a core), with no timing.
// Some sandboxes' drivers refuse blocking-sync events; then the backend
// says so once, in one log line, and makes default events from then on
// (a waiting thread spins: correct, and one core busy while it waits).
func (b *Backend) fenceEvent() uintptr {
	d := b.drv
	var ev uintptr
	if !b.spinEvents {
		r := d.call(d.eventCreate, uintptr(unsafe.Pointer(&ev)), eventBlockingSync|eventDisableTiming)
		if r == cuSuccess {
			return ev
		}
		err := d.check("cuEventCreate (blocking sync)", r)
		var ce *Error
		if errors.As(err, &ce) && ce.Code == cuOutOfMemoryCode {
			panic(err) // not a refusal of the flag
		}
		b.spinEvents = true
		logf("cuda: blocking-sync events refused (%v); using default events, so a thread waiting for a gradient copy spins on a core", err)
	}
	d.must("cuEventCreate", d.call(d.eventCreate, uintptr(unsafe.Pointer(&ev)), eventDisableTiming))
	return ev
}

// cuOutOfMemoryCode is CUDA_ERROR_OUT_OF_MEMORY.
const cuOutOfMemoryCode = 2
