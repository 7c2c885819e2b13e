package data

// Issue 40, item 5: what the fix added to Prepare: Prepare (stop on
// a cancelled context with nothing of its own in Out) and
// PrepareConfig.MaxWordBytes.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// bigRawText writes n synthetic sentence pairs as raw text (words, no ▁)
// to dir/big.{src,tgt}: enough for a prepare with BPE to run for seconds.
func bigRawText(t *testing.T, dir string, n int) (string, string) {
	t.Helper()
	s, g := Synthetic(SyntheticTrainSeed, n)
	sp, gp := filepath.Join(dir, "big.src"), filepath.Join(dir, "big.tgt")
	for p, lines := range map[string][]string{sp: s, gp: g} {
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return sp, gp
}

// outFiles is the name and content of every entry of dir.
func outFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		m[e.Name()] = string(b)
	}
	return m
}

// A cancelled Prepare stops with an error wrapping ErrInterrupted
// ("prepare: interrupted: nothing written to OUT") and leaves Out as an
// earlier Prepare left it: its files, byte for byte, and no staging
// directory. Cancelled before it starts, and while it runs (once its
// staging directory exists, on 300,000 pairs it would take seconds to
// learn and apply a BPE on).
func TestPrepareInterrupted(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	small := t.TempDir()
	ss, sg := bigRawText(t, small, 300)
	if _, err := Prepare(context.Background(), PrepareConfig{Out: out, Src: ss, Tgt: sg, BPEMerges: 50, ValidLines: 10}); err != nil {
		t.Fatal(err)
	}
	before := outFiles(t, out)
	sp, gp := bigRawText(t, dir, 300000)
	cfg := PrepareConfig{Out: out, Src: sp, Tgt: gp, BPEMerges: 2000, ValidLines: 100}
	want := "prepare: interrupted: nothing written to " + out

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Prepare(ctx, cfg); !errors.Is(err, ErrInterrupted) || err.Error() != want {
		t.Errorf("cancelled before: %v, want %s", err, want)
	}

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Prepare(ctx, cfg)
		done <- err
	}()
	for {
		if m, _ := filepath.Glob(filepath.Join(out, prepStagePattern)); len(m) > 0 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("prepare of 300,000 pairs ended (%v) before its staging directory was seen", err)
		case <-time.After(time.Millisecond):
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, ErrInterrupted) || err.Error() != want {
			t.Errorf("cancelled while running: %v, want %s", err, want)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("prepare still running 2 minutes after its context was cancelled")
	}
	after := outFiles(t, out)
	if len(after) != len(before) {
		t.Errorf("out holds %d entries after the interrupted prepare, %d before", len(after), len(before))
	}
	for name, b := range before {
		if after[name] != b {
			t.Errorf("%s changed by the interrupted prepare", name)
		}
	}
}

// MaxWordBytes: a word of exactly the limit is taken, one byte more is
// refused (the limit named); negative: no limit. DefaultMaxWordBytes is
// the limit the tests of bpe_fault_test.go expect.
func TestPrepareMaxWordBytes(t *testing.T) {
	if DefaultMaxWordBytes != maxWord {
		t.Fatalf("DefaultMaxWordBytes = %d, bpe_fault_test.go expects %d", DefaultMaxWordBytes, maxWord)
	}
	dir := t.TempDir()
	text := "the house is small\nthe garden is big\nwe have rooms\n"
	src := filepath.Join(dir, "src")
	os.WriteFile(src, []byte(text), 0o644)
	for _, c := range []struct {
		limit, word int
		err         string
	}{
		{100, 100, ""},
		{100, 101, fmt.Sprintf("%s:2: a word of 101 bytes without white space at byte 5 (%q...) is longer than --max-word-bytes 100: ", filepath.Join(dir, "tgt-101"), strings.Repeat("ü", 10))},
		{-1, 3 * DefaultMaxWordBytes, ""},
	} {
		tgt := filepath.Join(dir, fmt.Sprintf("tgt-%d", c.word))
		w := strings.Repeat("ü", c.word/2) + strings.Repeat("x", c.word%2)
		os.WriteFile(tgt, []byte("das Haus\nder "+w+" ist\u3000gross\nwir\n"), 0o644)
		p, err := Prepare(context.Background(), PrepareConfig{Out: filepath.Join(dir, fmt.Sprint("out", c.limit, c.word)), Src: src, Tgt: tgt, BPEMerges: 10, ValidLines: 1, MaxWordBytes: c.limit})
		switch {
		case c.err == "" && err != nil:
			t.Errorf("limit %d, word of %d bytes: %v", c.limit, c.word, err)
		case c.err == "" && p.TrainStats.Lines != 3:
			t.Errorf("limit %d, word of %d bytes: %d lines read", c.limit, c.word, p.TrainStats.Lines)
		case c.err != "" && (err == nil || !strings.HasPrefix(err.Error(), c.err)):
			t.Errorf("limit %d, word of %d bytes: %v, want %s...", c.limit, c.word, err, c.err)
		}
	}
}

// longWord splits words at white space as Apply does (any Unicode space)
// and finds the first one over the limit.
func TestLongWord(t *testing.T) {
	for _, c := range []struct {
		line  string
		limit int
		at, n int
		note  string
	}{
		{"abc", 3, 0, 0, ""},
		{"abcd", 3, 0, 4, ""},
		{"ab abcd", 3, 3, 4, ""},
		{"ab\u3000abcd ab", 3, 5, 4, ""},
		{"abc\u00a0abc", 3, 0, 0, "no-break space is a space"},
		{"abc\tabc\nabc", 3, 0, 0, ""},
		{"abc äöü", 5, 4, 6, ""},
		{"abc ab ", 3, 0, 0, ""},
	} {
		at, n := longWord(c.line, c.limit)
		if at != c.at || n != c.n {
			t.Errorf("longWord(%q, %d) = %d, %d, want %d, %d %s", c.line, c.limit, at, n, c.at, c.n, c.note)
		}
	}
}
