package report

import (
	"image"
	"image/color"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestPlotPNG decodes what PlotPNG writes: a PNG of 7 x 4 inches at 96 dpi
// with each curve drawn in its color where its data says, points given in
// any order, lines without points left out (and not in the legend), a
// single point still visible (at the top: the y axis runs from 0 to a
// little above it), and nothing written without points.
func TestPlotPNG(t *testing.T) {
	dir := t.TempDir()
	blue, red, green := palette[0], palette[1], palette[2]

	// One line (no legend): a V with its minimum at step 30 of 0..99,
	// handed over shuffled.
	v := func(s int64) float64 { return math.Abs(float64(s) - 30) }
	var pts []Point
	for s := int64(0); s < 100; s++ {
		pts = append(pts, Point{Step: s, V: v(s)})
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(pts), func(i, j int) { pts[i], pts[j] = pts[j], pts[i] })
	img := plotImage(t, filepath.Join(dir, "v.png"), Line{"v", pts})
	if b := img.Bounds(); b.Dx() != 7*96 || b.Dy() != 4*96 {
		t.Fatalf("image %dx%d, want %dx%d (7 x 4 inches at 96 dpi)", b.Dx(), b.Dy(), 7*96, 4*96)
	}
	c := curveOf(img, blue)
	if c.x1-c.x0 < img.Bounds().Dx()/2 {
		t.Fatalf("the curve spans columns %d..%d of %d", c.x0, c.x1, img.Bounds().Dx())
	}
	// The data's frame in pixels, from the ends and the extremes of what
	// was drawn: step 0 at column x0, step 99 at x1; value 0 (the lowest)
	// at the lowest drawn row, value 69 (the highest, at step 99) at the
	// highest.
	yLow, yHigh := c.maxY(), c.minY()
	if yLow-yHigh < img.Bounds().Dy()/2 {
		t.Fatalf("the curve spans rows %d..%d of %d", yHigh, yLow, img.Bounds().Dy())
	}
	for s := int64(0); s < 100; s += 3 {
		x := c.x0 + int(math.Round(float64(s)/99*float64(c.x1-c.x0)))
		want := float64(yLow) - v(s)/69*float64(yLow-yHigh)
		got, ok := c.meanY(x)
		if !ok || math.Abs(got-want) > 4 {
			t.Errorf("step %d (value %v): the curve is at row %.1f of column %d (drawn: %v), want row %.0f", s, v(s), got, x, ok, want)
		}
	}

	// Two lines and an empty one: a legend at the top right; the rising
	// line in the first color, the falling one in the second, the empty
	// one (third color) nowhere.
	var up, down []Point
	for s := int64(0); s <= 40; s += 4 {
		up = append(up, Point{Step: s, V: float64(s)})
		down = append(down, Point{Step: s, V: 40 - float64(s)/2})
	}
	img = plotImage(t, filepath.Join(dir, "two.png"), Line{"up", up}, Line{"down", down}, Line{"empty", nil})
	cu, cd := curveOf(img, blue), curveOf(img, red)
	if n := curveOf(img, green).n; n > 0 {
		t.Errorf("%d pixels of the empty line's color", n)
	}
	w := img.Bounds().Dx()
	// left of the legend: compare a column near the start with one 60 %
	// of the way across
	for _, k := range []struct {
		name   string
		c      curve
		rising bool
	}{{"up", cu, true}, {"down", cd, false}} {
		if k.c.n == 0 {
			t.Fatalf("line %s: not drawn", k.name)
		}
		xa, xb := k.c.x0+3, k.c.x0+3*(w-k.c.x0)/5
		ya, oka := k.c.meanY(xa)
		yb, okb := k.c.meanY(xb)
		if !oka || !okb {
			t.Fatalf("line %s: nothing drawn in column %d or %d", k.name, xa, xb)
		}
		if k.rising != (yb < ya-20) || k.rising == (yb > ya+20) {
			t.Errorf("line %s: row %.0f at column %d, row %.0f at column %d: want it %s", k.name, ya, xa, yb, xb,
				map[bool]string{true: "rising", false: "falling"}[k.rising])
		}
	}

	// A single point is drawn (a thin circle, so fainter than a line: any
	// bluish pixel counts), in the middle across (the x axis goes one unit
	// either side of it) and near the top (the y axis from 0 to 5 % above
	// it). No points at all: no file.
	img = plotImage(t, filepath.Join(dir, "one.png"), Line{"one", []Point{{Step: 5, V: 2}}})
	var n, sx, sy int
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, _, bl, _ := img.At(x, y).RGBA()
			if int(bl>>8)-int(r>>8) > 30 {
				n, sx, sy = n+1, sx+x, sy+y
			}
		}
	}
	if n < 4 {
		t.Fatalf("a single point: %d bluish pixels", n)
	}
	if cx, cy := float64(sx)/float64(n), float64(sy)/float64(n); math.Abs(cx-float64(b.Dx())/2) > 0.1*float64(b.Dx()) || cy > 0.15*float64(b.Dy()) {
		t.Errorf("a single point drawn around (%.0f, %.0f), want the middle across and the top of %dx%d", cx, cy, b.Dx(), b.Dy())
	}
	none := filepath.Join(dir, "none.png")
	if ok, err := PlotPNG(none, "x", "y", Line{"empty", nil}); ok || err != nil {
		t.Errorf("a plot without points: ok %v, err %v", ok, err)
	}
	if _, err := os.Stat(none); err == nil {
		t.Error("a plot without points was written")
	}
}

