package checkpoint

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// NewRunID returns a new run name for Save: the UTC time and random bits.
func NewRunID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b)
}

// Latest returns the path of the checkpoint dir/latest names, or an error
// wrapping os.ErrNotExist if there is none.
func Latest(dir string) (string, error) {
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

// Steps returns the steps of dir's ckpt-STEP directories, ascending.
func Steps(dir string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var steps []int
	for _, e := range ents {
		var s int
		if e.IsDir() && strings.HasPrefix(e.Name(), "ckpt-") {
			if _, err := fmt.Sscanf(e.Name(), "ckpt-%d", &s); err == nil && DirName(s) == e.Name() {
				steps = append(steps, s)
			}
		}
	}
	sort.Ints(steps)
	return steps, nil
}

// Prune keeps the newest keep (at least 1) checkpoints of run in dir,
// counting the one latest names, and removes that run's older ones; it
// returns the names it removed. A checkpoint is confirmed only once latest
// names it, so it never removes the checkpoint latest names, one of a later
// step (not confirmed: a writer killed between its rename and latest), one
// of another run or with no run, or one whose state.json it cannot read.
// If latest names no checkpoint of run, it removes nothing.
func Prune(dir, run string, keep int) ([]string, error) {
	if run == "" {
		return nil, nil
	}
	keep = max(keep, 1)
	ck, err := Latest(dir)
	if err != nil {
		return nil, err
	}
	latest, err := ReadState(ck)
	if err != nil {
		return nil, err
	}
	if latest.Run != run || filepath.Base(ck) != DirName(latest.Step) {
		return nil, nil
	}
	steps, err := Steps(dir)
	if err != nil {
		return nil, err
	}
	var older []int // of run, before latest, newest first
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		if s >= latest.Step {
			continue
		}
		st, err := ReadState(filepath.Join(dir, DirName(s)))
		if err != nil || st.Run != run || st.Step != s {
			continue
		}
		older = append(older, s)
	}
	var removed []string
	for _, s := range older[min(keep-1, len(older)):] {
		if err := os.RemoveAll(filepath.Join(dir, DirName(s))); err != nil {
			return removed, err
		}
		removed = append(removed, DirName(s))
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
	steps, err := Steps(dir)
	if err != nil {
		return nil, err
	}
	var mine, foreign []string
	for _, s := range steps {
		if s <= latest.Step {
			continue
		}
		name := DirName(s)
		if st, err := ReadState(filepath.Join(dir, name)); err == nil && latest.Run != "" && st.Run == latest.Run {
			mine = append(mine, name)
		} else {
			foreign = append(foreign, name)
		}
	}
	if len(foreign) > 0 {
		return nil, fmt.Errorf("%s: %s newer than the checkpoint latest names (%s) and not of its run: move them out of %s to resume",
			dir, strings.Join(foreign, ", "), DirName(latest.Step), dir)
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
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, nil
}
