package report

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/gorun/gorun/metrics"
)

// Point is one sample of a series.
type Point struct {
	Step int64
	Time float64
	V    float64
}

func series(recs []metrics.Record, kind, name string) []Point {
	var out []Point
	for _, r := range recs {
		if r.Kind != kind {
			continue
		}
		if v, ok := r.Values[name]; ok && !math.IsNaN(v) && !math.IsInf(v, 0) { // non-finite values are recorded, not plotted
			out = append(out, Point{Step: r.Step, Time: r.Time, V: v})
		}
	}
	return out
}

// perRank returns the series name_rankR of every rank R that has one, by
// rank.
func perRank(recs []metrics.Record, kind, name string) [][]Point {
	n := 0
	for _, r := range recs {
		if r.Kind != kind {
			continue
		}
		for k := range r.Values {
			if rs, ok := strings.CutPrefix(k, name+"_rank"); ok {
				if i, err := strconv.Atoi(rs); err == nil && i >= 0 {
					n = max(n, i+1)
				}
			}
		}
	}
	out := make([][]Point, n)
	for i := range out {
		out[i] = series(recs, kind, fmt.Sprintf("%s_rank%d", name, i))
	}
	return out
}

// sumSeries adds series sampled at the same steps (a step missing from
// one is left out).
func sumSeries(a, b []Point) []Point {
	bm := map[int64]float64{}
	for _, q := range b {
		bm[q.Step] = q.V
	}
	var out []Point
	for _, q := range a {
		if v, ok := bm[q.Step]; ok {
			out = append(out, Point{Step: q.Step, Time: q.Time, V: q.V + v})
		}
	}
	return out
}

func mean(p []Point) float64 {
	if len(p) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, x := range p {
		s += x.V
	}
	return s / float64(len(p))
}

// cv is the coefficient of variation of p: its standard deviation over
// its mean's magnitude (NaN for fewer than 2 points or a zero mean).
func cv(p []Point) float64 {
	m := mean(p)
	if len(p) < 2 || m == 0 {
		return math.NaN()
	}
	var ss float64
	for _, q := range p {
		ss += (q.V - m) * (q.V - m)
	}
	return math.Sqrt(ss/float64(len(p)-1)) / math.Abs(m)
}

// slope fits v = a + b*step by least squares and returns b.
func slope(p []Point) float64 {
	if len(p) < 2 {
		return math.NaN()
	}
	var sx, sy, sxx, sxy float64
	n := float64(len(p))
	for _, q := range p {
		x := float64(q.Step)
		sx += x
		sy += q.V
		sxx += x * x
		sxy += x * q.V
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return math.NaN()
	}
	return (n*sxy - sx*sy) / d
}

// pearson correlates two series sampled at the same steps.
func pearson(a, b []Point) (float64, int) {
	bm := map[int64]float64{}
	for _, q := range b {
		bm[q.Step] = q.V
	}
	var xs, ys []float64
	for _, q := range a {
		if v, ok := bm[q.Step]; ok {
			xs = append(xs, q.V)
			ys = append(ys, v)
		}
	}
	n := len(xs)
	if n < 3 {
		return math.NaN(), n
	}
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(n)
	my /= float64(n)
	var sxy, sxx, syy float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
		syy += (ys[i] - my) * (ys[i] - my)
	}
	if sxx == 0 || syy == 0 {
		return math.NaN(), n
	}
	return sxy / math.Sqrt(sxx*syy), n
}

// chanceR is the largest |r| that n pairs of unrelated numbers give 19
// times in 20 (Fisher's z: tanh(1.96/sqrt(n-3))).
func chanceR(n int) float64 {
	return math.Tanh(1.96 / math.Sqrt(float64(n-3)))
}

// tail is the last evaluations a trend at the end is fitted to: 30 % of
// them, at least 3 (all of them when there are fewer).
func tail(p []Point) []Point {
	k := max(3, int(math.Ceil(float64(len(p))*0.3)))
	return p[len(p)-min(k, len(p)):]
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func nearest(p []Point, step int64) float64 {
	best, bd := math.NaN(), int64(math.MaxInt64)
	for _, q := range p {
		d := q.Step - step
		if d < 0 {
			d = -d
		}
		if d < bd {
			best, bd = q.V, d
		}
	}
	return best
}

func median(p []Point) float64 {
	if len(p) == 0 {
		return math.NaN()
	}
	v := make([]float64, len(p))
	for i, q := range p {
		v[i] = q.V
	}
	sort.Float64s(v)
	return v[len(v)/2]
}

func maxOf(p []Point) float64 {
	m := math.NaN()
	for _, x := range p {
		if math.IsNaN(m) || x.V > m {
			m = x.V
		}
	}
	return m
}
