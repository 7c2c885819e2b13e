// Package checkpoint holds training checkpoints on disk and their life in a
// run directory. A checkpoint is a directory RUN/ckpt-STEP/ of
// model.safetensors (the weights), optimizer.safetensors (Adam's moments),
// the trainer's extra files (File), state.json (State) and, last,
// SHA256SUMS; RUN/latest names the newest complete one. Save writes one so
// that a crash never leaves latest naming a partial checkpoint; Load,
// ReadState and ReadFile read one back, checked. The run directory around
// them (rundir.go): latest, run names, pruning, checkpoints that latest never
// confirmed, the temporaries of a killed writer, and the lock that makes one
// process the directory's writer.
//
// The model's tensors (their names and shapes, the safetensors format, the
// finite check) are package transformer's: this package imports it, never
// the reverse.
package checkpoint

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/gorun/gorun/internal/atomicfile"
	"github.com/gorun/gorun/transformer"
)

const (
	modelFile  = "model.safetensors"
	optimFile  = "optimizer.safetensors"
	stateFile  = "state.json"
	sumsFile   = "SHA256SUMS"
	latestFile = "latest"
)

// DirName is the directory name of the checkpoint of a step.
func DirName(step int) string { return fmt.Sprintf("ckpt-%d", step) }

// File is a safetensors file of the training program's that a checkpoint
// holds beside the model's (PowerSGD's error feedback): written into the
// checkpoint's directory with the others and listed in SHA256SUMS;
// ReadFile reads it back, checked.
type File struct {
	Name    string // a file name, not one of the checkpoint's own
	Tensors []transformer.STensor
	Meta    map[string]string
}

