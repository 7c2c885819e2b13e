package metrics

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
)

// Record is one line of metrics.jsonl: the step, the wall time, what kind
// of line it is ("train", "eval", "run"), and every number logged with it.
type Record struct {
	Step   int64              `json:"step"`
	Time   float64            `json:"time"` // unix seconds
	Kind   string             `json:"kind"`
	Values map[string]float64 `json:"values"`
	Text   map[string]string  `json:"text,omitempty"`
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
