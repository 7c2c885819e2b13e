package transformer

import (
	"fmt"
	"math"
)

// LRPolicy maps a 0-based global step to a learning rate.
type LRPolicy interface {
	LR(step int) float64
}

// TransformerPolicy is OpenSeq2Seq's transformer_policy:
// lr = LearningRate * DModel^-0.5 * min((step+1) * Warmup^-1.5, (step+1)^-0.5).
type TransformerPolicy struct {
	LearningRate float64
	DModel       int
	Warmup       int
}

// LR implements LRPolicy.
func (p TransformerPolicy) LR(step int) float64 {
	s := float64(step + 1)
	return p.LearningRate * math.Pow(float64(p.DModel), -0.5) * math.Min(s*math.Pow(float64(p.Warmup), -1.5), math.Pow(s, -0.5))
}

// InverseSqrt warms up linearly to LearningRate over Warmup steps and then
// decays as (Warmup/(step+1))^0.5 (fairseq's inverse_sqrt).
type InverseSqrt struct {
	LearningRate float64
	Warmup       int
}

// LR implements LRPolicy.
func (p InverseSqrt) LR(step int) float64 {
	s := float64(step + 1)
	w := float64(p.Warmup)
	if w > 0 && s < w {
		return p.LearningRate * s / w
	}
	if w <= 0 {
		w = 1
	}
	return p.LearningRate * math.Sqrt(w/s)
}

// Constant is a fixed learning rate.
type Constant float64

// LR implements LRPolicy.
func (c Constant) LR(int) float64 { return float64(c) }

// ParsePolicy builds a policy from its name: "transformer" (needs dModel and
// warmup), "inverse_sqrt" or "constant".
func ParsePolicy(name string, lr float64, dModel, warmup int) (LRPolicy, error) {
	switch name {
	case "transformer", "transformer_policy":
		if warmup < 1 {
			return nil, fmt.Errorf("transformer: transformer_policy needs warmup steps >= 1, got %d", warmup)
		}
		return TransformerPolicy{LearningRate: lr, DModel: dModel, Warmup: warmup}, nil
	case "inverse_sqrt":
		return InverseSqrt{LearningRate: lr, Warmup: warmup}, nil
	case "constant":
		return Constant(lr), nil
	}
	return nil, fmt.Errorf("transformer: unknown learning-rate policy %q (transformer, inverse_sqrt, constant)", name)
}