// Save writes dir/ckpt-STEP/ (model.safetensors with the weights under
// their parameter names, optimizer.safetensors with "m/NAME" and "v/NAME",
// state.json, and last SHA256SUMS with the SHA-256 of each of them, in
// sha256sum's format) into a temporary directory, renames it into place,
// and then points dir/latest at it (atomically: temp file, fsync, rename,
// fsync of dir). A crash at any point leaves latest naming a complete
// checkpoint. run (NewRunID; may be "") is recorded in state.json. An
// existing ckpt-STEP is replaced only if it is of the same run (not ""),
// and never when latest names it. Weights or moments that are not finite
// (a diverged run) are refused before anything is written, latest left as
// it was: the error wraps a *transformer.NonFiniteError. It returns the
// checkpoint's path. The extra files (File) are written beside the others.
func Save(dir, run string, step int, m *transformer.Model, opt *transformer.Adam, vocabHash string, trainer map[string]json.RawMessage, extra ...File) (string, error) {
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
	name := DirName(step)
	final := filepath.Join(dir, name)
	if _, err := os.Lstat(final); err == nil {
		if cur, err := Latest(dir); err == nil && filepath.Clean(cur) == filepath.Clean(final) {
			return "", fmt.Errorf("checkpoint %s: exists and latest names it: not replacing it", final)
		}
		if old, err := ReadState(final); run == "" || err != nil || old.Run != run {
			return "", fmt.Errorf("checkpoint %s: exists and is not of this run (%q): not replacing it", final, run)
		}
	}
	// The weights and moments on the host, checked before anything is
	// written: a NaN or an infinity (a diverged run) is never saved, so
	// latest keeps naming the last good checkpoint.
	be := m.Backend()
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
		if e := transformer.FirstNonFinite(m, c.prefix, c.data); e != nil {
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
	meta := map[string]string{"format": "gorun-transformer", "preset": m.Cfg.Preset, "step": strconv.Itoa(step), "vocab_hash": vocabHash}
	sums := map[string]string{}
	if sums[modelFile], err = transformer.WriteSafetensors(filepath.Join(tmp, modelFile), transformer.ParamTensors(m, "", host), meta); err != nil {
		return fail(err)
	}
	st := State{Format: 1, Step: step, Run: run, Config: m.Cfg, VocabHash: vocabHash, Seed: m.Seed, DropoutStep: m.DropoutStep, Trainer: trainer}
	if opt != nil {
		ts := append(transformer.ParamTensors(m, "m/", mh), transformer.ParamTensors(m, "v/", vh)...)
		meta["optimizer"] = opt.Name()
		meta["optimizer_step"] = strconv.Itoa(opt.T)
		if sums[optimFile], err = transformer.WriteSafetensors(filepath.Join(tmp, optimFile), ts, meta); err != nil {
			return fail(err)
		}
		st.Optimizer, st.OptimizerStep = opt.Name(), opt.T
		st.Beta1, st.Beta2, st.Epsilon = opt.Beta1, opt.Beta2, opt.Eps
	}
	for _, f := range extra {
		if sums[f.Name], err = transformer.WriteSafetensors(filepath.Join(tmp, f.Name), f.Tensors, f.Meta); err != nil {
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

// writeAtomic replaces path with data (atomicfile.WriteFile), through a
// temporary file ".NAME.tmp*" that RemoveStaleTemps recognizes.
func writeAtomic(path string, data []byte) error {
	return atomicfile.WriteFile(path, "."+filepath.Base(path)+".tmp*", data)
}

func describe(c transformer.Config) string {
	return fmt.Sprintf("preset %q: vocab %d, d_model %d, %d heads, ffn %d, %d+%d layers", c.Preset, c.Vocab, c.DModel, c.Heads, c.FFN, c.EncLayers, c.DecLayers)
}

// Load restores m (and opt, if not nil) from the checkpoint directory
// ckpt. It refuses, with an error naming the file, a checkpoint of another
// preset or shape, one written with another vocabulary (vocabHash differs;
// an empty vocabHash skips that check), and truncated or corrupt files: a
// file whose SHA-256 differs from the one SHA256SUMS records, a state.json
// out of range (CheckState), weights or moments that are not finite.
// Checkpoints without SHA256SUMS (of versions before it) load without the
// checksum check. The errors of a checkpoint of another model or
// vocabulary wrap transformer.ErrMismatch.
func Load(ckpt string, m *transformer.Model, opt *transformer.Adam, vocabHash string) (*State, error) {
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
		return nil, fmt.Errorf("%s: %w: written for %s, this model is %s", sp, transformer.ErrMismatch, describe(a), describe(b))
	}
	if vocabHash != "" && st.VocabHash != vocabHash {
		return nil, fmt.Errorf("%s: %w: vocabulary mismatch: the checkpoint was trained with vocabulary %s, the current vocabulary is %s", sp, transformer.ErrMismatch, st.VocabHash, vocabHash)
	}
	mf, err := transformer.ReadSafetensors(filepath.Join(ckpt, modelFile))
	if err != nil {
		return nil, err
	}
	if err := verifySum(ckpt, sums, modelFile, mf.SHA256); err != nil {
		return nil, err
	}
	if mf.Metadata["vocab_hash"] != st.VocabHash {
		return nil, fmt.Errorf("%s: %w: vocabulary hash %q differs from state.json's %q", mf.Path, transformer.ErrMismatch, mf.Metadata["vocab_hash"], st.VocabHash)
	}
	host, err := transformer.ReadWeights(mf, m)
	if err != nil {
		return nil, err
	}
	var mh, vh []float32
	if opt != nil {
		of, err := transformer.ReadSafetensors(filepath.Join(ckpt, optimFile))
		if err != nil {
			return nil, err
		}
		if err := verifySum(ckpt, sums, optimFile, of.SHA256); err != nil {
			return nil, err
		}
		if mh, vh, err = transformer.ReadMoments(of, m); err != nil {
			return nil, err
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
	be := m.Backend()
	be.Upload(m.Weights, host)
	m.Seed, m.DropoutStep = st.Seed, st.DropoutStep
	if opt != nil {
		be.Upload(opt.M, mh)
		be.Upload(opt.V, vh)
		opt.T = st.OptimizerStep
		opt.Lazy = st.Optimizer == "lazyadam"
		opt.Beta1, opt.Beta2, opt.Eps = st.Beta1, st.Beta2, st.Epsilon
	}
	return st, nil
}

// checkFinite refuses a NaN or infinite value in a tensor read from path.
func checkFinite(path, prefix string, m *transformer.Model, data []float32) error {
	if e := transformer.FirstNonFinite(m, prefix, data); e != nil {
		return fmt.Errorf("%s: %w", path, e)
	}
	return nil
}

// ReadFile reads the file name that Save wrote into the checkpoint ckpt
// (a File), refusing it when its SHA-256 is not the one SHA256SUMS lists
// (a checkpoint without SHA256SUMS is not checked). A checkpoint without
// it gives an error that wraps fs.ErrNotExist.
func ReadFile(ckpt, name string) (*transformer.SafetensorsFile, error) {
	path := filepath.Join(ckpt, name)
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	sums, err := readSums(ckpt)
	if err != nil {
		return nil, err
	}
	f, err := transformer.ReadSafetensors(path)
	if err != nil {
		return nil, err
	}
	if err := verifySum(ckpt, sums, name, f.SHA256); err != nil {
		return nil, err
	}
	return f, nil
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
