package transformer

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/atomicfile"
)

// State is the content of a checkpoint's state.json.
type State struct {
	Format int `json:"format"`
	Step   int `json:"step"`
	// Run names the run (the lineage of checkpoints, kept across resumes)
	// that wrote it; "" in checkpoints of SaveCheckpoint and of versions
	// before it. PruneCheckpoints removes only checkpoints of its run.
	Run       string `json:"run,omitempty"`
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
	sumsFile   = "SHA256SUMS"
	latestFile = "latest"
)

// CheckpointDir is the directory name of the checkpoint of a step.
func CheckpointDir(step int) string { return fmt.Sprintf("ckpt-%d", step) }

// NewRunID returns a new run name for SaveRunCheckpoint: the UTC time and
// random bits.
func NewRunID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b)
}

// writeAtomic replaces path with data (atomicfile.WriteFile), through a
// temporary file ".NAME.tmp*" that RemoveStaleTemps recognizes.
func writeAtomic(path string, data []byte) error {
	return atomicfile.WriteFile(path, "."+filepath.Base(path)+".tmp*", data)
}

// CheckpointFile is a safetensors file of the training program's that a
// checkpoint holds beside the model's (PowerSGD's error feedback): written
// into the checkpoint's directory with the others and listed in
// SHA256SUMS; ReadCheckpointFile reads it back, checked.
type CheckpointFile struct {
	Name    string // a file name, not one of the checkpoint's own
	Tensors []STensor
	Meta    map[string]string
}

