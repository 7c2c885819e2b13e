package transformer

import (
	"errors"
	"fmt"
)

// The model's weights and Adam's moments as named tensors, in and out of
// safetensors files (package checkpoint lays the files out), and their
// finite check. A host copy of either is laid out like m.Weights; a tensor
// is named after its parameter, "NAME" for a weight, "m/NAME" and "v/NAME"
// for the moments.

// ErrMismatch is wrapped by the errors of ReadWeights, and of loading a
// checkpoint (checkpoint.Load), when the tensors or the checkpoint belong
// to another model or vocabulary.
var ErrMismatch = errors.New("checkpoint does not match")

// ParamTensors returns data, a host copy of m's weights (or, with prefix
// "m/" or "v/", of a moment, laid out like them), as one tensor per
// parameter in m.Params's order: prefix+NAME, with the parameter's shape,
// over data's values (not a copy).
func ParamTensors(m *Model, prefix string, data []float32) []STensor {
	ts := make([]STensor, 0, len(m.Params))
	for _, p := range m.Params {
		ts = append(ts, STensor{Name: prefix + p.Name, Shape: p.Shape, Data: data[p.Offset : p.Offset+p.Len]})
	}
	return ts
}

// ReadWeights reads m's weights from f into a host copy: each parameter
// under its name, with its shape. A tensor missing or of another shape,
// or one more than m has, is an error that wraps ErrMismatch.
func ReadWeights(f *SafetensorsFile, m *Model) ([]float32, error) {
	host := make([]float32, m.NumParams())
	for _, p := range m.Params {
		if err := f.Read(p.Name, p.Shape, host[p.Offset:p.Offset+p.Len]); err != nil {
			return nil, fmt.Errorf("%w (%w)", err, ErrMismatch)
		}
	}
	if n := len(f.Names()); n != len(m.Params) {
		return nil, fmt.Errorf("%s: %w: %d tensors, the model has %d parameters", f.Path, ErrMismatch, n, len(m.Params))
	}
	return host, nil
}

// ReadMoments reads Adam's moments of m's parameters ("m/NAME" and
// "v/NAME", with the parameter's shape) from f into host copies.
func ReadMoments(f *SafetensorsFile, m *Model) (mh, vh []float32, err error) {
	mh, vh = make([]float32, m.NumParams()), make([]float32, m.NumParams())
	for _, p := range m.Params {
		if err := f.Read("m/"+p.Name, p.Shape, mh[p.Offset:p.Offset+p.Len]); err != nil {
			return nil, nil, err
		}
		if err := f.Read("v/"+p.Name, p.Shape, vh[p.Offset:p.Offset+p.Len]); err != nil {
			return nil, nil, err
		}
	}
	return mh, vh, nil
}

// NonFiniteError names the first NaN or infinite value of a tensor of
// weights ("NAME") or Adam moments ("m/NAME", "v/NAME"): what a diverged
// run holds. checkpoint.Save refuses to write one (its error wraps it).
type NonFiniteError struct {
	Tensor string
	Index  int
	Value  float64
}

func (e *NonFiniteError) Error() string {
	return fmt.Sprintf("tensor %s holds %v at index %d", e.Tensor, e.Value, e.Index)
}

// FirstNonFinite returns the first NaN or infinite value of data, a host
// copy of m's weights (or, with prefix "m/" or "v/", of a moment, laid out
// like them), or nil if every value is finite. It reads each value once.
func FirstNonFinite(m *Model, prefix string, data []float32) *NonFiniteError {
	for _, p := range m.Params {
		for i, v := range data[p.Offset : p.Offset+p.Len] {
			if v-v != 0 { // NaN or ±Inf
				return &NonFiniteError{Tensor: prefix + p.Name, Index: i, Value: float64(v)}
			}
		}
	}
	return nil
}
