package metrics

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"
)

// Timeline writes Chrome trace events (the JSON object format:
// {"traceEvents":[...]}) that Perfetto (https://ui.perfetto.dev) and
// chrome://tracing open. One Timeline belongs to one rank: its events have
// pid = rank, and each track (a name such as "backward" or "allreduce")
// becomes a thread of that process, named by a thread_name metadata event.
// Spans are "X" (complete) events whose ts and dur are microseconds; ts is
// wall-clock time since the Unix epoch, so the files of several ranks line
// up when merged (ranks on different hosts are only as aligned as their
// clocks).
//
// Events are written as they are recorded, one per line, through a buffer
// that is flushed by the first event more than a second after the last
// flush (and by Flush); Close writes the closing "]}" and flushes. A file whose program stopped
// before Close lacks the closing brackets (and perhaps half a line):
// MergeTimelineFiles reads such a file up to its last complete event.
//
// A nil *Timeline records nothing, so callers need not check. All methods
// are safe for concurrent use.
type Timeline struct {
	mu     sync.Mutex
	w      *bufio.Writer
	c      io.Closer // the file, when the Timeline opened it
	pid    int
	tids   map[string]int
	n      int       // events written
	last   time.Time // last flush
	err    error
	closed bool
}

// NewTimeline starts a trace for rank on w. Close it to finish the JSON.
func NewTimeline(w io.Writer, rank int) *Timeline {
	t := &Timeline{w: bufio.NewWriterSize(w, 64<<10), pid: rank, tids: map[string]int{}, last: time.Now()}
	_, t.err = t.w.WriteString("{\"traceEvents\":[\n")
	t.event(map[string]any{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
		"args": map[string]any{"name": "rank " + strconv.Itoa(rank)}})
	t.event(map[string]any{"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
		"args": map[string]any{"sort_index": rank}})
	return t
}

// CreateTimeline creates (or truncates) the file path and starts a trace
// for rank in it.
func CreateTimeline(path string, rank int) (*Timeline, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	t := NewTimeline(f, rank)
	t.c = f
	return t, nil
}

// event writes one event; t.mu is held (or t is not shared yet).
func (t *Timeline) event(ev map[string]any) {
	if t.err != nil || t.closed {
		return
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.err = err
		return
	}
	if t.n > 0 {
		t.w.WriteString(",\n")
	}
	_, t.err = t.w.Write(b)
	t.n++
	if now := time.Now(); now.Sub(t.last) > time.Second && t.err == nil {
		t.err = t.w.Flush()
		t.last = now
	}
}

// tid returns the thread id of track, announcing it on first use.
func (t *Timeline) tid(track string) int {
	id, ok := t.tids[track]
	if !ok {
		id = len(t.tids) + 1
		t.tids[track] = id
		t.event(map[string]any{"ph": "M", "name": "thread_name", "pid": t.pid, "tid": id,
			"args": map[string]any{"name": track}})
		t.event(map[string]any{"ph": "M", "name": "thread_sort_index", "pid": t.pid, "tid": id,
			"args": map[string]any{"sort_index": id}})
	}
	return id
}

// micros is t as microseconds since the Unix epoch, rounded to nanoseconds.
func micros(t time.Time) json.Number {
	ns := t.UnixNano()
	return json.Number(strconv.FormatInt(ns/1000, 10) + "." + fmt.Sprintf("%03d", ns%1000))
}

// Span records a complete event name on track from start to end.
func (t *Timeline) Span(track, name string, start, end time.Time) {
	t.SpanArgs(track, name, start, end, nil)
}

// SpanArgs is Span with arguments shown when the event is selected.
func (t *Timeline) SpanArgs(track, name string, start, end time.Time, args map[string]any) {
	if t == nil {
		return
	}
	if end.Before(start) {
		end = start
	}
	d := end.Sub(start).Nanoseconds()
	t.mu.Lock()
	defer t.mu.Unlock()
	ev := map[string]any{"ph": "X", "name": name, "pid": t.pid, "tid": t.tid(track),
		"ts": micros(start), "dur": json.Number(strconv.FormatInt(d/1000, 10) + "." + fmt.Sprintf("%03d", d%1000))}
	if len(args) > 0 {
		ev["args"] = args
	}
	t.event(ev)
}

// Begin starts a span on track now; calling the returned function ends it.
func (t *Timeline) Begin(track, name string) func() {
	if t == nil {
		return func() {}
	}
	start := time.Now()
	return func() { t.Span(track, name, start, time.Now()) }
}

// LayerHook adapts the timeline to a model's per-layer trace hook
// (transformer.Model.Trace): phase ("forward", "backward") is the track and
// layer the span's name. A nil Timeline gives a nil hook (no tracing cost).
func (t *Timeline) LayerHook() func(layer, phase string, start, end time.Time) {
	if t == nil {
		return nil
	}
	return func(layer, phase string, start, end time.Time) { t.Span(phase, layer, start, end) }
}

