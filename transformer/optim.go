package transformer

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// Adam is TensorFlow's Adam, and with Lazy set its LazyAdam: the moments m
// and v live in flat buffers laid out like the weights, and the update is
//
//	m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//	p -= lr*sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)
//
// LazyAdam differs only for a parameter whose gradient is row-sparse (an
// embedding reached through a gather alone): only the rows that received a
// gradient are updated; the others keep their weights and their moments.
// In this model the embedding is tied to the softmax projection, whose
// gradient reaches every row, so, as in TensorFlow (where the dense matmul
// gradient densifies the IndexedSlices of the gather), every parameter gets
// the dense update; SparseRows lets a caller declare row-sparse gradients.
type Adam struct {
	Lazy              bool
	Beta1, Beta2, Eps float64
	// T is the number of updates applied so far.
	T int
	// M and V are the first and second moments, indexed like Weights.
	M, V kernels.Tensor
	// SkipOnOverflow cancels the updates of a Step on the device when the
	// backend's overflow flag is raised (kernels.DeferredScalars: the
	// gradients were found not finite without a synchronisation). T counts
	// the Step all the same; a caller that learns of the overflow (with
	// TakeScalars) takes it back.
	SkipOnOverflow bool
	// SparseRows, for a lazy optimizer, maps a parameter index to the rows
	// (of its [rows, cols] shape) that received a gradient this step, each
	// row once.
	SparseRows map[int][]int32

	be   kernels.Backend
	rows slot
}

// NewLazyAdam returns OpenSeq2Seq's optimizer: LazyAdam with beta1 0.9,
// beta2 0.997, epsilon 1e-9.
func NewLazyAdam(m *Model) *Adam {
	o := NewAdam(m, 0.9, 0.997, 1e-9)
	o.Lazy = true
	return o
}

// NewAdam returns a dense Adam optimizer for m.
func NewAdam(m *Model, beta1, beta2, eps float64) *Adam {
	be := m.be
	return &Adam{Beta1: beta1, Beta2: beta2, Eps: eps, be: be,
		M: be.Alloc(dtype.Float32, m.NumParams()), V: be.Alloc(dtype.Float32, m.NumParams())}
}

// Name is "lazyadam" or "adam".
func (o *Adam) Name() string {
	if o.Lazy {
		return "lazyadam"
	}
	return "adam"
}

// Step applies one update with learning rate lr to every parameter of m.
// wait, if not nil, is called with each parameter index before that
// parameter is updated, in gradient-ready order (last parameter first), so
// that a trainer can wait for the all-reduce of the bucket holding it.
func (o *Adam) Step(m *Model, lr float64, wait func(param int)) error {
	if o.M.Len() != m.NumParams() {
		return fmt.Errorf("transformer: optimizer state for %d parameters, model has %d", o.M.Len(), m.NumParams())
	}
	o.T++
	t := float64(o.T)
	lrT := lr * math.Sqrt(1-math.Pow(o.Beta2, t)) / (1 - math.Pow(o.Beta1, t))
	a := kernels.AdamArgs{LR: float32(lrT), Beta1: float32(o.Beta1), Beta2: float32(o.Beta2), Eps: float32(o.Eps),
		SkipOnOverflow: o.SkipOnOverflow}
	for i := len(m.Params) - 1; i >= 0; i-- {
		if wait != nil {
			wait(i)
		}
		p := m.Params[i]
		w, g := m.w[i], m.g[i]
		mm, vv := o.M.Slice(p.Offset, p.Shape...), o.V.Slice(p.Offset, p.Shape...)
		if rows, ok := o.SparseRows[i]; o.Lazy && ok && len(p.Shape) == 2 {
			rt := o.rows.shape(o.be, dtype.Int32, len(rows))
			o.be.UploadI32(rt, rows)
			o.be.AdamRows(w, g, mm, vv, rt, a)
			continue
		}
		o.be.Adam(w, g, mm, vv, a)
	}
	return nil
}
