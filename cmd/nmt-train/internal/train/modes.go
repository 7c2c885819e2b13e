package train

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/internal/atomicfile"
	"github.com/gorun/gorun/report"
	"github.com/gorun/gorun/transformer"
)

// The modes of OpenSeq2Seq's run.py that Options.Mode selects.
const (
	ModeTrain = "train" // train; evaluate every --eval-every steps unless NoEval
	ModeEval  = "eval"  // evaluate the run directory's latest checkpoint
	ModeInfer = "infer" // translate InferInput into InferOutput with it
)

// checkpointStart is what rank 0 tells the other ranks in eval and infer
// modes: the checkpoint's architecture and step, or that it failed.
type checkpointStart struct {
	Abort      bool               `json:"abort,omitempty"`
	Checkpoint string             `json:"checkpoint"`
	Step       int                `json:"step"`
	Config     transformer.Config `json:"config"`
	Seed       uint64             `json:"seed"`
}

// runFromCheckpoint is the eval and infer modes: every rank builds the
// model of the run directory's latest checkpoint, which rank 0 reads and
// broadcasts; then they evaluate (loss and BLEU on the validation pairs)
// or translate a file, sharing the sentences. The run directory is only
// read: a training that writes it may go on.
func (t *Trainer) runFromCheckpoint(ctx context.Context) error {
	o := t.o
	be, why, err := t.openDevice(o.Device)
	if err != nil {
		return err
	}
	var v *data.Vocab
	if o.Mode == ModeEval {
		if t.data, err = loadCorpus(ctx, o, t.id.Rank, t.id.Size); err != nil {
			return err
		}
		t.logText()
		v = t.data.Vocab
	} else if v, err = data.LoadVocab(filepath.Join(o.RunDir, VocabFile)); err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("%s holds no trained model to translate with (no %s): train into it first", o.RunDir, VocabFile)
		}
		return err
	}
	if _, err := t.configure(be, why); err != nil {
		return err
	}
	// Rank 0 finds the checkpoint before the mesh: alone, a missing one is
	// its error; in a job the others learn of it in the broadcast.
	var start checkpointStart
	var ckErr error
	if t.leader() {
		start, ckErr = latestStart(o.RunDir, v)
	}
	if t.mesh, err = t.connect(ctx, o.Timeout); err != nil {
		if ckErr != nil {
			return ckErr
		}
		return err
	}
	if t.comm, err = collective.New(t.mesh, t.commConfig(t.mesh)); err != nil {
		return err
	}
	if start, err = t.broadcastStart(ctx, start, ckErr); err != nil {
		return err
	}
	if t.m, err = transformer.New(start.Config, be, start.Seed); err != nil {
		return err
	}
	t.m.Activations = t.acts
	if t.leader() {
		if _, err := checkpoint.Load(start.Checkpoint, t.m, transformer.NewLazyAdam(t.m), v.Hash()); err != nil {
			return err
		}
	}
	if err := t.broadcastTensors(ctx, t.m.Weights); err != nil {
		return fmt.Errorf("broadcast of the weights: %w", err)
	}
	t.step = start.Step
	t.logf("nmt-train: %s with %s (step %s, %s parameters) on %d rank(s)", o.Mode, start.Checkpoint, report.Commas(int64(start.Step)), report.Commas(int64(t.m.NumParams())), t.id.Size)
	if o.Mode == ModeEval {
		return t.evaluate(ctx)
	}
	return t.infer(ctx, v)
}

// latestStart reads the state of dir's latest checkpoint and checks that
// it was trained with the vocabulary v.
func latestStart(dir string, v *data.Vocab) (checkpointStart, error) {
	ck, err := checkpoint.Latest(dir)
	if err != nil {
		return checkpointStart{}, fmt.Errorf("%s holds no checkpoint to evaluate or translate with (train into it first): %w", dir, err)
	}
	st, err := checkpoint.ReadState(ck)
	if err != nil {
		return checkpointStart{}, err
	}
	if st.VocabHash != v.Hash() {
		return checkpointStart{}, fmt.Errorf("%s was trained with another vocabulary (hash %.12s) than this one (hash %.12s, %d pieces)", ck, st.VocabHash, v.Hash(), v.Size())
	}
	st.Config.Vocab = v.Size()
	return checkpointStart{Checkpoint: ck, Step: st.Step, Config: st.Config, Seed: st.Seed}, nil
}

