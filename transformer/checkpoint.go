package transformer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// State is the content of a checkpoint's state.json.
type State struct {
	Format    int    `json:"format"`
	Step      int    `json:"step"`
	Config    Config `json:"config"`
	VocabHash string `json:"vocab_hash"`
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

const (
	modelFile  = "model.safetensors"
	optimFile  = "optimizer.safetensors"
	stateFile  = "state.json"
	latestFile = "latest"
)

// CheckpointDir is the directory name of the checkpoint of a step.
func CheckpointDir(step int) string { return fmt.Sprintf("ckpt-%d", step) }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// writeFileAtomic writes data to path through a temporary file, fsync and
// rename, then fsyncs the directory.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return syncDir(dir)
}

// SaveCheckpoint writes dir/ckpt-STEP/ (model.safetensors with the weights
// under their parameter names, optimizer.safetensors with "m/NAME" and
// "v/NAME", state.json) into a temporary directory, renames it into place,
// and then points dir/latest at it (atomically: temp file, fsync, rename,
// fsync of dir). A crash at any point leaves latest naming a complete
// checkpoint. It returns the checkpoint's path.
func SaveCheckpoint(dir string, step int, m *Model, opt *Adam, vocabHash string, trainer map[string]json.RawMessage) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	name := CheckpointDir(step)
	final := filepath.Join(dir, name)
	tmp, err := os.MkdirTemp(dir, "."+name+".tmp")
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("checkpoint %s: %w", final, err)
	}
	be := m.be
	host := make([]float32, m.NumParams())
	be.Download(host, m.Weights)
	var ts []STensor
	for _, p := range m.Params {
		ts = append(ts, STensor{Name: p.Name, Shape: p.Shape, Data: host[p.Offset : p.Offset+p.Len]})
	}
	meta := map[string]string{"format": "gorun-transformer", "preset": m.Cfg.Preset, "step": strconv.Itoa(step), "vocab_hash": vocabHash}
	if err := WriteSafetensors(filepath.Join(tmp, modelFile), ts, meta); err != nil {
		return fail(err)
	}
	st := State{Format: 1, Step: step, Config: m.Cfg, VocabHash: vocabHash, Seed: m.Seed, DropoutStep: m.DropoutStep, Trainer: trainer}
	if opt != nil {
		mh, vh := make([]float32, m.NumParams()), make([]float32, m.NumParams())
		be.Download(mh, opt.M)
		be.Download(vh, opt.V)
		ts = ts[:0]
		for _, p := range m.Params {
			ts = append(ts, STensor{Name: "m/" + p.Name, Shape: p.Shape, Data: mh[p.Offset : p.Offset+p.Len]})
		}
		for _, p := range m.Params {
			ts = append(ts, STensor{Name: "v/" + p.Name, Shape: p.Shape, Data: vh[p.Offset : p.Offset+p.Len]})
		}
		meta["optimizer"] = opt.Name()
		meta["optimizer_step"] = strconv.Itoa(opt.T)
		if err := WriteSafetensors(filepath.Join(tmp, optimFile), ts, meta); err != nil {
			return fail(err)
		}
		st.Optimizer, st.OptimizerStep = opt.Name(), opt.T
		st.Beta1, st.Beta2, st.Epsilon = opt.Beta1, opt.Beta2, opt.Eps
	}
	js, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fail(err)
	}
	if err := writeFileAtomic(filepath.Join(tmp, stateFile), append(js, '\n')); err != nil {
		return fail(err)
	}
	if err := syncDir(tmp); err != nil {
		return fail(err)
	}
	if err := os.RemoveAll(final); err != nil { // an older save of the same step
		return fail(err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fail(err)
	}
	if err := syncDir(dir); err != nil {
		return "", err
	}
	if err := writeFileAtomic(filepath.Join(dir, latestFile), []byte(name+"\n")); err != nil {
		return "", fmt.Errorf("checkpoint %s: updating latest: %w", final, err)
	}
	return final, nil
}

// LatestCheckpoint returns the path of the checkpoint dir/latest names, or
// an error wrapping os.ErrNotExist if there is none.
func LatestCheckpoint(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, latestFile))
	if err != nil {
		return "", err
	}
	name := strings.TrimSpace(string(b))
	if name == "" || strings.ContainsAny(name, "/\\") {
		return "", fmt.Errorf("%s: bad checkpoint name %q", filepath.Join(dir, latestFile), name)
	}
	return filepath.Join(dir, name), nil
}