// Flush writes buffered events to the underlying writer (the JSON stays
// open: more events may follow).
func (t *Timeline) Flush() error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err == nil && !t.closed {
		t.err = t.w.Flush()
	}
	return t.err
}

// Close ends the JSON document, flushes it, and closes the file if
// CreateTimeline opened it. Spans recorded after Close are dropped.
func (t *Timeline) Close() error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return t.err
	}
	if t.err == nil {
		_, t.err = t.w.WriteString("\n]}\n")
	}
	if t.err == nil {
		t.err = t.w.Flush()
	}
	t.closed = true
	if t.c != nil {
		if err := t.c.Close(); t.err == nil {
			t.err = err
		}
	}
	if t.err != nil {
		t.err = fmt.Errorf("timeline: %w", t.err)
	}
	return t.err
}

// TraceEvent is one Chrome trace event as ReadTimeline reads it.
type TraceEvent struct {
	Name string          `json:"name"`
	Ph   string          `json:"ph"`
	Pid  int             `json:"pid"`
	Tid  int             `json:"tid"`
	Ts   float64         `json:"ts,omitempty"`
	Dur  float64         `json:"dur,omitempty"`
	Args json.RawMessage `json:"args,omitempty"`
}

// ReadTimeline reads the events of one trace ({"traceEvents":[...]} or a
// bare [...] array). A trace cut short (a program that stopped before
// Close) yields the events before the cut and truncated = true.
func ReadTimeline(r io.Reader) (evs []TraceEvent, truncated bool, err error) {
	dec := json.NewDecoder(r)
	tok, err := dec.Token()
	if err != nil {
		if isEOF(err) { // empty: stopped before anything was flushed
			return nil, true, nil
		}
		return nil, false, fmt.Errorf("not a trace: %w", err)
	}
	if tok == json.Delim('{') {
		found := false
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, isEOF(err), eofNil(err)
			}
			if k == "traceEvents" {
				found = true
				break
			}
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, isEOF(err), eofNil(err)
			}
		}
		if !found {
			if _, err := dec.Token(); isEOF(err) {
				return nil, true, nil
			}
			return nil, false, errors.New("not a trace: no traceEvents")
		}
		if tok, err = dec.Token(); err != nil {
			return nil, isEOF(err), eofNil(err)
		}
	}
	if tok != json.Delim('[') {
		return nil, false, errors.New("not a trace: traceEvents is not an array")
	}
	for dec.More() {
		var ev TraceEvent
		if err := dec.Decode(&ev); err != nil {
			if isEOF(err) {
				return evs, true, nil
			}
			return evs, false, err
		}
		evs = append(evs, ev)
	}
	if _, err := dec.Token(); err != nil { // the closing ]
		if isEOF(err) {
			return evs, true, nil
		}
		return evs, false, err
	}
	return evs, false, nil
}

func isEOF(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var se *json.SyntaxError
	// a cut inside a token: "unexpected end of JSON input"
	return errors.As(err, &se) && se.Error() == "unexpected end of JSON input"
}

func eofNil(err error) error {
	if isEOF(err) {
		return nil
	}
	return err
}

// merge writes one trace holding the events of all the inputs (each rank's
// file, named in names; their pids are their ranks), metadata first, spans
// by time. Inputs cut short are merged up to their last complete event.
func merge(out io.Writer, names []string, in []io.Reader) error {
	var meta, spans []TraceEvent
	for i, r := range in {
		evs, _, err := ReadTimeline(r)
		if err != nil {
			return fmt.Errorf("timeline %s: %w", names[i], err)
		}
		for _, ev := range evs {
			if ev.Ph == "M" {
				meta = append(meta, ev)
			} else {
				spans = append(spans, ev)
			}
		}
	}
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].Ts < spans[j].Ts })
	w := bufio.NewWriter(out)
	w.WriteString("{\"traceEvents\":[\n")
	for i, ev := range append(meta, spans...) {
		if i > 0 {
			w.WriteString(",\n")
		}
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		w.Write(b)
	}
	w.WriteString("\n],\"displayTimeUnit\":\"ms\"}\n")
	return w.Flush()
}

// MergeTimelineFiles writes one trace into the file out holding the events
// of all the trace files inputs (each rank's file; their pids are their
// ranks), metadata first, spans by time; inputs cut short are merged up to
// their last complete event. Errors name the file.
func MergeTimelineFiles(out string, inputs ...string) error {
	var rs []io.Reader
	for _, p := range inputs {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("timeline: %w", err)
		}
		defer f.Close()
		rs = append(rs, f)
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("timeline: %w", err)
	}
	if err := merge(f, inputs, rs); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("timeline: %w", err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("timeline: %w", err)
	}
	return nil
}
