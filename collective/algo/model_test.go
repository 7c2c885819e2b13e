package algo

import (
	"fmt"
	"math"
	"testing"
)

// TestModelChoice: Choose takes the algorithm Predict says is faster: with
// a cheap tree hop and a slow tree per byte, the tree for small calls and
// the ring for large ones, more so with more ranks; the ring at 2 ranks.
func TestModelChoice(t *testing.T) {
	m := CostModel{RingStepUs: 50, TreeHopUs: 50, RingGBs: 1, TreeGBs: 0.5}
	for _, k := range []struct {
		bytes, n int
		want     Algorithm
	}{{4 << 10, 8, Tree}, {64 << 20, 8, Ring}, {4 << 10, 2, Ring}, {1 << 10, 4, Tree}, {1 << 20, 4, Ring}} {
		if a := m.Choose(k.bytes, k.n); a != k.want {
			t.Errorf("%d bytes on %d ranks: %v (ring %.0f us, tree %.0f us)", k.bytes, k.n, a,
				m.Predict(Ring, k.bytes, k.n), m.Predict(Tree, k.bytes, k.n))
		}
	}
	// DirectMaxBytes: Direct up to it (from 2 ranks), the others above
	m.DirectMaxBytes = 8 << 10
	for _, k := range []struct {
		bytes, n int
		want     Algorithm
	}{{0, 2, Direct}, {8 << 10, 8, Direct}, {8<<10 + 1, 8, Tree}, {8<<10 + 1, 2, Ring}, {4 << 10, 1, Ring}} {
		if a := m.Choose(k.bytes, k.n); a != k.want {
			t.Errorf("DirectMaxBytes %d: %d bytes on %d ranks: %v, want %v", m.DirectMaxBytes, k.bytes, k.n, a, k.want)
		}
	}
	// DirectMaxSent: (N-1) * bytes at most
	m.DirectMaxSent = 21 << 10
	for _, k := range []struct {
		bytes, n int
		want     Algorithm
	}{{7 << 10, 4, Direct}, {7<<10 + 1, 4, Tree}, {8 << 10, 2, Direct}, {3 << 10, 8, Direct}, {4 << 10, 8, Tree}} {
		if a := m.Choose(k.bytes, k.n); a != k.want {
			t.Errorf("DirectMaxSent %d: %d bytes on %d ranks: %v, want %v", m.DirectMaxSent, k.bytes, k.n, a, k.want)
		}
	}
	if DefaultModel.RingGBs <= 0 || DefaultModel.TreeGBs <= 0 {
		t.Fatal("DefaultModel has no bandwidths")
	}
}

func TestParseHalvingDoubling(t *testing.T) {
	for _, s := range []string{"hd", "halving-doubling"} {
		if a, err := ParseAlgorithm(s); err != nil || a != HalvingDoubling {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", s, a, err)
		}
	}
	if a, err := ParseAlgorithm(HalvingDoubling.String()); err != nil || a != HalvingDoubling {
		t.Errorf("String does not parse back: %v, %v", a, err)
	}
}

// TestHalvingDoublingModel: the prediction is 2 log2(N) ring steps and
// the ring's bytes on powers of two; the fold adds 2 steps and 2 buffers.
func TestHalvingDoublingModel(t *testing.T) {
	m := CostModel{RingStepUs: 100, RingGBs: 1}
	for _, k := range []struct {
		n     int
		bytes int
		want  float64
	}{{2, 1000, 2*100 + 1}, {4, 4000, 4*100 + 6}, {8, 8000, 6*100 + 14}, {3, 1000, 4*100 + 1 + 2}, {6, 4000, 6*100 + 6 + 8}} {
		if got := m.Predict(HalvingDoubling, k.bytes, k.n); fmt.Sprintf("%.6f", got) != fmt.Sprintf("%.6f", k.want) {
			t.Errorf("N=%d %d bytes: %v us, want %v", k.n, k.bytes, got, k.want)
		}
	}
	if m.Predict(HalvingDoubling, 1<<20, 1) != 0 {
		t.Error("one rank costs nothing")
	}
	// Auto does not pick it (docs/collective.md has the measurements)
	for n := 1; n <= 16; n++ {
		for b := 0; b <= 256<<20; b = b*4 + 1024 {
			if a := DefaultModel.Choose(b, n); a == HalvingDoubling {
				t.Fatalf("Choose(%d bytes, %d ranks) = %v", b, n, a)
			}
		}
	}
}

// TestRecursiveDoublingChosen: the cost model picks it on two ranks only,
// above Direct's limit and up to DoublingMaxBytes; its prediction is
// log2(p) steps of the whole buffer, plus the fold, and DoublingLoad the
// same buffers.
func TestRecursiveDoublingChosen(t *testing.T) {
	m := DefaultModel
	for n := 1; n <= 16; n++ {
		for _, b := range []int{0, 1024, m.DirectMaxBytes, m.DirectMaxBytes + 4, 128 << 10, m.DoublingMaxBytes, m.DoublingMaxBytes + 4, 1 << 20, 64 << 20} {
			got := m.Choose(b, n)
			want := n == 2 && b > m.DirectMaxBytes && b <= m.DoublingMaxBytes
			if (got == RecursiveDoubling) != want {
				t.Errorf("Choose(%d bytes, %d ranks) = %v", b, n, got)
			}
		}
	}
	m.DoublingMaxBytes = 0
	if got := m.Choose(128<<10, 2); got != Ring {
		t.Errorf("DoublingMaxBytes 0: Choose(128 KiB, 2 ranks) = %v, want ring", got)
	}
	p := CostModel{RingStepUs: 100, RingGBs: 1}
	for _, k := range []struct {
		n, bytes int
		want     float64
	}{{2, 1000, 100 + 1}, {4, 4000, 2*100 + 8}, {8, 8000, 3*100 + 24}, {3, 1000, 3*100 + 3}, {6, 4000, 4*100 + 16}} {
		if got := p.Predict(RecursiveDoubling, k.bytes, k.n); math.Abs(got-k.want) > 1e-9 {
			t.Errorf("N=%d %d bytes: %v us, want %v", k.n, k.bytes, got, k.want)
		}
	}
	for n, want := range map[int]float64{1: 0, 2: 1, 3: 3, 4: 2, 6: 4, 8: 3, 16: 4} {
		if got := DoublingLoad(n); got != want {
			t.Errorf("DoublingLoad(%d) = %v, want %v", n, got, want)
		}
	}
	for _, s := range []string{"rd", "recursive-doubling", RecursiveDoubling.String()} {
		if a, err := ParseAlgorithm(s); err != nil || a != RecursiveDoubling {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", s, a, err)
		}
	}
}
