package metrics

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type chromeTrace struct {
	TraceEvents []struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Pid  *int           `json:"pid"`
		Tid  *int           `json:"tid"`
		Ts   *float64       `json:"ts"`
		Dur  *float64       `json:"dur"`
		Args map[string]any `json:"args"`
	} `json:"traceEvents"`
}

// parseTrace checks that b is a Chrome trace and returns, per pid, the
// spans as "track/name" with their times.
func parseTrace(t *testing.T, b []byte) map[int]map[string][2]float64 {
	t.Helper()
	if !json.Valid(b) {
		t.Fatalf("not valid JSON:\n%s", b)
	}
	var tr chromeTrace
	if err := json.Unmarshal(b, &tr); err != nil {
		t.Fatal(err)
	}
	tracks := map[[2]int]string{}
	for _, ev := range tr.TraceEvents {
		if ev.Pid == nil || ev.Tid == nil {
			t.Fatalf("event without pid/tid: %+v", ev)
		}
		if ev.Ph == "M" && ev.Name == "thread_name" {
			tracks[[2]int{*ev.Pid, *ev.Tid}] = ev.Args["name"].(string)
		}
	}
	out := map[int]map[string][2]float64{}
	for _, ev := range tr.TraceEvents {
		switch ev.Ph {
		case "M":
			continue
		case "X":
		default:
			t.Fatalf("unexpected phase %q", ev.Ph)
		}
		if ev.Ts == nil || ev.Dur == nil || *ev.Dur < 0 {
			t.Fatalf("span without ts/dur: %+v", ev)
		}
		tr, ok := tracks[[2]int{*ev.Pid, *ev.Tid}]
		if !ok {
			t.Fatalf("span %q on pid %d tid %d, which has no thread_name", ev.Name, *ev.Pid, *ev.Tid)
		}
		if out[*ev.Pid] == nil {
			out[*ev.Pid] = map[string][2]float64{}
		}
		out[*ev.Pid][tr+"/"+ev.Name] = [2]float64{*ev.Ts, *ev.Dur}
	}
	return out
}

func TestTimelineSpans(t *testing.T) {
	var buf bytes.Buffer
	tl := NewTimeline(&buf, 3)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	tl.Span("forward", "encoder/layer_0", t0, t0.Add(1500*time.Microsecond))
	tl.LayerHook()("decoder/layer_1", "backward", t0.Add(2*time.Millisecond), t0.Add(3*time.Millisecond))
	end := tl.Begin("optimizer", "adam")
	end()
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	tl.Span("late", "dropped", t0, t0) // after Close: ignored
	spans := parseTrace(t, buf.Bytes())
	got := spans[3]
	want0 := float64(t0.UnixNano()) / 1e3
	if s := got["forward/encoder/layer_0"]; s[0] != want0 || s[1] != 1500 {
		t.Fatalf("forward span = %v, want ts %v dur 1500 (µs)", s, want0)
	}
	if s := got["backward/decoder/layer_1"]; s[1] != 1000 {
		t.Fatalf("backward span = %v", s)
	}
	if _, ok := got["optimizer/adam"]; !ok || len(got) != 3 {
		t.Fatalf("spans %v", got)
	}
	var nilTL *Timeline
	nilTL.Span("x", "y", t0, t0)
	nilTL.Begin("x", "y")()
	if nilTL.LayerHook() != nil {
		t.Fatal("a nil timeline's layer hook is not nil")
	}
	if nilTL.Close() != nil {
		t.Fatal("nil timeline")
	}
}

// Two ranks' timelines, written concurrently from several goroutines,
// merged into one file; a file cut short still merges. (The Bucketer's own
// spans are checked in package fusion.)
func TestTimelineMerge(t *testing.T) {
	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "rank0.json"), filepath.Join(dir, "rank1.json")}
	const nspans = 12
	for r, p := range paths {
		tl, err := CreateTimeline(p, r)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		for g := 0; g < 3; g++ {
			go func() {
				defer func() { done <- struct{}{} }()
				for i := g; i < nspans; i += 3 {
					t0 := time.Now()
					tl.SpanArgs(fmt.Sprintf("track%d", i%2), fmt.Sprintf("span %d", i), t0, t0.Add(time.Duration(i+1)*time.Microsecond), map[string]any{"i": i})
				}
			}()
		}
		for g := 0; g < 3; g++ {
			<-done
		}
		if err := tl.Close(); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if spans := parseTrace(t, data)[r]; len(spans) != nspans {
			t.Fatalf("rank %d: %d spans, want %d: %v", r, len(spans), nspans, spans)
		}
	}
	merged := filepath.Join(dir, "timeline.json")
	if err := MergeTimelineFiles(merged, paths...); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(merged)
	all := parseTrace(t, data)
	if len(all) != 2 || len(all[0]) != nspans || len(all[1]) != len(all[0]) {
		t.Fatalf("merged trace has pids %d with %d and %d spans", len(all), len(all[0]), len(all[1]))
	}

	// A program that stopped mid-run: no closing brackets, half an event.
	whole, _ := os.ReadFile(paths[1])
	cut := whole[:bytes.LastIndex(whole, []byte(`"ph":"X"`))+5]
	evs, truncated, err := ReadTimeline(bytes.NewReader(cut))
	if err != nil || !truncated || len(evs) == 0 {
		t.Fatalf("cut trace: %d events, truncated %v, %v", len(evs), truncated, err)
	}
	if err := os.WriteFile(paths[1], cut, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := MergeTimelineFiles(merged, paths...); err != nil {
		t.Fatal(err)
	}
	data, _ = os.ReadFile(merged)
	all = parseTrace(t, data)
	if n := len(all[1]); n != nspans-1 {
		t.Fatalf("rank 1's cut file gave %d spans, want all but the cut one (%d)", n, nspans-1)
	}
	// Cut before or inside the header: no events, not an error.
	for _, c := range []string{"", `{"trace`, `{"traceEvents"`, `{"traceEvents":[`} {
		evs, truncated, err := ReadTimeline(strings.NewReader(c))
		if err != nil || !truncated || len(evs) != 0 {
			t.Fatalf("trace cut to %q: %d events, truncated %v, %v", c, len(evs), truncated, err)
		}
	}
	// Not a trace: an error naming the file.
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"foo": 1}`), 0o644)
	if err := MergeTimelineFiles(merged, paths[0], bad); err == nil || !strings.Contains(err.Error(), "bad.json") {
		t.Fatalf("merging a non-trace: %v", err)
	}
}
