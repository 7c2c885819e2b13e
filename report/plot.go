package report

import (
	"fmt"
	"image/color"
	"math"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Line is one named curve of a plot.
type Line struct {
	Name   string
	Points []Point
}

var palette = []color.RGBA{
	{R: 31, G: 119, B: 180, A: 255}, {R: 214, G: 39, B: 40, A: 255}, {R: 44, G: 160, B: 44, A: 255},
	{R: 255, G: 127, B: 14, A: 255}, {R: 148, G: 103, B: 189, A: 255}, {R: 140, G: 86, B: 75, A: 255},
}

// markedPoints is the most points a curve has for each to be marked with
// a dot: on a curve of a few points (evaluations) the reader sees where
// the measurements are and that the segments between are not.
const markedPoints = 30

// PlotPNG draws lines against the step and writes a PNG to file. Lines with
// no points are left out; a line of at most markedPoints points has each
// marked with a dot. The y axis runs from 0 (or the lowest value, if
// negative) to a little above the highest value (and the legend), so that
// the noise of a series far from 0 is not blown up to the plot's height. With no points
// at all it writes nothing and returns false.
func PlotPNG(file, title, ylabel string, lines ...Line) (bool, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "step"
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	drawn := 0
	lo, hi := 0.0, math.Inf(-1)
	for i, l := range lines {
		if len(l.Points) == 0 {
			continue
		}
		pts := append([]Point(nil), l.Points...)
		sort.SliceStable(pts, func(a, b int) bool { return pts[a].Step < pts[b].Step })
		xy := make(plotter.XYs, len(pts))
		for j, pt := range pts {
			xy[j].X, xy[j].Y = float64(pt.Step), pt.V
			lo, hi = min(lo, pt.V), max(hi, pt.V)
		}
		ln, err := plotter.NewLine(xy)
		if err != nil {
			return false, fmt.Errorf("plot %s: %w", file, err)
		}
		ln.Color = palette[i%len(palette)]
		ln.Width = vg.Points(1.5)
		p.Add(ln)
		if len(lines) > 1 {
			p.Legend.Add(l.Name, ln)
		}
		if len(pts) <= markedPoints {
			sc, err := plotter.NewScatter(xy)
			if err != nil {
				return false, fmt.Errorf("plot %s: %w", file, err)
			}
			sc.Color = ln.Color
			sc.Shape = draw.CircleGlyph{}
			sc.Radius = vg.Points(2.5)
			p.Add(sc)
		}
		drawn++
	}
	if drawn == 0 {
		return false, nil
	}
	hi = max(hi, 0)
	if hi <= lo {
		hi = lo + 1 // all zero
	}
	// room above the data for the legend's lines
	legend := 0
	if len(lines) > 1 {
		legend = drawn
	}
	p.Y.Min, p.Y.Max = lo, hi+(0.05+0.08*float64(legend))*(hi-lo)
	p.Legend.Top = true
	if err := p.Save(7*vg.Inch, 4*vg.Inch, file); err != nil {
		return false, fmt.Errorf("plot %s: %w", file, err)
	}
	return true, nil
}