// A series far from 0 with a little noise (100 ± 1) is drawn as nearly
// flat: the y axis starts at 0, so the noise takes about 2 % of the
// plot's height, not all of it; a series that falls from 100 to 0 spans
// most of it.
func TestPlotScale(t *testing.T) {
	dir := t.TempDir()
	var noisy, falling []Point
	for s := int64(0); s < 40; s++ {
		noisy = append(noisy, Point{Step: s, V: 100 + float64(s%3-1)})
		falling = append(falling, Point{Step: s, V: 100 - 100*float64(s)/39})
	}
	img := plotImage(t, filepath.Join(dir, "noisy.png"), Line{"noisy", noisy})
	h := img.Bounds().Dy()
	c := curveOf(img, palette[0])
	if span := c.maxY() - c.minY(); c.n == 0 || span > h/20 {
		t.Errorf("100 ± 1 spans rows %d..%d of %d: the noise is blown up", c.minY(), c.maxY(), h)
	}
	c = curveOf(plotImage(t, filepath.Join(dir, "falling.png"), Line{"falling", falling}), palette[0])
	if span := c.maxY() - c.minY(); span < h/2 {
		t.Errorf("100 to 0 spans rows %d..%d of %d", c.minY(), c.maxY(), h)
	}
}

// A curve of a few points (evaluations) has each point marked with a
// dot, wider than the line; a curve of many points has none.
func TestPlotMarkers(t *testing.T) {
	dir := t.TempDir()
	flat := func(n int) []Point {
		var p []Point
		for i := 0; i < n; i++ {
			p = append(p, Point{Step: int64(i * 100 / (n - 1)), V: 10})
		}
		return p
	}
	// height of the color's pixels in column x (and the one beside it)
	height := func(c curve, x int) int {
		lo, hi := math.MaxInt, -1
		for _, col := range []int{x - 1, x, x + 1} {
			for _, y := range c.rows[col] {
				lo, hi = min(lo, y), max(hi, y)
			}
		}
		return hi - lo + 1
	}
	few := curveOf(plotImage(t, filepath.Join(dir, "few.png"), Line{"few", flat(3)}), palette[0])
	mid, between := (few.x0+few.x1)/2, (3*few.x0+few.x1)/4
	if hp, hl := height(few, mid), height(few, between); hp < 6 || hl > 4 {
		t.Errorf("3 points: %d px high at the middle point, %d px between points; want a dot (>= 6) and a line (<= 4)", hp, hl)
	}
	many := curveOf(plotImage(t, filepath.Join(dir, "many.png"), Line{"many", flat(101)}), palette[0])
	for _, x := range []int{many.x0 + 5, (many.x0 + many.x1) / 2, many.x1 - 5} {
		if h := height(many, x); h > 4 {
			t.Errorf("101 points: %d px high at column %d, want a plain line", h, x)
		}
	}
}

// plotImage draws lines with PlotPNG into file and decodes the PNG.
func plotImage(t *testing.T, file string, lines ...Line) image.Image {
	t.Helper()
	ok, err := PlotPNG(file, "title", "y", lines...)
	if err != nil || !ok {
		t.Fatalf("PlotPNG: %v %v", ok, err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return img
}

// curve is where a color was drawn: the rows of each column, the columns'
// range and the pixel count.
type curve struct {
	rows   map[int][]int
	x0, x1 int
	n      int
}

// curveOf finds the pixels of color c (within a small distance: the
// lines are anti-aliased).
func curveOf(img image.Image, c color.RGBA) curve {
	cv := curve{rows: map[int][]int{}, x0: math.MaxInt, x1: -1}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			d := absDiff(r>>8, c.R) + absDiff(g>>8, c.G) + absDiff(bl>>8, c.B)
			if d > 40 {
				continue
			}
			cv.rows[x] = append(cv.rows[x], y)
			cv.x0, cv.x1 = min(cv.x0, x), max(cv.x1, x)
			cv.n++
		}
	}
	return cv
}

func absDiff(a uint32, b uint8) int {
	d := int(a) - int(b)
	if d < 0 {
		return -d
	}
	return d
}

// meanY is the mean row of the curve in column x.
func (c curve) meanY(x int) (float64, bool) {
	rs := c.rows[x]
	if len(rs) == 0 {
		return math.NaN(), false
	}
	s := 0
	for _, y := range rs {
		s += y
	}
	return float64(s) / float64(len(rs)), true
}

func (c curve) minY() int {
	m := math.MaxInt
	for _, rs := range c.rows {
		for _, y := range rs {
			m = min(m, y)
		}
	}
	return m
}

func (c curve) maxY() int {
	m := -1
	for _, rs := range c.rows {
		for _, y := range rs {
			m = max(m, y)
		}
	}
	return m
}
