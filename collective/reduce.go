package collective

import (
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/half"
)

// reducer combines received slices into the accumulator. The accumulator
// holds elements of type dtype; received and sent slices hold elements of
// type wire (equal to dtype except for float32 data sent as float16 or
// bfloat16). All arithmetic is float32; every rank applies the same
// operations in the same order to each element, so results are
// reproducible bit for bit.
type reducer struct {
	dtype, wire dtype.DType
	op          Op
	n           int // world size, for Average
	a, b        []float32
	take        func(n int) []byte // where a and b come from (nil: make)
}

func newReducer(dtype, wire dtype.DType, op Op, n int) *reducer {
	return &reducer{dtype: dtype, wire: wire, op: op, n: n}
}

// scratch returns *p with n elements, taking a larger buffer when it is
// too small. a and b are taken separately: most combines need only one.
func (r *reducer) scratch(p *[]float32, n int) []float32 {
	if cap(*p) < n {
		if r.take != nil {
			*p = Float32s(r.take(4 * n))
		} else {
			*p = make([]float32, n)
		}
	}
	return (*p)[:n]
}

// decode converts wire-format bytes into float32.
func decode(dst []float32, src []byte, t dtype.DType) {
	switch t {
	case dtype.Float32:
		copy(dst, Float32s(src))
	case dtype.Float16:
		half.Float16ToFloat32(dst, Uint16s(src))
	case dtype.BFloat16:
		half.BFloat16ToFloat32(dst, Uint16s(src))
	}
}

// encode converts float32 into bytes of type t.
func encode(dst []byte, src []float32, t dtype.DType) {
	switch t {
	case dtype.Float32:
		copy(Float32s(dst), src)
	case dtype.Float16:
		half.Float32ToFloat16(Uint16s(dst), src)
	case dtype.BFloat16:
		half.Float32ToBFloat16(Uint16s(dst), src)
	}
}

// combine sets acc = acc (op) in, elementwise. acc holds dtype elements, in
// holds wire elements.
func (r *reducer) combine(acc, in []byte) { r.combineOrdered(acc, in, false) }

// combineOrdered is combine with in as the first operand when inFirst:
// the two ends of an exchange (recursive doubling) each combine the lower
// rank's value first, so that both compute the same bits even where the
// operation's operand order shows (two NaNs: the first one's payload).
func (r *reducer) combineOrdered(acc, in []byte, inFirst bool) {
	ne := len(acc) / r.dtype.Size()
	if ne == 0 {
		return
	}
	if r.dtype == dtype.Float32 {
		x := Float32s(acc)
		var y []float32
		if r.wire == dtype.Float32 {
			y = Float32s(in)
		} else {
			b := r.scratch(&r.b, ne)
			decode(b, in, r.wire)
			y = b
		}
		first, second := x, y
		if inFirst {
			first, second = y, x
		}
		apply(x, first, second, r.op)
		return
	}
	a, b := r.scratch(&r.a, ne), r.scratch(&r.b, ne)
	decode(a, acc, r.dtype)
	decode(b, in, r.wire)
	first, second := a, b
	if inFirst {
		first, second = b, a
	}
	apply(a, first, second, r.op)
	encode(acc, a, r.dtype)
}

// finish applies the last step to a fully reduced slice: the division of
// Average.
func (r *reducer) finish(acc []byte) {
	if r.op != Average || r.n == 1 {
		return
	}
	ne := len(acc) / r.dtype.Size()
	if ne == 0 {
		return
	}
	d := float32(r.n)
	if r.dtype == dtype.Float32 {
		x := Float32s(acc)
		for i := range x {
			x[i] /= d
		}
		return
	}
	a := r.scratch(&r.a, ne)
	decode(a, acc, r.dtype)
	for i := range a {
		a[i] /= d
	}
	encode(acc, a, r.dtype)
}

// toWire converts a dtype slice to wire format into dst (len = elements *
// wire size). Only used when wire != dtype (float32 data).
func (r *reducer) toWire(dst, acc []byte) {
	encode(dst, Float32s(acc), r.wire)
}

// fromWire converts wire bytes into the dtype accumulator.
func (r *reducer) fromWire(acc, src []byte) {
	decode(Float32s(acc), src, r.wire)
}

// put writes acc (dtype) into w in the wire format (a copy when they are
// the same); get reads it back.
func (r *reducer) put(w, acc []byte) {
	if r.wire != r.dtype {
		r.toWire(w, acc)
	} else {
		copy(w, acc)
	}
}

func (r *reducer) get(acc, w []byte) {
	if r.wire != r.dtype {
		r.fromWire(acc, w)
	} else {
		copy(acc, w)
	}
}

// apply sets dst = a (op) b elementwise, a the first operand (a NaN in a
// wins in a Sum); dst may be a or b, and a and b are at least as long.
func apply(dst, a, b []float32, op Op) {
	a, b = a[:len(dst)], b[:len(dst)]
	switch op {
	case Sum, Average:
		addF32(dst, a, b)
	case Min:
		for i := range dst {
			dst[i] = min(a[i], b[i])
		}
	case Max:
		for i := range dst {
			dst[i] = max(a[i], b[i])
		}
	}
}