// broadcastStart gives every rank rank 0's start, or its failure (failed),
// after which every rank stops: rank 0 with failed, the others without a
// word (errLeaderFailed).
func (t *Trainer) broadcastStart(ctx context.Context, s checkpointStart, failed error) (checkpointStart, error) {
	if failed != nil {
		s = checkpointStart{Abort: true}
	}
	var blob []byte
	if t.leader() {
		blob, _ = json.Marshal(s)
	}
	n := []float32{float32(len(blob))}
	if err := t.comm.Broadcast(ctx, collective.Float32Bytes(n), 0); err != nil {
		return s, fmt.Errorf("broadcast of the checkpoint: %w", err)
	}
	if !t.leader() {
		blob = make([]byte, int(n[0]))
	}
	if err := t.comm.Broadcast(ctx, blob, 0); err != nil {
		return s, fmt.Errorf("broadcast of the checkpoint: %w", err)
	}
	var got checkpointStart
	if err := json.Unmarshal(blob, &got); err != nil {
		return s, fmt.Errorf("broadcast of the checkpoint: %w", err)
	}
	if got.Abort {
		t.comm.Barrier(ctx)
		if failed != nil {
			return got, failed
		}
		return got, errLeaderFailed
	}
	return got, nil
}

// infer translates the lines of Options.InferInput (vocabulary pieces
// separated by spaces, as the lab's *.BPE_common.32K.tok files) into
// Options.InferOutput, one line for each, as OpenSeq2Seq writes them: the
// pieces of the translation separated by spaces (an empty line for an
// empty one). The ranks share the sentences; rank 0 writes the file,
// whole or not at all.
func (t *Trainer) infer(ctx context.Context, v *data.Vocab) error {
	t0 := time.Now()
	f, err := os.Open(t.o.InferInput)
	if err != nil {
		return fmt.Errorf("infer source_file: %w", err)
	}
	defer f.Close()
	var pairs [][2][]int32
	var empty []bool
	// A line longer than the cap (tokens with EOS; the config's eval
	// max_length, as EvalMaxLength) is not translated: one line on stderr,
	// an empty line in the output, as translate's --max-length.
	maxLen := t.o.EvalMaxLength
	if maxLen == 0 {
		maxLen = t.o.MaxLength
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; sc.Scan(); line++ {
		ids := v.Encode(data.SplitPieces(sc.Text()))
		if maxLen > 0 && len(ids)+1 > maxLen {
			if t.leader() {
				fmt.Fprintf(os.Stderr, "nmt-train: %s:%d: %d tokens with EOS, more than max_length %d: not translated, its output line left empty\n", t.o.InferInput, line, len(ids)+1, maxLen)
			}
			ids = nil
		}
		empty = append(empty, len(ids) == 0)
		pairs = append(pairs, [2][]int32{append(ids, data.EOS), nil})
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: line %d: %w", t.o.InferInput, len(pairs)+1, err)
	}
	hyps, err := t.translateShared(ctx, pairs)
	if err != nil {
		return err
	}
	if !t.leader() {
		return nil
	}
	var sb strings.Builder
	for i, h := range hyps {
		if !empty[i] {
			sb.WriteString(strings.Join(v.Decode(trimEOS(h)), " "))
		}
		sb.WriteByte('\n')
	}
	if err := atomicfile.WriteFile(t.o.InferOutput, ".infer.tmp*", []byte(sb.String())); err != nil {
		return fmt.Errorf("--infer_output_file: %w", err)
	}
	t.logf("nmt-train: translated %d lines of %s into %s (%s, alpha %g) in %.1f s", len(hyps), t.o.InferInput, t.o.InferOutput, decodeName(t.o.Beam), t.o.Alpha, time.Since(t0).Seconds())
	return nil
}
