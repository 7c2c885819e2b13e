package fusion

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/rank/ranktest"
)

// spanNames reads a trace file and returns, per pid, the spans as
// "track/name" (the format itself is tested in package metrics).
func spanNames(t *testing.T, path string) map[int]map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Pid  int            `json:"pid"`
			Tid  int            `json:"tid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(b, &tr); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	tracks := map[[2]int]string{}
	for _, ev := range tr.TraceEvents {
		if ev.Ph == "M" && ev.Name == "thread_name" {
			tracks[[2]int{ev.Pid, ev.Tid}] = ev.Args["name"].(string)
		}
	}
	out := map[int]map[string]bool{}
	for _, ev := range tr.TraceEvents {
		if ev.Ph != "X" {
			continue
		}
		if out[ev.Pid] == nil {
			out[ev.Pid] = map[string]bool{}
		}
		out[ev.Pid][tracks[[2]int{ev.Pid, ev.Tid}]+"/"+ev.Name] = true
	}
	return out
}

// A two-rank step with a timeline per rank: every bucket's spans, for
// packed host gradients (pack, allreduce, unpack) and device gradients
// (copy out, allreduce, check, copy in), and the merged file.
func TestTimelineBucketerSpans(t *testing.T) {
	for _, tc := range []struct {
		mode  gradMode
		spans []string
	}{
		{modeAttach, []string{"fusion/pack b%d", "allreduce/allreduce b%d", "fusion/unpack b%d"}},
		{modeDevice, []string{"fusion/copy out b%d", "allreduce/allreduce b%d", "fusion/check b%d", "fusion/copy in b%d"}},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			ps := bkOddParams()
			ts := ranktest.InMemory(2, 1)
			defer ranktest.CloseAll(ts)
			paths := []string{filepath.Join(dir, "rank0.json"), filepath.Join(dir, "rank1.json")}
			nbs := make([]int, 2)
			errs := bkOnRanks(ts, func(r int, c *collective.Communicator) error {
				tl, err := metrics.CreateTimeline(paths[r], r)
				if err != nil {
					return err
				}
				b, err := NewBucketer(c, ps, BucketConfig{CapBytes: 4096, FirstCapBytes: 512, Timeline: tl})
				if err != nil {
					return err
				}
				nbs[r] = len(b.Buckets())
				if _, err := attachGrads(b, ps, make([]float32, bkTotalLen(ps)), tc.mode, uint64(r)); err != nil {
					return err
				}
				for i := len(ps) - 1; i >= 0; i-- {
					t0 := time.Now()
					b.MarkReady(i)
					tl.Span("backward", fmt.Sprintf("layer_%d", i), t0, time.Now())
				}
				if _, err := b.Wait(); err != nil {
					return err
				}
				return tl.Close()
			})
			bkNoErrs(t, errs)
			for r, p := range paths {
				spans := spanNames(t, p)[r]
				for k := 0; k < nbs[r]; k++ {
					for _, name := range tc.spans {
						if !spans[fmt.Sprintf(name, k)] {
							t.Fatalf("rank %d: no span %q in %v", r, fmt.Sprintf(name, k), spans)
						}
					}
				}
				if len(spans) != len(tc.spans)*nbs[r]+len(ps) {
					t.Fatalf("rank %d: %d spans, want %d: %v", r, len(spans), len(tc.spans)*nbs[r]+len(ps), spans)
				}
			}
			merged := filepath.Join(dir, "timeline.json")
			if err := metrics.MergeTimelineFiles(merged, paths...); err != nil {
				t.Fatal(err)
			}
			if all := spanNames(t, merged); len(all) != 2 || len(all[0]) != len(tc.spans)*nbs[0]+len(ps) {
				t.Fatalf("merged trace: %d pids, %d spans for rank 0", len(all), len(all[0]))
			}
		})
	}
}
