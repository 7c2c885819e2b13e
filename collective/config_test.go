package collective

import (
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank/ranktest"
)

// TestConfigAlgorithm: Config.Algorithm forces the algorithm of Auto
// calls (seen in the call each rank makes, so a rank with another value
// is a mismatch), and settings out of range are refused by New.
func TestConfigAlgorithm(t *testing.T) {
	c, err := New(ranktest.InMemory(1, 1)[0], Config{Algorithm: algo.Tree})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.Algorithm != algo.Tree || c.AlgorithmFor(algo.Auto, 4) != algo.Tree {
		t.Errorf("Algorithm Tree gave %v", c.cfg.Algorithm)
	}
	c.Close()
	if _, err := New(ranktest.InMemory(1, 1)[0], Config{SliceBytes: 8}); err == nil || !strings.Contains(err.Error(), "slice") {
		t.Errorf("SliceBytes 8: want an error naming the slice, got %v", err)
	}
	c, err = New(ranktest.InMemory(1, 1)[0], Config{Algorithm: algo.Direct})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.Algorithm != algo.Direct || c.AlgorithmFor(algo.Auto, algo.DirectLimit) != algo.Direct || c.AlgorithmFor(algo.Auto, algo.DirectLimit+1) == algo.Direct {
		t.Errorf("Algorithm Direct gave %v (%v at %d bytes, %v above)", c.cfg.Algorithm,
			c.AlgorithmFor(algo.Auto, algo.DirectLimit), algo.DirectLimit, c.AlgorithmFor(algo.Auto, algo.DirectLimit+1))
	}
	c.Close()
	c, err = New(ranktest.InMemory(1, 1)[0], Config{Algorithm: algo.HalvingDoubling})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.Algorithm != algo.HalvingDoubling || c.AlgorithmFor(algo.Auto, 4) != algo.HalvingDoubling || c.AlgorithmFor(algo.Auto, 64<<20) != algo.HalvingDoubling {
		t.Errorf("Algorithm HalvingDoubling gave %v", c.cfg.Algorithm)
	}
	c.Close()
	if _, err := New(ranktest.InMemory(1, 1)[0], Config{Model: algo.CostModel{RingGBs: 1, TreeGBs: 1, DirectMaxBytes: algo.DirectLimit + 1}}); err == nil ||
		!strings.Contains(err.Error(), "DirectMaxBytes") {
		t.Errorf("DirectMaxBytes above DirectLimit: want an error naming it, got %v", err)
	}
	// a rank with another Algorithm (GORUN_ALLREDUCE) than the others: a mismatch naming the algorithm
	ts := ranktest.InMemory(3, 2)
	for _, cfgs := range [][]Config{{{Algorithm: algo.Ring}, {Algorithm: algo.Tree}, {Algorithm: algo.Ring}},
		{{Algorithm: algo.Tree}, {Algorithm: algo.Direct}, {Algorithm: algo.Tree}},
		{{Algorithm: algo.HalvingDoubling}, {Algorithm: algo.HalvingDoubling}, {Algorithm: algo.Ring}}} {
		errs := timedCfgs(t, ts, cfgs, 10*time.Second, func(c *Communicator) error {
			return c.Allreduce(testCtx(t), nil, make([]byte, 400), dtype.Float32, Sum)
		})
		for r, err := range errs {
			if err == nil || !strings.Contains(err.Error(), "algorithm") {
				t.Errorf("%v: rank %d: want an algorithm mismatch, got %v", cfgs, r, err)
			}
		}
		ts = ranktest.InMemory(3, 2)
	}
}