// SaveRunCheckpoint writes dir/ckpt-STEP/ (model.safetensors with the weights
// under their parameter names, optimizer.safetensors with "m/NAME" and
// "v/NAME", state.json, and last SHA256SUMS with the SHA-256 of each of
// them, in sha256sum's format) into a temporary directory, renames it into place,
// and then points dir/latest at it (atomically: temp file, fsync, rename,
// fsync of dir). A crash at any point leaves latest naming a complete
// checkpoint. run (NewRunID; may be "") is recorded in state.json. An
// existing ckpt-STEP is replaced only if it is of the same run (not ""),
// and never when latest names it. Weights or moments that are not finite
// (a diverged run) are refused before anything is written, latest left as
// it was: the error wraps a *NonFiniteError. It returns the checkpoint's
// path. The extra files (CheckpointFile) are written beside the others.
func SaveRunCheckpoint(dir, run string, step int, m *Model, opt *Adam, vocabHash string, trainer map[string]json.RawMessage, extra ...CheckpointFile) (string, error) {
	for _, f := range extra {
		switch f.Name {
		case "", modelFile, optimFile, stateFile, sumsFile, latestFile:
			return "", fmt.Errorf("checkpoint: extra file %q: not a name of its own", f.Name)
		}
		if strings.ContainsAny(f.Name, "/\\") || strings.HasPrefix(f.Name, ".") {
			return "", fmt.Errorf("checkpoint: extra file %q: not a plain file name", f.Name)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	name := CheckpointDir(step)
	final := filepath.Join(dir, name)
	if _, err := os.Lstat(final); err == nil {
		if cur, err := LatestCheckpoint(dir); err == nil && filepath.Clean(cur) == filepath.Clean(final) {
			return "", fmt.Errorf("checkpoint %s: exists and latest names it: not replacing it", final)
		}
		if old, err := ReadState(final); run == "" || err != nil || old.Run != run {
			return "", fmt.Errorf("checkpoint %s: exists and is not of this run (%q): not replacing it", final, run)
		}
	}
	// The weights and moments on the host, checked before anything is
	// written: a NaN or an infinity (a diverged run) is never saved, so
	// latest keeps naming the last good checkpoint.
	be := m.be
	host := make([]float32, m.NumParams())
	be.Download(host, m.Weights)
	var mh, vh []float32
	if opt != nil {
		mh, vh = make([]float32, m.NumParams()), make([]float32, m.NumParams())
		be.Download(mh, opt.M)
		be.Download(vh, opt.V)
	}
	for _, c := range []struct {
		prefix string
		data   []float32
	}{{"", host}, {"m/", mh}, {"v/", vh}} {
		if c.data == nil {
			continue
		}
		if e := FirstNonFinite(m, c.prefix, c.data); e != nil {
			return "", fmt.Errorf("checkpoint %s: not written: %w", final, e)
		}
	}
	tmp, err := atomicfile.MkdirTemp(dir, "."+name+".tmp*")
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("checkpoint %s: %w", final, err)
	}
	var ts []STensor
	for _, p := range m.Params {
		ts = append(ts, STensor{Name: p.Name, Shape: p.Shape, Data: host[p.Offset : p.Offset+p.Len]})
	}
	meta := map[string]string{"format": "gorun-transformer", "preset": m.Cfg.Preset, "step": strconv.Itoa(step), "vocab_hash": vocabHash}
	sums := map[string]string{}
	if sums[modelFile], err = writeSafetensors(filepath.Join(tmp, modelFile), ts, meta); err != nil {
		return fail(err)
	}
	st := State{Format: 1, Step: step, Run: run, Config: m.Cfg, VocabHash: vocabHash, Seed: m.Seed, DropoutStep: m.DropoutStep, Trainer: trainer}
	if opt != nil {
		ts = ts[:0]
		for _, p := range m.Params {
			ts = append(ts, STensor{Name: "m/" + p.Name, Shape: p.Shape, Data: mh[p.Offset : p.Offset+p.Len]})
		}
		for _, p := range m.Params {
			ts = append(ts, STensor{Name: "v/" + p.Name, Shape: p.Shape, Data: vh[p.Offset : p.Offset+p.Len]})
		}
		meta["optimizer"] = opt.Name()
		meta["optimizer_step"] = strconv.Itoa(opt.T)
		if sums[optimFile], err = writeSafetensors(filepath.Join(tmp, optimFile), ts, meta); err != nil {
			return fail(err)
		}
		st.Optimizer, st.OptimizerStep = opt.Name(), opt.T
		st.Beta1, st.Beta2, st.Epsilon = opt.Beta1, opt.Beta2, opt.Eps
	}
	for _, f := range extra {
		if sums[f.Name], err = writeSafetensors(filepath.Join(tmp, f.Name), f.Tensors, f.Meta); err != nil {
			return fail(err)
		}
	}
	js, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fail(err)
	}
	js = append(js, '\n')
	if err := writeAtomic(filepath.Join(tmp, stateFile), js); err != nil {
		return fail(err)
	}
	sums[stateFile] = sha256Hex(js)
	// SHA256SUMS last: the checksums of the other files (sha256sum -c reads it).
	if err := writeAtomic(filepath.Join(tmp, sumsFile), formatSums(sums)); err != nil {
		return fail(err)
	}
	if err := atomicfile.SyncDir(tmp); err != nil {
		return fail(err)
	}
	if err := os.RemoveAll(final); err != nil { // an older save of the same step
		return fail(err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fail(err)
	}
	if err := atomicfile.SyncDir(dir); err != nil {
		return "", err
	}
	if err := writeAtomic(filepath.Join(dir, latestFile), []byte(name+"\n")); err != nil {
		return "", fmt.Errorf("checkpoint %s: updating latest: %w", final, err)
	}
	return final, nil
}

// CheckpointSteps returns the steps of dir's ckpt-STEP directories,
// ascending.
func CheckpointSteps(dir string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var steps []int
	for _, e := range ents {
		var s int
		if e.IsDir() && strings.HasPrefix(e.Name(), "ckpt-") {
			if _, err := fmt.Sscanf(e.Name(), "ckpt-%d", &s); err == nil && CheckpointDir(s) == e.Name() {
				steps = append(steps, s)
			}
		}
	}
	sort.Ints(steps)
	return steps, nil
}

// PruneCheckpoints keeps the newest keep (at least 1) checkpoints of run
// in dir, counting the one latest names, and removes that run's older
// ones; it returns the names it removed. A checkpoint is confirmed only
// once latest names it, so it never removes the checkpoint latest names,
// one of a later step (not confirmed: a writer killed between its rename
// and latest), one of another run or with no run, or one whose state.json
// it cannot read. If latest names no checkpoint of run, it removes
// nothing.
func PruneCheckpoints(dir, run string, keep int) ([]string, error) {
	if run == "" {
		return nil, nil
	}
	keep = max(keep, 1)
	ck, err := LatestCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	latest, err := ReadState(ck)
	if err != nil {
		return nil, err
	}
	if latest.Run != run || filepath.Base(ck) != CheckpointDir(latest.Step) {
		return nil, nil
	}
	steps, err := CheckpointSteps(dir)
	if err != nil {
		return nil, err
	}
	var older []int // of run, before latest, newest first
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		if s >= latest.Step {
			continue
		}
		st, err := ReadState(filepath.Join(dir, CheckpointDir(s)))
		if err != nil || st.Run != run || st.Step != s {
			continue
		}
		older = append(older, s)
	}
	var removed []string
	for _, s := range older[min(keep-1, len(older)):] {
		if err := os.RemoveAll(filepath.Join(dir, CheckpointDir(s))); err != nil {
			return removed, err
		}
		removed = append(removed, CheckpointDir(s))
	}
	return removed, nil
}

