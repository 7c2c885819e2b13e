package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/transformer"
)

func ckptNames(t *testing.T, dir string) string {
	t.Helper()
	steps, err := Steps(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, s := range steps {
		n = append(n, DirName(s))
	}
	return strings.Join(n, " ")
}

// Pruning keeps the newest checkpoints of its run counting back from the
// one latest names; it never removes that one, a newer one (renamed into
// place, latest not yet updated), another run's or one without a run.
func TestPrune(t *testing.T) {
	dir := t.TempDir()
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	opt := transformer.NewLazyAdam(m)
	save := func(run string, step int) {
		t.Helper()
		if _, err := Save(dir, run, step, m, opt, "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	save("", 1)     // no run (an older version's)
	save("old", 2)  // another run
	save("old", 40) // another run, later steps
	for _, s := range []int{5, 10, 15, 20} {
		save("r", s)
	}
	// killed between the rename of ckpt-25 and latest: latest stays ckpt-20
	save("r", 25)
	os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-20\n"), 0o644)
	removed, err := Prune(dir, "r", 2)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(removed, " ") != "ckpt-10 ckpt-5" {
		t.Fatalf("removed %v", removed)
	}
	if got := ckptNames(t, dir); got != "ckpt-1 ckpt-2 ckpt-15 ckpt-20 ckpt-25 ckpt-40" {
		t.Fatalf("left %s", got)
	}
	// keep 1: only the one latest names (and what is not the run's)
	if _, err := Prune(dir, "r", 1); err != nil {
		t.Fatal(err)
	}
	if got := ckptNames(t, dir); got != "ckpt-1 ckpt-2 ckpt-20 ckpt-25 ckpt-40" {
		t.Fatalf("keep 1: left %s", got)
	}
	// latest names another run's checkpoint: nothing is removed
	os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-40\n"), 0o644)
	if removed, err := Prune(dir, "r", 1); err != nil || len(removed) != 0 {
		t.Fatalf("latest of another run: removed %v, %v", removed, err)
	}
	// no latest: an error, nothing removed
	os.Remove(filepath.Join(dir, "latest"))
	if removed, err := Prune(dir, "r", 1); err == nil || len(removed) != 0 {
		t.Fatalf("no latest: removed %v, %v", removed, err)
	}
	if got := ckptNames(t, dir); got != "ckpt-1 ckpt-2 ckpt-20 ckpt-25 ckpt-40" {
		t.Fatalf("left %s", got)
	}
}

// Pruning removes only what it proves is an older checkpoint of its run:
// never a ckpt-N whose state.json is of another step, nothing when latest
// names a directory that is not ckpt-<its step> (a copy), and keep 0
// counts as 1.
func TestPruneOnlyProven(t *testing.T) {
	dir := t.TempDir()
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	opt := transformer.NewLazyAdam(m)
	for _, s := range []int{10, 15, 20, 30, 40} {
		if _, err := Save(dir, "r", s, m, opt, "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	// ckpt-25 holds a checkpoint of step 15 (a copy under another name)
	copyDir(t, filepath.Join(dir, "ckpt-15"), filepath.Join(dir, "ckpt-25"))
	removed, err := Prune(dir, "r", 2)
	if err != nil || strings.Join(removed, " ") != "ckpt-20 ckpt-15 ckpt-10" {
		t.Fatalf("keep 2: removed %v, %v; want ckpt-20 ckpt-15 ckpt-10", removed, err)
	}
	if got := ckptNames(t, dir); got != "ckpt-25 ckpt-30 ckpt-40" {
		t.Fatalf("keep 2: left %s; ckpt-25 (state.json of step 15) must stay", got)
	}
	// latest names a copy of ckpt-40 under another name: not a checkpoint
	// pruning can count back from
	copyDir(t, filepath.Join(dir, "ckpt-40"), filepath.Join(dir, "final"))
	os.WriteFile(filepath.Join(dir, "latest"), []byte("final\n"), 0o644)
	if removed, err := Prune(dir, "r", 1); err != nil || len(removed) != 0 {
		t.Fatalf("latest names %q: removed %v, %v; want nothing removed", "final", removed, err)
	}
	if got := ckptNames(t, dir); got != "ckpt-25 ckpt-30 ckpt-40" {
		t.Fatalf("latest names final: left %s", got)
	}
	// keep 0 is keep 1: the checkpoint latest names stays
	os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-40\n"), 0o644)
	if removed, err := Prune(dir, "r", 0); err != nil || strings.Join(removed, " ") != "ckpt-30" {
		t.Fatalf("keep 0: removed %v, %v; want ckpt-30", removed, err)
	}
	if got := ckptNames(t, dir); got != "ckpt-25 ckpt-40" {
		t.Fatalf("keep 0: left %s", got)
	}
}

// Resuming: the checkpoints after the one latest names are removed if
// they are of its run (never confirmed), and refused (nothing removed)
// if one is not.
func TestRemoveUnconfirmed(t *testing.T) {
	dir := t.TempDir()
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	opt := transformer.NewLazyAdam(m)
	for _, s := range []int{5, 10, 15} {
		if _, err := Save(dir, "r", s, m, opt, "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-5\n"), 0o644)
	if _, err := Save(dir, "other", 20, m, opt, "v", nil); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-5\n"), 0o644)
	st, err := ReadState(filepath.Join(dir, "ckpt-5"))
	if err != nil || st.Run != "r" {
		t.Fatalf("state %+v, %v", st, err)
	}
	if _, err := RemoveUnconfirmed(dir, st); err == nil || !strings.Contains(err.Error(), "ckpt-20") || strings.Contains(err.Error(), "ckpt-10") {
		t.Fatalf("another run's later checkpoint: %v", err)
	}
	if got := ckptNames(t, dir); got != "ckpt-5 ckpt-10 ckpt-15 ckpt-20" {
		t.Fatalf("a refusal removed something: %s", got)
	}
	os.RemoveAll(filepath.Join(dir, "ckpt-20"))
	removed, err := RemoveUnconfirmed(dir, st)
	if err != nil || strings.Join(removed, " ") != "ckpt-10 ckpt-15" {
		t.Fatalf("removed %v, %v", removed, err)
	}
	if got := ckptNames(t, dir); got != "ckpt-5" {
		t.Fatalf("left %s", got)
	}
}

// Resuming removes a later checkpoint only if its state.json proves it is
// of latest's run: one without a run while latest has none either (both of
// an older version), or one whose state.json does not parse, is refused
// and nothing is removed.
func TestRemoveUnconfirmedUnproven(t *testing.T) {
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	opt := transformer.NewLazyAdam(m)
	for _, c := range []struct {
		name, latestRun, laterRun string
		tear                      bool
	}{
		{"no run, as older versions wrote", "", "", false},
		{"later state.json torn", "r", "r", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if _, err := Save(dir, c.latestRun, 5, m, opt, "v", nil); err != nil {
				t.Fatal(err)
			}
			if _, err := Save(dir, c.laterRun, 10, m, opt, "v", nil); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-5\n"), 0o644)
			if c.tear {
				os.WriteFile(filepath.Join(dir, "ckpt-10", "state.json"), []byte(`{"format": 1, "st`), 0o644)
			}
			st, err := ReadState(filepath.Join(dir, "ckpt-5"))
			if err != nil {
				t.Fatal(err)
			}
			removed, err := RemoveUnconfirmed(dir, st)
			if err == nil || !strings.Contains(err.Error(), "ckpt-10") || len(removed) != 0 {
				t.Fatalf("removed %v, %v; want a refusal naming ckpt-10", removed, err)
			}
			if got := ckptNames(t, dir); got != "ckpt-5 ckpt-10" {
				t.Fatalf("a refusal removed something: left %s", got)
			}
		})
	}
}

// A checkpoint is not replaced by one of another run, nor when latest
// names it.
func TestSaveReplaces(t *testing.T) {
	dir := t.TempDir()
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	opt := transformer.NewLazyAdam(m)
	if _, err := Save(dir, "a", 5, m, opt, "v", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Save(dir, "a", 5, m, opt, "v", nil); err == nil || !strings.Contains(err.Error(), "latest names it") {
		t.Fatalf("replacing the checkpoint latest names: %v", err)
	}
	if _, err := Save(dir, "a", 6, m, opt, "v", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Save(dir, "b", 5, m, opt, "v", nil); err == nil || !strings.Contains(err.Error(), "not of this run") {
		t.Fatalf("replacing another run's checkpoint: %v", err)
	}
	if _, err := Save(dir, "a", 5, m, opt, "v", nil); err != nil {
		t.Fatalf("replacing this run's checkpoint: %v", err)
	}
	if st, err := ReadState(filepath.Join(dir, "ckpt-5")); err != nil || st.Run != "a" {
		t.Fatalf("%+v %v", st, err)
	}
}

// A ckpt-STEP whose state.json does not parse is not proven to be of this
// run: Save refuses to replace it, and leaves it as it was.
func TestSaveKeepsUnreadable(t *testing.T) {
	dir := t.TempDir()
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	opt := transformer.NewLazyAdam(m)
	for _, s := range []int{5, 6} { // latest names ckpt-6
		if _, err := Save(dir, "a", s, m, opt, "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	ck := filepath.Join(dir, "ckpt-5")
	if err := os.WriteFile(filepath.Join(ck, "state.json"), []byte(`{"format": 1, "step": 5, "ru`), 0o644); err != nil {
		t.Fatal(err)
	}
	before := dirFiles(t, ck)
	if _, err := Save(dir, "a", 5, m, opt, "v", nil); err == nil || !strings.Contains(err.Error(), "not of this run") {
		t.Fatalf("saving over a ckpt-5 whose state.json does not parse: %v, want a refusal", err)
	}
	if !sameFiles(before, dirFiles(t, ck)) {
		t.Fatal("a refused save changed ckpt-5 (whose state.json does not parse)")
	}
	if latest, err := Latest(dir); err != nil || filepath.Base(latest) != "ckpt-6" {
		t.Fatalf("latest = %q, %v after a refused save; want ckpt-6", latest, err)
	}
}

// TestSaveNoRunNeverReplaces: with no run name an existing
// ckpt-STEP is never replaced (it cannot be shown to be this run's), and a
// named run does not replace one saved without a name.
func TestSaveNoRunNeverReplaces(t *testing.T) {
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	dir := t.TempDir()
	for _, step := range []int{1, 2} {
		if _, err := Save(dir, "", step, m, nil, "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	before, err := os.ReadFile(filepath.Join(dir, "ckpt-1", "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"", "r"} {
		_, err := Save(dir, run, 1, m, nil, "v", nil)
		if err == nil || !strings.Contains(err.Error(), "ckpt-1: exists and is not of this run") {
			t.Errorf("run %q over a ckpt-1 saved without a run name: %v", run, err)
		}
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "ckpt-1", "SHA256SUMS")); string(after) != string(before) {
		t.Error("ckpt-1 was rewritten")
	}
	if cur, err := Latest(dir); err != nil || filepath.Base(cur) != "ckpt-2" {
		t.Errorf("latest = %s, %v; want ckpt-2", cur, err)
	}
}

// The lock is exclusive (two descriptors of one process conflict, as two
// processes do) and released; stale temporary files are removed, the
// checkpoints are not.
func TestLockAndStaleTemps(t *testing.T) {
	dir := t.TempDir()
	release, err := LockRunDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var inUse *RunDirInUseError
	if _, err := LockRunDir(dir); !errors.As(err, &inUse) || inUse.PID != os.Getpid() {
		t.Fatalf("second lock: %v", err)
	}
	release()
	release2, err := LockRunDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	defer release2()
	m, _ := transformer.New(microConfig(), cpu.New(), 1)
	if _, err := Save(dir, "r", 3, m, nil, "v", nil); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, ".ckpt-4.tmp12345"), 0o755)
	os.WriteFile(filepath.Join(dir, ".ckpt-4.tmp12345", "model.safetensors"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, ".latest.tmp999"), []byte("ckpt-"), 0o644)
	removed, err := RemoveStaleTemps(dir)
	if err != nil || strings.Join(removed, " ") != ".ckpt-4.tmp12345 .latest.tmp999" {
		t.Fatalf("removed %v, %v", removed, err)
	}
	ents, _ := os.ReadDir(dir)
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if strings.Join(left, " ") != ".lock ckpt-3 latest" {
		t.Fatalf("left %v", left)
	}
}

// Only directories named exactly ckpt-STEP are checkpoints: a user's
// ckpt-20.bak or ckpt-007 is neither pruned nor taken for a checkpoint
// written after latest (which would refuse the resume).
func TestStepsNames(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"ckpt-3", "ckpt-12", "ckpt-007", "ckpt-20.bak", "ckpt-x", ".ckpt-4.tmp1"} {
		if err := os.Mkdir(filepath.Join(dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "ckpt-9"), []byte("a file"), 0o644)
	if got := ckptNames(t, dir); got != "ckpt-3 ckpt-12" {
		t.Fatalf("checkpoint steps: %s, want ckpt-3 ckpt-12", got)
	}
}

// latest names a directory of the run directory, nothing else.
func TestLatestBadName(t *testing.T) {
	for _, name := range []string{"", "\n", "../other/ckpt-5\n", "sub/ckpt-5\n", `..\ckpt-5`} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "latest"), []byte(name), 0o644)
		if p, err := Latest(dir); err == nil || !strings.Contains(err.Error(), "bad checkpoint name") {
			t.Errorf("latest %q: %q, %v; want a refusal", name, p, err)
		}
	}
}

// dirFiles reads every file of dir (not recursive): name → content.
func dirFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = string(b)
	}
	return files
}

func sameFiles(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Mkdir(to, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range dirFiles(t, from) {
		if err := os.WriteFile(filepath.Join(to, name), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
