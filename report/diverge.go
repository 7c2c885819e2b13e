package report

import (
	"fmt"
	"math"
)

// DivergeFactor is how many times its lowest so far the smoothed loss must
// be, besides above ln(V), for LossDiverging.
const DivergeFactor = 10

// LossDiverging is the rule of the loss growth warning (the trainer's log
// line, the report): the smoothed raw loss (cross entropy, an exponential
// moving average over steps) is more than DivergeFactor times the lowest
// it was so far and above ln(vocab), the loss of a uniform guess among
// vocab pieces. A healthy run cannot meet it, warm-up included: it starts
// near ln(vocab) (its lowest so far is then its current value) and falls,
// and its noise is far from a factor 10; a run whose loss grows by orders
// of magnitude (a learning rate too high) meets it at the log line where
// the growth passes the factor. Either condition alone could fire
// wrongly: ln(vocab) on a freshly initialized model (a little above it),
// the factor on a model near zero loss. False for an unknown vocab (0).
func LossDiverging(smoothed, lowest float64, vocab int) bool {
	if vocab < 2 || !(lowest > 0) || math.IsNaN(smoothed) {
		return false
	}
	return smoothed > DivergeFactor*lowest && smoothed > math.Log(float64(vocab))
}

// DescribeDiverging is the trainer's warning when LossDiverging holds at
// a log line.
func DescribeDiverging(step int64, smoothed, lowest float64, vocab int) string {
	return fmt.Sprintf("step %s: the loss is growing: smoothed raw loss %s is %s times its lowest so far (%.2f) and above ln(%d) = %.2f, the loss of a uniform guess: the run is diverging (a smaller --learning-rate or more --warmup-steps)",
		Commas(step), lossNum(smoothed), Commas(int64(smoothed/lowest)), lowest, vocab, math.Log(float64(vocab)))
}

// lossNum writes a loss: 2 decimals, or a whole number with commas from
// 1000 up.
func lossNum(v float64) string {
	if math.Abs(v) >= 1000 && !math.IsInf(v, 0) {
		return Commas(int64(math.Round(v)))
	}
	return fmt.Sprintf("%.2f", v)
}
