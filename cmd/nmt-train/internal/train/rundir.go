package train

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gorun/gorun/checkpoint"
)

// The trainer's side of its run directory (rank 0): refusing a --run-dir
// that is a file, taking it (the lock, one run per directory, restarts, a
// killed writer's temporaries) and resuming from the checkpoint latest
// names. The directory's mechanics are package checkpoint's; the flags,
// messages and what a resume restores into the trainer are here.

// takeRunDir (rank 0) creates and takes the run directory: its lock, held
// until the process ends (a second nmt-train on the same directory is refused);
// without --resume, a directory that holds a run is refused (one run
// directory, one run); then the temporary files of a checkpoint write
// that was killed are removed (no live writer can own them: the lock).
func (t *Trainer) takeRunDir() error {
	o := t.o
	if err := os.MkdirAll(o.RunDir, 0o755); err != nil {
		return err
	}
	unlock, err := checkpoint.LockRunDir(o.RunDir)
	var inUse *checkpoint.RunDirInUseError
	if errors.As(err, &inUse) {
		pid := ""
		if inUse.PID > 0 {
			pid = fmt.Sprintf(" (pid %d)", inUse.PID)
		}
		return fmt.Errorf("--run-dir %s is in use by another nmt-train%s: a run directory holds one run; wait for it, or use another --run-dir", o.RunDir, pid)
	}
	if err != nil {
		return err
	}
	t.unlockDir = unlock
	if !o.Resume && t.id.Restart > 0 {
		// gorun --max-restarts started the job again after a failure: it
		// continues from the last checkpoint, or starts over when the
		// failed start wrote none (its records are set aside).
		if _, err := checkpoint.Latest(o.RunDir); err == nil {
			t.o.Resume = true
			t.logf("nmt-train: restart %d (gorun --max-restarts): resuming from the last checkpoint", t.id.Restart)
		} else {
			t.logf("nmt-train: restart %d (gorun --max-restarts): no checkpoint yet, starting over", t.id.Restart)
			t.runID, t.resumedFrom = checkpoint.NewRunID(), 0
		}
	}
	if !t.o.Resume && t.id.Restart == 0 {
		if what := heldRun(o.RunDir); what != "" {
			if strings.HasPrefix(what, "latest ") {
				return fmt.Errorf("--run-dir %s already holds a run (%s); use --resume to continue it, or another --run-dir", o.RunDir, what)
			}
			return fmt.Errorf("--run-dir %s already holds a run (%s, no checkpoint to resume from); remove it, or use another --run-dir", o.RunDir, what)
		}
		t.runID = checkpoint.NewRunID()
	}
	removed, err := checkpoint.RemoveStaleTemps(o.RunDir)
	if err != nil {
		return err
	}
	if len(removed) > 0 {
		t.logf("nmt-train: removed %s (left by a checkpoint write that was killed)", strings.Join(removed, ", "))
	}
	return nil
}

// resumeRunDir (rank 0, --resume) loads the checkpoint latest names into
// the model and optimizer, and removes the checkpoints written after it
// that latest never named (refusing if one is not of its run).
func (t *Trainer) resumeRunDir() (*checkpoint.State, error) {
	o := t.o
	ck, err := checkpoint.Latest(o.RunDir)
	if err != nil {
		return nil, fmt.Errorf("--resume: %w", err)
	}
	if prev, err := checkpoint.ReadState(ck); err == nil && prev.VocabHash != t.data.VocabHash {
		return nil, fmt.Errorf("--resume: %s was trained with another vocabulary (hash %.12s) than %s's (hash %.12s, %d pieces): resume with the data it was trained on", ck, prev.VocabHash, t.data.Name, t.data.VocabHash, t.data.VocabSize)
	}
	st, err := checkpoint.Load(ck, t.m, t.opt, t.data.VocabHash)
	if err != nil {
		return nil, err
	}
	if t.psgdCkpt, err = t.readPowerSGD(ck); err != nil {
		return nil, err
	}
	// The data position, checked here so that the refusal names the file
	// (the other ranks restore it after the broadcast).
	if raw, ok := st.Trainer["data"]; ok && string(raw) != "null" {
		if err := t.data.Train.Restore(raw); err != nil {
			return nil, fmt.Errorf("--resume: %s: %w", filepath.Join(ck, "state.json"), err)
		}
	}
	removed, err := checkpoint.RemoveUnconfirmed(o.RunDir, st)
	if err != nil {
		return nil, fmt.Errorf("--resume: %w", err)
	}
	if len(removed) > 0 {
		t.logf("nmt-train: removed %s: written after %s, but latest never named them (the run was killed before it did)", strings.Join(removed, ", "), filepath.Base(ck))
	}
	t.runID = st.Run
	if t.runID == "" {
		// a checkpoint of an older version: the checkpoints of its run
		// are never pruned, this run's are
		t.runID = checkpoint.NewRunID()
	}
	t.resumedFrom = st.Step
	return st, nil
}

// heldRun describes what in dir shows that it holds a run ("" if
// nothing): "latest ckpt-N", or the files found.
func heldRun(dir string) string {
	if b, err := os.ReadFile(filepath.Join(dir, "latest")); err == nil {
		return "latest " + strings.TrimSpace(string(b))
	}
	var found []string
	if steps, _ := checkpoint.Steps(dir); len(steps) > 0 {
		found = append(found, checkpoint.DirName(steps[len(steps)-1]))
	}
	for _, f := range []string{"metrics.jsonl", "run.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			found = append(found, f)
		}
	}
	if evs, _ := filepath.Glob(filepath.Join(dir, "events.out.tfevents.*")); len(evs) > 0 {
		found = append(found, filepath.Base(evs[0]))
	}
	return strings.Join(found, ", ")
}

// runDirIsFile refuses a --run-dir that is a file, or one below a file
// (which mkdir would report as "not a directory").
func runDirIsFile(dir string) error {
	for p := filepath.Clean(dir); ; {
		if fi, err := os.Stat(p); err == nil {
			if fi.IsDir() {
				return nil
			}
			if p == filepath.Clean(dir) {
				return fmt.Errorf("--run-dir %s: is a file, not a directory", dir)
			}
			return fmt.Errorf("--run-dir %s: %s is a file, not a directory", dir, p)
		}
		up := filepath.Dir(p)
		if up == p {
			return nil
		}
		p = up
	}
}
