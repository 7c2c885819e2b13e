package fusion

// LossScaler is OpenSeq2Seq's Backoff loss scaler for mixed-precision
// training: multiply the loss by Scale before backward, unscale the
// gradients (Bucketer.SetScale(1/Scale)), and call Update with the step's
// overflow flag; when it returns true, skip the optimizer step.
type LossScaler struct {
	Scale    float32 // current scale (starts at 2^14)
	Min, Max float32 // bounds (1 and 2^24)
	Factor   float32 // backoff / growth factor (2)
	Window   int     // clean steps before growing (2000)
	Clean    int     // clean steps since the scale last changed (kept in checkpoints)
}

// NewLossScaler returns OpenSeq2Seq's defaults: scale 2^14, x0.5 on an
// overflow, x2 after 2000 steps without one, within [1, 2^24].
func NewLossScaler() *LossScaler {
	return &LossScaler{Scale: 1 << 14, Min: 1, Max: 1 << 24, Factor: 2, Window: 2000}
}

// Update records one step and reports whether it must be skipped.
func (l *LossScaler) Update(overflow bool) (skip bool) {
	if overflow {
		l.Scale = max(l.Scale/l.Factor, l.Min)
		l.Clean = 0
		return true
	}
	l.Clean++
	if l.Clean >= l.Window {
		l.Scale = min(l.Scale*l.Factor, l.Max)
		l.Clean = 0
	}
	return false
}
