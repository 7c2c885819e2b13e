package metrics

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Run records a training run's numbers to metrics.jsonl and TensorBoard
// event files in one directory, and keeps the series for plotting.
type Run struct {
	mu     sync.Mutex
	dir    string
	jsonl  *os.File
	events *EventWriter
	Series map[string][]Point
}

// Point is one sample of a series.
type Point struct {
	Step int64
	Time float64
	V    float64
}

// OpenRun creates (or appends to) the run's files in dir.
func OpenRun(dir string) (*Run, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "metrics.jsonl"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	ew, err := NewEventWriter(dir)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Run{dir: dir, jsonl: f, events: ew, Series: map[string][]Point{}}, nil
}

// Log writes one record: a JSON line, a TensorBoard event with every value
// as a scalar named kind/name, and a point on each series.
func (r *Run) Log(kind string, step int64, values map[string]float64, text map[string]string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	rec := Record{Step: step, Time: float64(now.UnixNano()) / 1e9, Kind: kind, Values: values, Text: text}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := r.jsonl.Write(append(b, '\n')); err != nil {
		return err
	}
	tb := make(map[string]float64, len(values))
	for k, v := range values {
		tb[kind+"/"+k] = v
		r.Series[kind+"/"+k] = append(r.Series[kind+"/"+k], Point{Step: step, Time: rec.Time, V: v})
	}
	if err := r.events.Scalars(step, now, tb); err != nil {
		return err
	}
	return r.events.Flush()
}

// Dir is the run directory.
func (r *Run) Dir() string { return r.dir }

// Close closes the files.
func (r *Run) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err1 := r.events.Close()
	err2 := r.jsonl.Close()
	if err1 != nil {
		return err1
	}
	return err2
}
