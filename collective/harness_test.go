package collective

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/rank"
)

// group runs f on every rank of ts concurrently and returns the errors.
func group(ts []rank.Transport, cfg Config, f func(c *Communicator) error) []error {
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for r, t := range ts {
		wg.Add(1)
		go func(r int, t rank.Transport) {
			defer wg.Done()
			c, err := New(t, cfg)
			if err != nil {
				errs[r] = err
				return
			}
			defer c.Close()
			errs[r] = f(c)
		}(r, t)
	}
	wg.Wait()
	return errs
}

func firstErr(errs []error) error {
	for r, e := range errs {
		if e != nil {
			return fmt.Errorf("rank %d: %w", r, e)
		}
	}
	return nil
}

// inputs: small integers, so that sums are exact in every type.
func intValue(r, i int) float64 { return float64((r*7+i*13)%17 - 8) }

func makeBuf(dt dtype.DType, vals []float64) []byte {
	b := make([]byte, len(vals)*dt.Size())
	switch dt {
	case dtype.Float32:
		f := Float32s(b)
		for i, v := range vals {
			f[i] = float32(v)
		}
	case dtype.Float16:
		u := Uint16s(b)
		for i, v := range vals {
			u[i] = half.F32ToF16(float32(v))
		}
	case dtype.BFloat16:
		u := Uint16s(b)
		for i, v := range vals {
			u[i] = half.F32ToBF16(float32(v))
		}
	}
	return b
}

func readBuf(dt dtype.DType, b []byte) []float64 {
	out := make([]float64, len(b)/dt.Size())
	switch dt {
	case dtype.Float32:
		for i, v := range Float32s(b) {
			out[i] = float64(v)
		}
	case dtype.Float16:
		for i, v := range Uint16s(b) {
			out[i] = float64(half.F16ToF32(v))
		}
	case dtype.BFloat16:
		for i, v := range Uint16s(b) {
			out[i] = float64(half.BF16ToF32(v))
		}
	}
	return out
}

// roundTo rounds a float32 value to dt.
func roundTo(dt dtype.DType, v float32) float64 {
	switch dt {
	case dtype.Float16:
		return float64(half.F16ToF32(half.F32ToF16(v)))
	case dtype.BFloat16:
		return float64(half.BF16ToF32(half.F32ToBF16(v)))
	}
	return float64(v)
}

// reference computes the float64 reduction of vals[r][i] over r.
func reference(vals [][]float64, op Op) []float64 {
	out := append([]float64(nil), vals[0]...)
	for _, v := range vals[1:] {
		for i := range out {
			switch op {
			case Sum, Average:
				out[i] += v[i]
			case Min:
				out[i] = math.Min(out[i], v[i])
			case Max:
				out[i] = math.Max(out[i], v[i])
			}
		}
	}
	if op == Average {
		for i := range out {
			out[i] /= float64(len(vals))
		}
	}
	return out
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
