package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/atomicfile"
)

// Run records a training run's numbers to metrics.jsonl and TensorBoard
// event files in one directory.
type Run struct {
	mu     sync.Mutex
	jsonl  *os.File
	events *EventWriter
}

// OpenRun creates (or appends to) the run's files in dir: metrics.jsonl
// is appended to, and a new TensorBoard event file is started. To
// continue a run from a checkpoint, call RewindRun first.
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
	return &Run{jsonl: f, events: ew}, nil
}

// Log writes one record: a JSON line, a TensorBoard event with every value
// as a scalar named kind/name (when it has values) and every text as a
// text summary named kind/name. A value that is not finite (a diverged
// loss) is recorded, not an error: as a string in the JSON line (see
// Record), as a float in TensorBoard.
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
	if len(values) > 0 {
		if err := r.events.Scalars(step, now, tagged(kind, values)); err != nil {
			return err
		}
	}
	if len(text) > 0 {
		if err := r.events.Text(step, now, tagged(kind, text)); err != nil {
			return err
		}
	}
	return r.events.Flush()
}

// tagged names each entry kind/name, as TensorBoard's tags.
func tagged[V any](kind string, m map[string]V) map[string]V {
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[kind+"/"+k] = v
	}
	return out
}

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

// Rewind is what RewindRun did.
type Rewind struct {
	Dropped  int    // records of metrics.jsonl removed: after the step, or torn
	LastStep int64  // the last step of the removed records
	Aside    string // the copy of metrics.jsonl as it was ("" if nothing was removed)
	Events   int    // event files cut back
}

// RewindRun prepares the run directory dir for a run that continues from
// its checkpoint of step: the records of the steps after it (an attempt
// that was killed before its next checkpoint) go, so the files hold the
// run as it went, each step once, and the report counts the steps the
// run really made. metrics.jsonl is copied to
// metrics.jsonl.before-resume-STEP (.2, .3, ... if that exists) and then
// replaced by its records up to step (a torn line, from a writer killed
// mid-line, is removed too); each event file loses its events after step
// (CutEvents), and the next OpenRun starts a new one. Every file is
// replaced atomically: a crash leaves the old or the new version, and
// RewindRun can run again. A directory with nothing after step is left
// as it is.
func RewindRun(dir string, step int64) (Rewind, error) {
	var rw Rewind
	path := filepath.Join(dir, "metrics.jsonl")
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return rw, err
	}
	var keep []byte
	for rest := b; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i+1], rest[i+1:]
		} else {
			rest = nil // a last line without its newline: torn
		}
		body := bytes.TrimSpace(line)
		if len(body) == 0 {
			continue
		}
		var r Record
		if line[len(line)-1] != '\n' || json.Unmarshal(body, &r) != nil {
			rw.Dropped++
			continue
		}
		if r.Step > step {
			rw.Dropped++
			rw.LastStep = max(rw.LastStep, r.Step)
			continue
		}
		keep = append(keep, line...)
	}
	if rw.Dropped > 0 {
		aside := path + ".before-resume-" + strconv.FormatInt(step, 10)
		for n := 2; ; n++ {
			if _, err := os.Lstat(aside); errors.Is(err, fs.ErrNotExist) {
				break
			}
			aside = path + ".before-resume-" + strconv.FormatInt(step, 10) + "." + strconv.Itoa(n)
		}
		if err := atomicfile.WriteFile(aside, ".metrics.aside.tmp*", b); err != nil {
			return rw, err
		}
		rw.Aside = aside
		if err := atomicfile.WriteFile(path, ".metrics.jsonl.tmp*", keep); err != nil {
			return rw, err
		}
	}
	evs, err := filepath.Glob(filepath.Join(dir, "events.out.tfevents.*"))
	if err != nil {
		return rw, err
	}
	for _, f := range evs {
		if fi, err := os.Lstat(f); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		cut, err := CutEvents(f, step)
		if err != nil {
			return rw, err
		}
		if cut {
			rw.Events++
		}
	}
	return rw, nil
}
