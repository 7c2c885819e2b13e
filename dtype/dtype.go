// Package dtype names the element types: of a tensor on a compute backend,
// of a buffer a collective reduces, of a fused bucket on the wire and of the
// planner's traffic. One type, so that a value passes between them as is.
package dtype

import "fmt"

// DType is the element type of a tensor or a buffer. The zero value is
// unset: a setting of this type that is left zero takes the default its
// owner documents.
type DType uint8

// Element types. The values travel in collective call headers (4 bits).
const (
	Float32  DType = 1
	Float16  DType = 2 // IEEE 754 binary16
	BFloat16 DType = 3
	Int32    DType = 4
	Uint8    DType = 5 // raw bytes: what Allgather and Broadcast move
)

// Size is the size of one element in bytes; 0 for an unset or unknown type.
func (d DType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case Float16, BFloat16:
		return 2
	case Uint8:
		return 1
	}
	return 0
}

// Float says whether d is one of the floating-point types (the ones a
// reduction and the wire of a bucket take).
func (d DType) Float() bool { return d == Float32 || d == Float16 || d == BFloat16 }

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	case Int32:
		return "int32"
	case Uint8:
		return "uint8"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Parse reads a floating-point type by the names nccl-tests' -d flag uses
// (float, half, bfloat16), the String forms and the short forms (f32, fp16,
// bf16, ...).
func Parse(s string) (DType, error) {
	switch s {
	case "float", "float32", "f32", "fp32":
		return Float32, nil
	case "half", "float16", "f16", "fp16":
		return Float16, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	}
	return 0, fmt.Errorf("unknown data type %q (want float, half or bfloat16)", s)
}
