package collective

import (
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/rank"
)

// TestEnvOverrides: GORUN_ALLREDUCE forces the algorithm of Auto calls
// (seen in the call each rank makes, so a rank with another value is a
// mismatch), and malformed variables are refused by New with their name.
func TestEnvOverrides(t *testing.T) {
	t.Setenv(EnvAlgorithm, "tree")
	c, err := New(rank.NewLocalGroup(1, 1)[0], Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.Algorithm != Tree {
		t.Errorf("GORUN_ALLREDUCE=tree gave %v", c.cfg.Algorithm)
	}
	c.Close()
	for _, kv := range [][2]string{{EnvAlgorithm, "butterfly"}, {EnvSliceBytes, "12x"}, {EnvSliceBytes, "8"}, {EnvRings, "0"}} {
		t.Run(kv[0]+"="+kv[1], func(t *testing.T) {
			t.Setenv(EnvAlgorithm, "")
			t.Setenv(kv[0], kv[1])
			_, err := New(rank.NewLocalGroup(1, 1)[0], Config{})
			if err == nil || !strings.Contains(err.Error(), kv[0]) && !strings.Contains(err.Error(), "slice") {
				t.Errorf("want an error naming %s, got %v", kv[0], err)
			}
		})
	}
	t.Setenv(EnvAlgorithm, "direct")
	c, err = New(rank.NewLocalGroup(1, 1)[0], Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.Algorithm != Direct || c.AlgorithmFor(Auto, DirectLimit) != Direct || c.AlgorithmFor(Auto, DirectLimit+1) == Direct {
		t.Errorf("GORUN_ALLREDUCE=direct gave %v (%v at %d bytes, %v above)", c.cfg.Algorithm,
			c.AlgorithmFor(Auto, DirectLimit), DirectLimit, c.AlgorithmFor(Auto, DirectLimit+1))
	}
	c.Close()
	for _, name := range []string{"hd", "halving-doubling"} {
		t.Setenv(EnvAlgorithm, name)
		c, err = New(rank.NewLocalGroup(1, 1)[0], Config{})
		if err != nil {
			t.Fatal(err)
		}
		if c.cfg.Algorithm != HalvingDoubling || c.AlgorithmFor(Auto, 4) != HalvingDoubling || c.AlgorithmFor(Auto, 64<<20) != HalvingDoubling {
			t.Errorf("GORUN_ALLREDUCE=%s gave %v", name, c.cfg.Algorithm)
		}
		c.Close()
	}
	t.Setenv(EnvAlgorithm, "")
	if _, err := New(rank.NewLocalGroup(1, 1)[0], Config{Model: CostModel{RingGBs: 1, TreeGBs: 1, DirectMaxBytes: DirectLimit + 1}}); err == nil ||
		!strings.Contains(err.Error(), "DirectMaxBytes") {
		t.Errorf("DirectMaxBytes above DirectLimit: want an error naming it, got %v", err)
	}
	// a rank with another GORUN_ALLREDUCE than the others: a mismatch naming the algorithm
	ts := rank.NewLocalGroup(3, 2)
	for _, cfgs := range [][]Config{{{Algorithm: Ring}, {Algorithm: Tree}, {Algorithm: Ring}},
		{{Algorithm: Tree}, {Algorithm: Direct}, {Algorithm: Tree}},
		{{Algorithm: HalvingDoubling}, {Algorithm: HalvingDoubling}, {Algorithm: Ring}}} {
		errs := timedCfgs(t, ts, cfgs, 10*time.Second, func(c *Communicator) error {
			return c.Allreduce(testCtx(t), nil, make([]byte, 400), Float32, Sum)
		})
		for r, err := range errs {
			if err == nil || !strings.Contains(err.Error(), "algorithm") {
				t.Errorf("%v: rank %d: want an algorithm mismatch, got %v", cfgs, r, err)
			}
		}
		ts = rank.NewLocalGroup(3, 2)
	}
}
