// Package kernels defines the tensor type and the compute-backend interface
// that the Transformer is written against. Each op has its forward and its
// backward written out (llm.c style): there is no autodiff.
//
// A Tensor is a view: dtype, up to MaxRank dimensions, the device it lives on
// and its storage. On the CPU backend the storage is a Go slice (F32, I32 or
// U16 for f16/bf16); a device backend keeps a device pointer in Ptr. Views are
// plain values, so slicing a tensor or reshaping it allocates nothing.
package kernels

import (
	"fmt"

	"github.com/gorun/gorun/dtype"
)

// DeviceKind says where storage lives.
type DeviceKind uint8

// Device kinds.
const (
	CPU DeviceKind = iota
	CUDA
)

// Device names one device.
type Device struct {
	Kind  DeviceKind
	Index int
}

func (d Device) String() string {
	if d.Kind == CPU {
		return "cpu"
	}
	return fmt.Sprintf("cuda:%d", d.Index)
}

// MaxRank is the largest number of dimensions a Tensor has.
const MaxRank = 4

// Tensor is a typed, shaped view of storage on one device.
type Tensor struct {
	DType dtype.DType
	Rank  int
	Dims  [MaxRank]int
	Dev   Device
	// CPU storage: exactly one of these is set, according to DType, and its
	// length equals Len().
	F32 []float32
	I32 []int32
	U16 []uint16
	// Ptr is the device address of element 0 for non-CPU devices.
	Ptr uintptr
}

// Len is the number of elements.
func (t Tensor) Len() int {
	if t.Rank == 0 {
		return 0
	}
	n := 1
	for i := 0; i < t.Rank; i++ {
		n *= t.Dims[i]
	}
	return n
}

// Dim returns dimension i; a negative i counts from the end.
func (t Tensor) Dim(i int) int {
	if i < 0 {
		i += t.Rank
	}
	return t.Dims[i]
}

// Shape returns the dimensions as a new slice.
func (t Tensor) Shape() []int {
	s := make([]int, t.Rank)
	copy(s, t.Dims[:])
	return s
}

// Rows is the product of all dimensions but the last (the number of rows of
// the tensor seen as a matrix), and Cols the last dimension.
func (t Tensor) Rows() int { return t.Len() / t.Cols() }

// Cols is the last dimension.
func (t Tensor) Cols() int {
	if t.Rank == 0 {
		return 1
	}
	return t.Dims[t.Rank-1]
}

func (t Tensor) String() string {
	return fmt.Sprintf("%s%s@%s", t.DType, dimsOf(t), t.Dev)
}

// Reshape returns a view with other dimensions and the same number of elements.
func (t Tensor) Reshape(dims ...int) Tensor {
	if len(dims) > MaxRank || len(dims) == 0 {
		panic("kernels: reshape to a rank outside 1..4")
	}
	n := 1
	for _, d := range dims {
		n *= d
	}
	var nd [MaxRank]int
	copy(nd[:], dims)
	if n != t.Len() {
		panic(fmt.Sprintf("kernels: reshape %s to %v (rank %d)", dimsOf(t), nd, len(dims)))
	}
	t.Rank = len(dims)
	t.Dims = nd
	return t
}

// Slice returns the flat view of n elements starting at element off, with
// the given dimensions (whose product must be n).
func (t Tensor) Slice(off int, dims ...int) Tensor {
	n := 1
	for _, d := range dims {
		n *= d
	}
	if off < 0 || off+n > t.Len() {
		panic(fmt.Sprintf("kernels: slice [%d:%d] of %s", off, off+n, dimsOf(t)))
	}
	if len(dims) > MaxRank {
		panic("kernels: slice to a rank above 4")
	}
	v := t
	v.Rank = len(dims)
	v.Dims = [MaxRank]int{}
	copy(v.Dims[:], dims)
	switch {
	case t.F32 != nil:
		v.F32 = t.F32[off : off+n : off+n]
	case t.I32 != nil:
		v.I32 = t.I32[off : off+n : off+n]
	case t.U16 != nil:
		v.U16 = t.U16[off : off+n : off+n]
	default:
		v.Ptr = t.Ptr + uintptr(off*t.DType.Size())
	}
	return v
}

// RowSlice returns rows [lo, hi) of the first dimension.
func (t Tensor) RowSlice(lo, hi int) Tensor {
	per := t.Len() / t.Dims[0]
	dims := t.Dims
	dims[0] = hi - lo
	return t.Slice(lo*per, dims[:t.Rank]...)
}

// FromF32 wraps a CPU float32 slice as a tensor.
func FromF32(data []float32, dims ...int) Tensor {
	t := Tensor{DType: dtype.Float32, F32: data, Rank: len(dims)}
	copy(t.Dims[:], dims)
	if t.Len() != len(data) {
		panic(fmt.Sprintf("kernels: %d elements for shape %s", len(data), dimsOf(t)))
	}
	return t
}

// FromI32 wraps a CPU int32 slice as a tensor.
func FromI32(data []int32, dims ...int) Tensor {
	t := Tensor{DType: dtype.Int32, I32: data, Rank: len(dims)}
	copy(t.Dims[:], dims)
	if t.Len() != len(data) {
		panic(fmt.Sprintf("kernels: %d elements for shape %s", len(data), dimsOf(t)))
	}
	return t
}

// dimsOf formats the dimensions (a function of its own so that error paths
// do not make the caller's tensor escape to the heap).
//
//go:noinline
func dimsOf(t Tensor) string { return fmt.Sprint(t.Dims[:t.Rank]) }
