package metrics

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// HParams records the run's settings (run.json's fields, nested ones as
// "dataset.name", lists joined with commas) for TensorBoard's HParams
// dashboard, in the run's event file.
func (r *Run) HParams(ri RunInfo) error {
	b, err := json.Marshal(ri)
	if err != nil {
		return err
	}
	var tree map[string]any
	if err := json.Unmarshal(b, &tree); err != nil {
		return err
	}
	flat := map[string]any{}
	flatten("", tree, flat)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.events.HParams(time.Now(), flat); err != nil {
		return err
	}
	return r.events.Flush()
}

// flatten turns decoded JSON into hparams: numbers, strings and bools as
// they are, objects by dotted names, lists as one comma-separated string.
func flatten(prefix string, v any, into map[string]any) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if prefix != "" {
				k = prefix + "." + k
			}
			flatten(k, e, into)
		}
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = fmt.Sprint(e)
		}
		into[prefix] = strings.Join(parts, ",")
	case nil:
	default: // float64, string, bool
		into[prefix] = x
	}
}
