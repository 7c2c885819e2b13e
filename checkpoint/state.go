package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/gorun/gorun/transformer"
)

// State is the content of a checkpoint's state.json.
type State struct {
	Format int `json:"format"`
	Step   int `json:"step"`
	// Run names the run (the lineage of checkpoints, kept across resumes)
	// that wrote it; "" in checkpoints saved without a run name and in
	// those of versions before run names. Prune removes only checkpoints
	// of its run.
	Run       string             `json:"run,omitempty"`
	Config    transformer.Config `json:"config"`
	VocabHash string             `json:"vocab_hash"`
	// Optimizer is "lazyadam" or "adam"; OptimizerStep its update count
	// (bias correction).
	Optimizer     string  `json:"optimizer"`
	OptimizerStep int     `json:"optimizer_step"`
	Beta1         float64 `json:"beta1"`
	Beta2         float64 `json:"beta2"`
	Epsilon       float64 `json:"epsilon"`
	// Seed and DropoutStep restore the dropout masks of the steps to come.
	Seed        uint64 `json:"seed"`
	DropoutStep uint64 `json:"dropout_step"`
	// Trainer is an opaque map the training program fills (data position,
	// RNG, loss scale, ...).
	Trainer map[string]json.RawMessage `json:"trainer,omitempty"`
}

// ReadState reads ckpt/state.json and checks its ranges (CheckState).
func ReadState(ckpt string) (*State, error) {
	path := filepath.Join(ckpt, stateFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseState(path, b)
}

func parseState(path string, b []byte) (*State, error) {
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if st.Format != 1 {
		return nil, fmt.Errorf("%s: unknown checkpoint format %d", path, st.Format)
	}
	if err := CheckState(&st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &st, nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// CheckState refuses a state out of range, naming the field: a negative
// step, an optimizer step outside [0, step] (an update is applied at most
// once a step), an unknown optimizer or Adam hyperparameters outside
// their domain, and in the trainer's part a loss scale that is not
// positive and finite, or a data position that is negative or past the
// end of its epoch.
func CheckState(st *State) error {
	if st.Step < 0 {
		return fmt.Errorf("step %d is negative", st.Step)
	}
	if st.OptimizerStep < 0 || st.OptimizerStep > st.Step {
		return fmt.Errorf("optimizer_step %d is outside [0, step %d]", st.OptimizerStep, st.Step)
	}
	switch st.Optimizer {
	case "":
		if st.OptimizerStep != 0 {
			return fmt.Errorf("optimizer_step %d without an optimizer", st.OptimizerStep)
		}
	case "adam", "lazyadam":
		if !(st.Beta1 >= 0 && st.Beta1 < 1) {
			return fmt.Errorf("beta1 %v is outside [0, 1)", st.Beta1)
		}
		if !(st.Beta2 >= 0 && st.Beta2 < 1) {
			return fmt.Errorf("beta2 %v is outside [0, 1)", st.Beta2)
		}
		if !(st.Epsilon > 0 && finite(st.Epsilon)) {
			return fmt.Errorf("epsilon %v is not positive and finite", st.Epsilon)
		}
	default:
		return fmt.Errorf("optimizer %q is unknown (adam, lazyadam)", st.Optimizer)
	}
	if raw, ok := st.Trainer["loss_scaler"]; ok && string(raw) != "null" {
		var sc struct {
			Scale, Min, Max, Factor *float64
			Window, Clean           *int
		}
		if err := json.Unmarshal(raw, &sc); err != nil {
			return fmt.Errorf("trainer.loss_scaler: %w", err)
		}
		if sc.Scale != nil && !(*sc.Scale > 0 && finite(*sc.Scale)) {
			return fmt.Errorf("trainer.loss_scaler.Scale %v is not positive and finite", *sc.Scale)
		}
		if sc.Min != nil && !(*sc.Min > 0 && finite(*sc.Min)) {
			return fmt.Errorf("trainer.loss_scaler.Min %v is not positive and finite", *sc.Min)
		}
		if sc.Max != nil && !(finite(*sc.Max) && (sc.Min == nil || *sc.Max >= *sc.Min)) {
			return fmt.Errorf("trainer.loss_scaler.Max %v is not finite and at least Min", *sc.Max)
		}
		if sc.Factor != nil && !(*sc.Factor > 1 && finite(*sc.Factor)) {
			return fmt.Errorf("trainer.loss_scaler.Factor %v is not finite and above 1", *sc.Factor)
		}
		if sc.Window != nil && *sc.Window < 1 {
			return fmt.Errorf("trainer.loss_scaler.Window %d is below 1", *sc.Window)
		}
		if sc.Clean != nil && *sc.Clean < 0 {
			return fmt.Errorf("trainer.loss_scaler.Clean %d is negative", *sc.Clean)
		}
	}
	if raw, ok := st.Trainer["data"]; ok && len(bytes.TrimSpace(raw)) > 0 && bytes.TrimSpace(raw)[0] == '{' {
		var p struct {
			Epoch, Index, Size, Tokens, PerStep, Lines, Steps *int64
		}
		p2 := map[string]json.RawMessage{}
		if err := json.Unmarshal(raw, &p2); err != nil {
			return fmt.Errorf("trainer.data: %w", err)
		}
		for k, dst := range map[string]**int64{"epoch": &p.Epoch, "index": &p.Index, "size": &p.Size, "batch_tokens": &p.Tokens, "batches_per_step": &p.PerStep, "lines": &p.Lines, "steps_per_epoch": &p.Steps} {
			if v, ok := p2[k]; ok {
				var n int64
				if err := json.Unmarshal(v, &n); err != nil {
					return fmt.Errorf("trainer.data.%s: %w", k, err)
				}
				if n < 0 {
					return fmt.Errorf("trainer.data.%s %d is negative", k, n)
				}
				*dst = &n
			}
		}
		if p.Size != nil && *p.Size < 1 {
			return fmt.Errorf("trainer.data.size %d is below 1", *p.Size)
		}
		if p.Index != nil && p.Steps != nil && *p.Index > *p.Steps {
			return fmt.Errorf("trainer.data.index %d is past steps_per_epoch %d", *p.Index, *p.Steps)
		}
	}
	return nil
}