// RemoveUnconfirmed prepares dir to resume from latest, the state of the
// checkpoint latest names: a ckpt-STEP of a later step was renamed into
// place by a writer killed before it updated latest. If every such
// checkpoint is of latest's run, they are removed (they were never
// confirmed; the resumed run writes its own) and their names returned.
// Otherwise nothing is removed and the error names the ones of another
// run or of none (written by another run in this directory, or before
// checkpoints named their run): their owner must move them.
func RemoveUnconfirmed(dir string, latest *State) ([]string, error) {
	steps, err := CheckpointSteps(dir)
	if err != nil {
		return nil, err
	}
	var mine, foreign []string
	for _, s := range steps {
		if s <= latest.Step {
			continue
		}
		name := CheckpointDir(s)
		if st, err := ReadState(filepath.Join(dir, name)); err == nil && latest.Run != "" && st.Run == latest.Run {
			mine = append(mine, name)
		} else {
			foreign = append(foreign, name)
		}
	}
	if len(foreign) > 0 {
		return nil, fmt.Errorf("%s: %s newer than the checkpoint latest names (%s) and not of its run: move them out of %s to resume",
			dir, strings.Join(foreign, ", "), CheckpointDir(latest.Step), dir)
	}
	for i, name := range mine {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			return mine[:i], err
		}
	}
	return mine, nil
}

// RemoveStaleTemps removes the temporary directories and files of
// checkpoint writes (.ckpt-STEP.tmp*, .latest.tmp*) from dir and returns
// their names. They belong to a writer that was killed: call it only
// while holding dir's lock (LockRunDir), so that no live writer is using
// one.
func RemoveStaleTemps(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range ents {
		n := e.Name()
		if (strings.HasPrefix(n, ".ckpt-") && strings.Contains(n, ".tmp")) || strings.HasPrefix(n, "."+latestFile+".tmp") {
			if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
				return removed, err
			}
			removed = append(removed, n)
		}
	}
	return removed, nil
}

// RunDirInUseError is LockRunDir's error when another process holds the
// lock.
type RunDirInUseError struct {
	Dir string
	PID int // 0 if unknown
}

func (e *RunDirInUseError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("%s is in use by another process (pid %d)", e.Dir, e.PID)
	}
	return fmt.Sprintf("%s is in use by another process", e.Dir)
}

