package metrics

import (
	"bufio"
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

// ReadJSONL reads metrics.jsonl; a malformed line is an error naming it.
func ReadJSONL(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var out []Record
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, line, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}
