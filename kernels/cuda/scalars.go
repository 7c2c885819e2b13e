package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/gorun/gorun/kernels"
)

// Deferred scalars (kernels.DeferredScalars). CrossEntropy, HasInfNaN and
// SumSquares each wait for the GPU to hand back their number: a training
// step that asked for its loss after the forward pass, for its gradients'
// overflow check before the update and for the weights' check after it
// waited three times, the GPU idle while the host caught up after each.
// The deferred forms queue their results into one small device buffer (the
// loss sum and count in double, two int flags), Adam and AdamRows read the
// overflow flag on the device (AdamArgs.SkipOnOverflow: the update of a
// step that overflowed is cancelled there), and TakeScalars reads the
// buffer back at the step's end: one synchronisation a step.

// deferredOut is the host copy of the buffer.
type deferredOut struct {
	loss  [2]float64 // sum, count (gr_xent's acc)
	flags [2]int32   // kernels.FlagOverflow, kernels.FlagWeights (gr_infnan_f32's flag)
}

// scalarBytes is the buffer's size: 16 bytes of loss, 8 of flags.
const scalarBytes = int(unsafe.Sizeof(deferredOut{}))

var _ kernels.DeferredScalars = (*Backend)(nil)

func flagOffset(f int) uintptr {
	if f != kernels.FlagOverflow && f != kernels.FlagWeights {
		panic(fmt.Sprintf("cuda: flag %d: want kernels.FlagOverflow or kernels.FlagWeights", f))
	}
	return unsafe.Offsetof(deferredOut{}.flags) + uintptr(4*f)
}

// skipFlag is the flag Adam's kernels read (0: none).
func (b *Backend) skipFlag(a kernels.AdamArgs) uintptr {
	if a.SkipOnOverflow {
		return b.scalars + flagOffset(kernels.FlagOverflow)
	}
	return 0
}

// CrossEntropySum implements kernels.DeferredScalars: gr_xent adding to
// the accumulator, no read-back.
func (b *Backend) CrossEntropySum(dlogits, logits, targets kernels.Tensor, ls float32, padID int32, gradScale float32) {
	b.xent(dlogits, logits, targets, ls, padID, gradScale, b.scalars)
}

// FlagInfNaN implements kernels.DeferredScalars: gr_infnan_f32 on the flag.
func (b *Backend) FlagInfNaN(x kernels.Tensor, f int) {
	b.kern(kInfNaN).ptr(b.scalars + flagOffset(f)).ptr(b.dev32(x, "x")).i64(x.Len()).flat(x.Len())
}

// TakeScalars implements kernels.DeferredScalars: the buffer's copy to the
// host and Sync (one wait for the stream, which also reports an index
// error), then the buffer cleared on the stream.
func (b *Backend) TakeScalars() (sum float64, count int, flags [2]bool) {
	b.begin()
	b.drv.must("cuMemcpyDtoHAsync", b.drv.call(b.drv.memcpyDtoHAsync, uintptr(unsafe.Pointer(b.scalarsOut)), b.scalars,
		uintptr(scalarBytes), b.stream))
	b.end(opDeviceToHost)
	b.Sync()
	o := *b.scalarsOut
	b.memset(b.scalars, scalarBytes)
	return o.loss[0], int(math.Round(o.loss[1])), [2]bool{o.flags[0] != 0, o.flags[1] != 0}
}
