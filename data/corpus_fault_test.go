package data

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// A corpus file that changes under a job reading it through its mapping:
// truncated in place (its lost pages are a SIGBUS when read), written over
// in place (offsets that no longer fit), or replaced by a second prepare
// into the same directory (a rename: the mapping keeps the old file).

// faultCorpus writes a corpus of n pairs of 1-40 ids to a fresh file whose
// modification time is an hour ago (so that any later write changes it,
// whatever the file system's timestamp granularity), and the pairs.
func faultCorpus(t *testing.T, n int) (string, *Pairs) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	p := &Pairs{}
	for i := 0; i < n; i++ {
		s, g := make([]int32, 1+rng.IntN(40)), make([]int32, 1+rng.IntN(40))
		for j := range s {
			s[j] = int32(4 + rng.IntN(90))
		}
		for j := range g {
			g[j] = int32(4 + rng.IntN(90))
		}
		p.Src, p.Tgt = append(p.Src, s), append(p.Tgt, g)
	}
	path := filepath.Join(t.TempDir(), "train.bin")
	if err := WriteCorpus(path, p.Src, p.Tgt, strings.Repeat("cd", 32), 100, 0); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	return path, p
}

func faultBatcher(t *testing.T, s Source) *Batcher {
	t.Helper()
	b, err := NewBatcher(s, BatchConfig{TokensPerBatch: 256, MaxLen: 64, Seed: 3, VocabSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wantChanged checks that err is a *ChangedError naming path and saying
// what changed.
func wantChanged(t *testing.T, err error, path, says string) {
	t.Helper()
	var ce *ChangedError
	if !errors.As(err, &ce) || ce.Path != path {
		t.Fatalf("want a *ChangedError naming %s, got %T %v", path, err, err)
	}
	for _, want := range []string{"data: " + path + " changed under the running job (", says, "): stop, and start again"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is more than one line: %q", err)
	}
}

// Truncated in place (truncate(1), or cp onto it: O_TRUNC first): the
// next batch, and a read of a lost page of the mapping, are an error that
// names the file and its sizes, not a SIGBUS.
func TestCorpusTruncatedUnderBatcher(t *testing.T) {
	path, _ := faultCorpus(t, 5000)
	c, err := OpenCorpus(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := faultBatcher(t, c)
	if _, err := b.Next(); err != nil {
		t.Fatal(err)
	}
	if err := c.Changed(); err != nil {
		t.Fatalf("unchanged file: %v", err)
	}
	size := c.Bytes()
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	says := fmt.Sprintf("size %d → 4096 bytes: truncated, or written over in place", size)
	for i := 0; i < 3; i++ { // and again: nothing is left half done
		_, err := b.Next()
		wantChanged(t, err, path, says)
	}
	wantChanged(t, c.Changed(), path, says)

	// The fault itself: the last line's offsets (byte ~80,000) and every
	// line's tokens are past the one page left. The read stops at the
	// fault; the error is the same.
	for _, read := range []struct {
		name string
		f    func() int
	}{
		{"Lens", func() int { a, _ := c.Lens(c.Len() - 1); return a }},
		{"Pair", func() int { s, _ := c.Pair(0); return int(s[0]) }},
		{"copy", func() int { s, g := c.Pair(0); return copy(make([]int32, len(s)), s) + copy(make([]int32, len(g)), g) }},
	} {
		reached := false
		_, err := readSource(c, func() (int, error) { v := read.f(); reached = true; return v, nil })
		if reached {
			t.Errorf("%s: read past the end of the truncated file without a fault", read.name)
		}
		wantChanged(t, err, path, says)
	}
	// Planning over it (a restart of the Batcher) is the same error.
	_, err = NewBatcher(c, BatchConfig{TokensPerBatch: 256, MaxLen: 64, Seed: 3})
	wantChanged(t, err, path, says)
}

// Written over in place, same size (dd conv=notrunc, a tool writing into
// it): offsets that point outside the file are an error naming it, not a
// slice-bounds panic, and so is the next batch after any write (its
// modification time).
func TestCorpusOverwrittenInPlace(t *testing.T) {
	path, _ := faultCorpus(t, 5000)
	c, err := OpenCorpus(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := faultBatcher(t, c)
	if _, err := b.Next(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	garbage := make([]byte, 16*(c.Len()+1))
	for i := range garbage {
		garbage[i] = 0xff
	}
	if _, err := f.WriteAt(garbage, headerSize); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = b.Next()
	wantChanged(t, err, path, "written over in place at ")
	wantChanged(t, c.Changed(), path, "same size")

	// Each read sees the offsets out of the file's bounds and stops there.
	for _, read := range []func(){func() { c.Lens(3) }, func() { c.Pair(3) }} {
		reached := false
		_, err := readSource(c, func() (int, error) { read(); reached = true; return 0, nil })
		if reached {
			t.Errorf("offsets outside the file read without an error")
		}
		wantChanged(t, err, path, "written over in place")
	}
	// Outside a guarded read the panic says the same (rather than a slice
	// bounds panic).
	func() {
		defer func() {
			r := recover()
			e, ok := r.(*ChangedError)
			if !ok || !strings.Contains(e.Error(), path) || !strings.Contains(e.Detail, "the offsets of line 4 point outside it") {
				t.Errorf("Pair of garbled offsets: panic %v, want a *ChangedError naming the file and line", r)
			}
		}()
		c.Pair(3)
	}()
}

// A line longer now than when it was planned (offsets rewritten within
// the file's bounds) is refused before it sizes a batch.
func TestPadBatchRefusesLongerThanPlanned(t *testing.T) {
	p := &Pairs{Src: [][]int32{{5, 6}, make([]int32, 100)}, Tgt: [][]int32{{7}, {8}}}
	if _, err := padBatch(p, []int32{0}, 0, 8); err != nil {
		t.Fatal(err)
	}
	_, err := padBatch(p, []int32{0, 1}, 0, 8)
	if err == nil || !strings.Contains(err.Error(), "line 2 is 101 tokens long, planned at most 8: the corpus changed") {
		t.Fatalf("got %v", err)
	}
}

// A second prepare into the directory of a running job: Prepare stages
// its files and renames them over the old ones, so the job's mapping keeps
// the old file (its inode lives on while mapped). The job goes on, with
// exactly the batches of the corpus it opened, and no error.
func TestCorpusReplacedByPrepare(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "corpus")
	if _, err := Prepare(context.Background(), PrepareConfig{Out: dir, Synthetic: true, SyntheticLines: 3000, ValidLines: 100}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, TrainFile)
	c, err := OpenCorpus(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// the same pairs in memory: the batches the job must go on with
	mem := &Pairs{}
	for i := 0; i < c.Len(); i++ {
		s, g := c.Pair(i)
		mem.Src, mem.Tgt = append(mem.Src, slices.Clone(s)), append(mem.Tgt, slices.Clone(g))
	}
	cfg := BatchConfig{TokensPerBatch: 512, MaxLen: 64, Seed: 5, VocabSize: c.VocabSize()}
	b, err := NewBatcher(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want, err := NewBatcher(mem, cfg)
	if err != nil {
		t.Fatal(err)
	}
	next := func(i int) {
		t.Helper()
		got, err := b.Next()
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		w, _ := want.Next()
		if !slices.Equal(got.Lines, w.Lines) || !slices.Equal(got.Src, w.Src) || !slices.Equal(got.Tgt, w.Tgt) {
			t.Fatalf("batch %d differs from the corpus the job opened", i)
		}
	}
	next(0)
	before, _ := os.Stat(path)
	if _, err := Prepare(context.Background(), PrepareConfig{Out: dir, Synthetic: true, SyntheticLines: 1000, ValidLines: 100}); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(path)
	if os.SameFile(before, after) || after.Size() == before.Size() {
		t.Fatalf("the second prepare did not replace %s (size %d → %d)", path, before.Size(), after.Size())
	}
	if err := c.Changed(); err != nil {
		t.Fatalf("a replaced file is not a change of the mapped one: %v", err)
	}
	for i := 1; i < 2*b.StepsPerEpoch()+3; i++ { // into the third epoch
		next(i)
	}
}