// LockRunDir takes dir/.lock (flock, exclusive, not waiting) for the
// life of the process or until release is called, and writes the pid
// into it. The kernel drops the lock when the process dies, however it
// dies. If another process holds it the error is a *RunDirInUseError.
func LockRunDir(dir string) (release func(), err error) {
	path := filepath.Join(dir, ".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			b := make([]byte, 32)
			n, _ := f.ReadAt(b, 0)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b[:n])))
			return nil, &RunDirInUseError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, nil
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
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if st.Format != 1 {
		return nil, fmt.Errorf("%s: unknown checkpoint format %d", path, st.Format)
	}
	if err := CheckState(&st); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
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
			return fmt.Errorf("trainer.loss_scaler: %v", err)
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
			return fmt.Errorf("trainer.data: %v", err)
		}
		for k, dst := range map[string]**int64{"epoch": &p.Epoch, "index": &p.Index, "size": &p.Size, "batch_tokens": &p.Tokens, "batches_per_step": &p.PerStep, "lines": &p.Lines, "steps_per_epoch": &p.Steps} {
			if v, ok := p2[k]; ok {
				var n int64
				if err := json.Unmarshal(v, &n); err != nil {
					return fmt.Errorf("trainer.data.%s: %v", k, err)
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

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// formatSums writes sums in sha256sum's format ("HEX  NAME" lines, sorted).
func formatSums(sums map[string]string) []byte {
	names := make([]string, 0, len(sums))
	for n := range sums {
		names = append(names, n)
	}
	sort.Strings(names)
	var b bytes.Buffer
	for _, n := range names {
		fmt.Fprintf(&b, "%s  %s\n", sums[n], n)
	}
	return b.Bytes()
}

// readSums reads ckpt/SHA256SUMS; nil, nil if there is none (a checkpoint
// of a version before checksums).
func readSums(ckpt string) (map[string]string, error) {
	path := filepath.Join(ckpt, sumsFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sums := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		sum, name := "", ""
		if len(f) == 2 {
			sum, name = f[0], strings.TrimPrefix(f[1], "*")
		}
		if _, err := hex.DecodeString(sum); err != nil || len(sum) != 64 || name == "" || strings.ContainsAny(name, "/\\") {
			return nil, fmt.Errorf("%s:%d: not a \"SHA256  FILE\" line (the file changed after it was written)", path, line)
		}
		sums[name] = strings.ToLower(sum)
	}
	if len(sums) == 0 {
		return nil, fmt.Errorf("%s: empty (the file changed after it was written)", path)
	}
	return sums, nil
}

// verifySum checks the SHA-256 got of ckpt/name against sums (nil: a
// checkpoint without checksums, nothing to check).
func verifySum(ckpt string, sums map[string]string, name, got string) error {
	if sums == nil {
		return nil
	}
	want, ok := sums[name]
	if !ok {
		return fmt.Errorf("%s: no checksum in %s (the checkpoint changed after it was written)", filepath.Join(ckpt, name), sumsFile)
	}
	if got != want {
		return fmt.Errorf("%s: checksum mismatch (the file changed after it was written)", filepath.Join(ckpt, name))
	}
	return nil
}

// ReadCheckpointFile reads the file name that SaveRunCheckpoint wrote
// into the checkpoint ckpt as a CheckpointFile, refusing it when its
// SHA-256 is not the one SHA256SUMS lists (a checkpoint without
// SHA256SUMS is not checked). A checkpoint without it gives an error
// that wraps fs.ErrNotExist.
func ReadCheckpointFile(ckpt, name string) (*SafetensorsFile, error) {
	path := filepath.Join(ckpt, name)
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	sums, err := readSums(ckpt)
	if err != nil {
		return nil, err
	}
	f, err := ReadSafetensors(path)
	if err != nil {
		return nil, err
	}
	if err := verifySum(ckpt, sums, name, f.SHA256); err != nil {
		return nil, err
	}
	return f, nil
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
// or corrupt files: a file whose SHA-256 differs from the one SHA256SUMS
// records, a state.json out of range (CheckState), weights or moments
// that are not finite. Checkpoints without SHA256SUMS (of versions before
// it) load without the checksum check.
func LoadCheckpoint(ckpt string, m *Model, opt *Adam, vocabHash string) (*State, error) {
	sums, err := readSums(ckpt)
	if err != nil {
		return nil, err
	}
	sp := filepath.Join(ckpt, stateFile)
	sb, err := os.ReadFile(sp)
	if err != nil {
		return nil, err
	}
	if err := verifySum(ckpt, sums, stateFile, sha256Hex(sb)); err != nil {
		return nil, err
	}
	st, err := parseState(sp, sb)
	if err != nil {
		return nil, err
	}
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
	if err := verifySum(ckpt, sums, modelFile, mf.SHA256); err != nil {
		return nil, err
	}
	if mf.Metadata["vocab_hash"] != st.VocabHash {
		return nil, fmt.Errorf("%s: %w: vocabulary hash %q differs from state.json's %q", mf.Path, ErrMismatch, mf.Metadata["vocab_hash"], st.VocabHash)
	}
	host := make([]float32, m.NumParams())
	for _, p := range m.Params {
		if err := mf.Read(p.Name, p.Shape, host[p.Offset:p.Offset+p.Len]); err != nil {
			return nil, fmt.Errorf("%w (%w)", err, ErrMismatch)
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
		if err := verifySum(ckpt, sums, optimFile, of.SHA256); err != nil {
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
	if err := checkFinite(filepath.Join(ckpt, modelFile), "", m, host); err != nil {
		return nil, err
	}
	if opt != nil {
		if err := checkFinite(filepath.Join(ckpt, optimFile), "m/", m, mh); err != nil {
			return nil, err
		}
		if err := checkFinite(filepath.Join(ckpt, optimFile), "v/", m, vh); err != nil {
			return nil, err
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

// checkFinite refuses a NaN or infinite value in a tensor read from path.
func checkFinite(path, prefix string, m *Model, data []float32) error {
	if e := FirstNonFinite(m, prefix, data); e != nil {
		return fmt.Errorf("%s: %v", path, e)
	}
	return nil
}

// NonFiniteError names the first NaN or infinite value of a tensor of
// weights ("NAME") or Adam moments ("m/NAME", "v/NAME"): what a diverged
// run holds. SaveRunCheckpoint refuses to write one (its error wraps it).
type NonFiniteError struct {
	Tensor string
	Index  int
	Value  float64
}

func (e *NonFiniteError) Error() string {
	return fmt.Sprintf("tensor %s holds %v at index %d", e.Tensor, e.Value, e.Index)
}

// FirstNonFinite returns the first NaN or infinite value of data, a host
// copy of m's weights (or, with prefix "m/" or "v/", of a moment, laid out
// like them), or nil if every value is finite. It reads each value once.
func FirstNonFinite(m *Model, prefix string, data []float32) *NonFiniteError {
	for _, p := range m.Params {
		for i, v := range data[p.Offset : p.Offset+p.Len] {
			if v-v != 0 { // NaN or ±Inf
				return &NonFiniteError{Tensor: prefix + p.Name, Index: i, Value: float64(v)}
			}
		}
	}
	return nil
}
