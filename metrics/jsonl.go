package metrics

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
)

// Record is one line of metrics.jsonl: the step, the wall time, what kind
// of line it is, and every number logged with it (NaN and ±Inf are written
// as the strings "NaN", "Inf", "-Inf"). The trainer's kinds: "start" (a
// segment of the run starts after the step: 0 fresh, else the checkpoint
// resumed from), "train" (a log interval ending at the step), "eval",
// "stop" (stopped by a signal) and "restart" (gorun --max-restarts).
type Record struct {
	Step   int64              `json:"step"`
	Time   float64            `json:"time"` // unix seconds
	Kind   string             `json:"kind"`
	Values map[string]float64 `json:"values"`
	Text   map[string]string  `json:"text,omitempty"`
}

// JSON has no NaN or infinity: a value that is not finite is written as
// the string "NaN", "Inf" or "-Inf" and read back as that float64.

// jsonFloat is a float64 that writes NaN and ±Inf as strings.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	switch {
	case math.IsNaN(v):
		return []byte(`"NaN"`), nil
	case math.IsInf(v, 1):
		return []byte(`"Inf"`), nil
	case math.IsInf(v, -1):
		return []byte(`"-Inf"`), nil
	}
	return json.Marshal(v)
}

func (f *jsonFloat) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `"NaN"`:
		*f = jsonFloat(math.NaN())
	case `"Inf"`, `"+Inf"`:
		*f = jsonFloat(math.Inf(1))
	case `"-Inf"`:
		*f = jsonFloat(math.Inf(-1))
	case "null": // not written; read as NaN
		*f = jsonFloat(math.NaN())
	default:
		var v float64
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		*f = jsonFloat(v)
	}
	return nil
}

// recordJSON is Record as written.
type recordJSON struct {
	Step   int64                `json:"step"`
	Time   float64              `json:"time"`
	Kind   string               `json:"kind"`
	Values map[string]jsonFloat `json:"values"`
	Text   map[string]string    `json:"text,omitempty"`
}

// MarshalJSON writes r with its non-finite values as strings.
func (r Record) MarshalJSON() ([]byte, error) {
	j := recordJSON{Step: r.Step, Time: r.Time, Kind: r.Kind, Text: r.Text}
	if r.Values != nil {
		j.Values = make(map[string]jsonFloat, len(r.Values))
		for k, v := range r.Values {
			j.Values[k] = jsonFloat(v)
		}
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Record) UnmarshalJSON(b []byte) error {
	var j recordJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*r = Record{Step: j.Step, Time: j.Time, Kind: j.Kind, Text: j.Text}
	if j.Values != nil {
		r.Values = make(map[string]float64, len(j.Values))
		for k, v := range j.Values {
			r.Values[k] = float64(v)
		}
	}
	return nil
}

// ReadJSONL reads metrics.jsonl; a malformed line is an error naming it
// (file:line), except a last line cut short, which is left out (see
// ReadJSONLTorn).
func ReadJSONL(path string) ([]Record, error) {
	recs, _, err := ReadJSONLTorn(path)
	return recs, err
}

// ReadJSONLTorn reads metrics.jsonl as ReadJSONL does and returns the
// number of the line it left out, 0 if none: the last line, when it is
// not a whole record and no newline follows it (its writer was killed
// mid-line: Run.Log writes a record and its newline at once, and
// RewindRun drops such a line on --resume). A malformed line anywhere
// else, or a last one that ends with its newline, is an error naming
// file:line.
func ReadJSONLTorn(path string) ([]Record, int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	var out []Record
	for line, rest := 1, b; len(rest) > 0; line++ {
		l := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			l, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		body := bytes.TrimSpace(l)
		if len(body) == 0 {
			continue
		}
		var r Record
		if err := json.Unmarshal(body, &r); err != nil {
			if rest == nil { // the last line, and no newline after it: torn
				return out, line, nil
			}
			return nil, 0, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		out = append(out, r)
	}
	return out, 0, nil
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}