// ReadState reads ckpt/state.json.
func ReadState(ckpt string) (*State, error) {
	path := filepath.Join(ckpt, stateFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if st.Format != 1 {
		return nil, fmt.Errorf("%s: unknown checkpoint format %d", path, st.Format)
	}
	return &st, nil
}

// ErrMismatch is wrapped by the errors of LoadCheckpoint when the
// checkpoint belongs to another model or vocabulary.
var ErrMismatch = errors.New("checkpoint does not match")

func describe(c Config) string {
	return fmt.Sprintf("preset %q: vocab %d, d_model %d, %d heads, ffn %d, %d+%d layers", c.Preset, c.Vocab, c.DModel, c.Heads, c.FFN, c.EncLayers, c.DecLayers)
}

// LoadCheckpoint restores m (and opt, if not nil) from the checkpoint
// directory ckpt. It refuses, with an error naming the file, a checkpoint
// of another preset or shape, one written with another vocabulary
// (vocabHash differs; an empty vocabHash skips that check), and truncated
// or corrupt files.
func LoadCheckpoint(ckpt string, m *Model, opt *Adam, vocabHash string) (*State, error) {
	st, err := ReadState(ckpt)
	if err != nil {
		return nil, err
	}
	sp := filepath.Join(ckpt, stateFile)
	a, b := st.Config, m.Cfg
	if a.Preset != b.Preset || a.Vocab != b.Vocab || a.DModel != b.DModel || a.Heads != b.Heads || a.FFN != b.FFN || a.EncLayers != b.EncLayers || a.DecLayers != b.DecLayers {
		return nil, fmt.Errorf("%s: %w: written for %s, this model is %s", sp, ErrMismatch, describe(a), describe(b))
	}
	if vocabHash != "" && st.VocabHash != vocabHash {
		return nil, fmt.Errorf("%s: %w: vocabulary mismatch: the checkpoint was trained with vocabulary %s, the current vocabulary is %s", sp, ErrMismatch, st.VocabHash, vocabHash)
	}
	mf, err := ReadSafetensors(filepath.Join(ckpt, modelFile))
	if err != nil {
		return nil, err
	}
	if mf.Metadata["vocab_hash"] != st.VocabHash {
		return nil, fmt.Errorf("%s: %w: vocabulary hash %q differs from state.json's %q", mf.Path, ErrMismatch, mf.Metadata["vocab_hash"], st.VocabHash)
	}
	host := make([]float32, m.NumParams())
	for _, p := range m.Params {
		if err := mf.Read(p.Name, p.Shape, host[p.Offset:p.Offset+p.Len]); err != nil {
			return nil, fmt.Errorf("%w (%v)", err, ErrMismatch)
		}
	}
	if n := len(mf.Names()); n != len(m.Params) {
		return nil, fmt.Errorf("%s: %w: %d tensors, the model has %d parameters", mf.Path, ErrMismatch, n, len(m.Params))
	}
	var mh, vh []float32
	if opt != nil {
		of, err := ReadSafetensors(filepath.Join(ckpt, optimFile))
		if err != nil {
			return nil, err
		}
		mh, vh = make([]float32, m.NumParams()), make([]float32, m.NumParams())
		for _, p := range m.Params {
			if err := of.Read("m/"+p.Name, p.Shape, mh[p.Offset:p.Offset+p.Len]); err != nil {
				return nil, err
			}
			if err := of.Read("v/"+p.Name, p.Shape, vh[p.Offset:p.Offset+p.Len]); err != nil {
				return nil, err
			}
		}
	}
	// Everything is read and checked: now change the model.
	m.be.Upload(m.Weights, host)
	m.Seed, m.DropoutStep = st.Seed, st.DropoutStep
	if opt != nil {
		m.be.Upload(opt.M, mh)
		m.be.Upload(opt.V, vh)
		opt.T = st.OptimizerStep
		opt.Lazy = st.Optimizer == "lazyadam"
		opt.Beta1, opt.Beta2, opt.Eps = st.Beta1, st.Beta2, st.Epsilon
	}
	return st, nil
}
