package train

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/gorun/gorun/transformer"
)

// rowsOf lists the rows of batches without padding, each as a string.
func rowsOf(bs []*transformer.Batch) []string {
	var out []string
	for _, b := range bs {
		for i := 0; i < b.B; i++ {
			out = append(out, fmt.Sprint(slices.DeleteFunc(slices.Clone(b.Src[i*b.S:(i+1)*b.S]), func(x int32) bool { return x == 0 }),
				slices.DeleteFunc(slices.Clone(b.Tgt[i*b.T:(i+1)*b.T]), func(x int32) bool { return x == 0 })))
		}
	}
	slices.Sort(out)
	return out
}

// However many ranks take a step of however many batches (a run resumed
// on fewer or more ranks than it began with), the ranks together take
// exactly the step's batches of the one order, every row once, each rank
// at least one micro-batch and none over --batch-tokens.
func TestBatchSourceShares(t *testing.T) {
	o := optionsFor(t, "--preset", "tiny", "--synthetic-lines", "300", "--max-length", "24", "--batch-tokens", "256")
	const steps = 40
	source := func(r, size, perStep int) *batchSource {
		c, err := loadCorpus(context.Background(), o, r, size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		s := c.Train.(*batchSource)
		s.perStep = perStep
		return s
	}
	for _, perStep := range []int{1, 2, 3, 4} {
		for _, size := range []int{1, 2, 3, 5} {
			whole := source(0, 1, 1) // the order, a batch at a time
			if steps*perStep <= whole.b.StepsPerEpoch() {
				t.Fatalf("%d batches per epoch: the test does not reach an epoch's end", whole.b.StepsPerEpoch())
			}
			srcs := make([]*batchSource, size)
			for r := range srcs {
				srcs[r] = source(r, size, perStep)
			}
			for s := 0; s < steps; s++ {
				var want []*transformer.Batch
				for u := 0; u < perStep; u++ {
					bs, err := whole.Next()
					if err != nil {
						t.Fatal(err)
					}
					want = append(want, bs...)
				}
				var got []*transformer.Batch
				for r, src := range srcs {
					bs, err := src.Next()
					if err != nil {
						t.Fatal(err)
					}
					if len(bs) == 0 {
						t.Fatalf("%d batches a step on %d ranks: rank %d has no micro-batch", perStep, size, r)
					}
					for _, b := range bs {
						if b.B*max(b.S, b.T) > o.BatchTokens {
							t.Fatalf("%d batches a step on %d ranks: rank %d has a micro-batch of %dx(%d,%d) over %d tokens", perStep, size, r, b.B, b.S, b.T, o.BatchTokens)
						}
					}
					got = append(got, bs...)
				}
				if !slices.Equal(rowsOf(got), rowsOf(want)) {
					t.Fatalf("%d batches a step on %d ranks: step %d's rows differ from the order's", perStep, size, s)
				}
			}
		}
	}
}
