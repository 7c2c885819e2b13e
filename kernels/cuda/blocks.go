package cuda

import (
	"fmt"
	"strings"
	"sync"
)

// Launch sizes. Every kernel of kernels.cu is launched in one of four
// shapes (docs/cuda.md, "Launch shapes"), and each shape has a largest
// block: these constants, which kernels.cu's GR_FLAT_THREADS,
// GR_ROW_THREADS, GR_COL_THREADS and GR_MAT_THREADS repeat. Every kernel
// declares its shape's number as its __launch_bounds__ (the PTX's
// .maxntid), so that ptxas keeps its registers within what that many
// threads may use (65536 registers a multiprocessor on compute capability
// 7.0 to 9.0) and the driver refuses a larger block. The tests check the
// three places against each other: TestLaunchBoundsMatchPTX (every
// kernel's .maxntid in both PTX files is its shape's number here, and
// kernels.cu's defines are these constants), and grid panics on a block
// above its kernel's bound. `make ptx-check` (kernels/cuda/ptx.sh) runs
// ptxas -v for sm_70, sm_80 and sm_90 and fails when a kernel has no
// .maxntid, when registers x .maxntid exceed 65536, or when a kernel of
// hot_kernels.txt spills.
const (
	flatThreads   = 256     // flat: 1-D grid-stride loops (launch.flat)
	rowMaxThreads = 512     // row: one block per row, sized to the row (rowThreads)
	colThreads    = 32 * 32 // col: column reductions (launch.cols)
	matMaxThreads = 1024    // mat: one block per matrix (orthoThreads)
)

// launchShape is how a kernel is launched.
type launchShape uint8

const (
	shapeFlat launchShape = iota + 1
	shapeRow
	shapeCol
	shapeMat
)

func (s launchShape) String() string {
	return [...]string{"?", "flat", "row", "col", "mat"}[s]
}

// maxThreads is the largest block of the shape.
func (s launchShape) maxThreads() int {
	switch s {
	case shapeFlat:
		return flatThreads
	case shapeRow:
		return rowMaxThreads
	case shapeCol:
		return colThreads
	case shapeMat:
		return matMaxThreads
	}
	return 0
}

// opShapes is each kernel's launch shape, by op: the kernel's name without
// "gr_" and its type suffix (_f32, _f16, _bf16; the casts are "cast").
var opShapes = map[string]launchShape{
	"scale": shapeFlat, "axpy": shapeFlat, "cast": shapeFlat, "infnan": shapeFlat, "sumsq": shapeFlat,
	"col_sum": shapeFlat, "adam": shapeFlat, "adam_rows": shapeFlat, "add_bias": shapeFlat,
	"relu_bwd": shapeFlat, "bias_relu_dropout": shapeFlat, "dropout": shapeFlat, "embedding": shapeFlat, "embedding_bwd": shapeFlat,
	"add_pos": shapeFlat, "split_heads": shapeFlat, "merge_heads": shapeFlat, "gather_rows": shapeFlat,
	"write_step": shapeFlat,

	"layernorm": shapeRow, "layernorm_bwd": shapeRow, "attn_softmax": shapeRow, "attn_softmax_bwd": shapeRow,
	"xent": shapeRow, "log_softmax": shapeRow, "residual_dropout_layernorm": shapeRow,

	"bias_grad": shapeCol, "layernorm_bwd_params": shapeCol,

	"orthonormalize": shapeMat,
}

// kernelOp is the op of a kernel name: gr_layernorm_bwd_f16 ->
// layernorm_bwd, gr_cast_f32_bf16 -> cast.
func kernelOp(name string) string {
	op := strings.TrimPrefix(name, "gr_")
	if strings.HasPrefix(op, "cast_") {
		return "cast"
	}
	for _, s := range halfNames {
		if t, ok := strings.CutSuffix(op, "_"+s); ok {
			return t
		}
	}
	return op
}

// shapeOf is a kernel's launch shape (0 when opShapes lacks it).
func shapeOf(name string) launchShape { return opShapes[kernelOp(name)] }

// rowThreads is the block of a row kernel over rows of cols elements: a
// warp for short rows, up to rowMaxThreads for long ones.
func rowThreads(cols int) int {
	switch {
	case cols > 8192:
		return rowMaxThreads
	case cols > 1024:
		return 256
	case cols > 128:
		return 128
	}
	return 32
}

var (
	boundsOnce sync.Once
	boundOf    map[*kernel]int
)

// checkBlock panics when a launch's block exceeds its kernel's bound (the
// driver would refuse it with a less telling error).
func checkBlock(k *kernel, threads int) {
	boundsOnce.Do(func() {
		boundOf = map[*kernel]int{}
		for _, k := range allKernels() {
			boundOf[k] = shapeOf(k.name).maxThreads()
		}
	})
	b := boundOf[k]
	if b == 0 {
		panic(fmt.Sprintf("cuda: %s has no launch shape: add its op to opShapes (blocks.go) and its bound to kernels.cu", k.name))
	}
	if threads > b {
		panic(fmt.Sprintf("cuda: %s launched with %d threads a block; its bound (%s shape, __launch_bounds__) is %d",
			k.name, threads, shapeOf(k.name), b))
	}
}

// ptxFor is the PTX the backend loads on a device of compute capability
// cc: compute_70's on 7.x (V100, T4), compute_80's on 8.0 and above (A100,
// H100 and H200 at 9.0, and later), which the driver compiles for the
// device when it loads the module.
func ptxFor(cc [2]int) (name string, ptx []byte) {
	if cc[0] >= 8 {
		return "sm80", ptxSM80
	}
	return "sm70", ptxSM70
}
