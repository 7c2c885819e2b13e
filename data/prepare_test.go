package data

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Prepare called directly, as the trainer's corpus cache calls it: the
// lab's tokenized files with their vocabulary, no length limit (every
// non-empty pair kept, the histogram still counting the long ones), the
// validation files whole, and the result's counts agreeing with the
// files written.
func TestPrepareAPI(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	p, err := Prepare(context.Background(), PrepareConfig{Out: out, Src: "testdata/sample.en.tok", Tgt: "testdata/sample.de.tok", Vocab: "testdata/m_common.vocab",
		ValidSrc: "testdata/sample.en.tok", ValidTgt: "testdata/sample.de.tok", Command: "a test"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Dir != out || p.Train != 8 || p.Valid != 8 || p.TrainStats.Kept != 8 || p.TrainStats.Dropped() != 0 || p.ValidStats.Lines != 8 {
		t.Errorf("dir %s, %d training and %d validation pairs, stats %+v / %+v", p.Dir, p.Train, p.Valid, p.TrainStats, p.ValidStats)
	}
	rep, err := os.ReadFile(filepath.Join(out, ReportFile))
	if err != nil || string(rep) != string(p.Report) {
		t.Fatalf("prepare.md: %v, or not the report returned", err)
	}
	for _, want := range []string{"`a test`", "| line pairs kept | 8 |", "## Validation data"} {
		if !strings.Contains(string(rep), want) {
			t.Errorf("report lacks %q:\n%s", want, rep)
		}
	}
	if strings.Contains(string(rep), "dropped: longer") {
		t.Errorf("no length limit, yet the report counts pairs dropped as too long:\n%s", rep)
	}
	c, err := OpenCorpus(filepath.Join(out, TrainFile))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.CheckVocab(p.Vocab); err != nil || c.Len() != 8 || c.Dropped() != 0 {
		t.Errorf("train.bin: %v, %d pairs, %d dropped", err, c.Len(), c.Dropped())
	}
	ents, _ := os.ReadDir(out)
	if len(ents) != 4 {
		t.Errorf("out holds %v, want train.bin, valid.bin, vocab.txt, prepare.md", ents)
	}
}

// No validation files and ValidLines 0: every kept pair trains and
// valid.bin holds none (the cache's case of a config without eval files).
func TestPrepareNoValidation(t *testing.T) {
	out := t.TempDir()
	p, err := Prepare(context.Background(), PrepareConfig{Out: out, Src: "testdata/sample.en.tok", Tgt: "testdata/sample.de.tok", Vocab: "testdata/m_common.vocab", MaxLen: 10})
	if err != nil {
		t.Fatal(err)
	}
	if p.Train != 5 || p.Valid != 0 {
		t.Errorf("%d training and %d validation pairs, want 5 (3 longer than 10) and 0", p.Train, p.Valid)
	}
	if !strings.Contains(string(p.Report), "Validation: none") {
		t.Errorf("report:\n%s", p.Report)
	}
	vc, err := OpenCorpus(filepath.Join(out, ValidFile))
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	if vc.Len() != 0 {
		t.Errorf("valid.bin has %d pairs", vc.Len())
	}
}

// A configuration Prepare cannot carry out is refused before anything is
// read or written: Out is not even created.
func TestPrepareConfigRefused(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	tok := PrepareConfig{Out: out, Src: "testdata/sample.en.tok", Tgt: "testdata/sample.de.tok"}
	with := func(f func(*PrepareConfig)) PrepareConfig { c := tok; f(&c); return c }
	for _, c := range []struct {
		cfg  PrepareConfig
		want string
	}{
		{with(func(c *PrepareConfig) {}), "want --vocab FILE or --vocab-size N"},
		{with(func(c *PrepareConfig) { c.Out = "" }), "want --out DIR"},
		{with(func(c *PrepareConfig) { c.Vocab, c.VocabSize = "v", 10 }), "--vocab and --vocab-size exclude each other"},
		{with(func(c *PrepareConfig) { c.Vocab, c.BPE = "v", "b" }), "--vocab, --bpe-merges and --bpe exclude each other"},
		{with(func(c *PrepareConfig) { c.VocabSize = 3 }), "--vocab-size 3: want at least 5"},
		{with(func(c *PrepareConfig) { c.BPEMerges = -1 }), "--bpe-merges -1: want at least 1"},
		{with(func(c *PrepareConfig) { c.VocabSize, c.MaxLen = 10, 1 }), "--max-length 1: want 0 (no limit) or at least 2"},
		{with(func(c *PrepareConfig) { c.VocabSize, c.ValidLines = 10, -1 }), "--valid-lines -1: want at least 1"},
		{with(func(c *PrepareConfig) { c.VocabSize, c.ValidSrc = 10, "x" }), "--valid-src and --valid-tgt go together"},
		{with(func(c *PrepareConfig) { c.Tgt = "" }), "want --src and --tgt"},
		{PrepareConfig{Out: out, Synthetic: true, SyntheticLines: 10, Vocab: "v"}, "--synthetic makes its own data; --vocab does not apply"},
		{PrepareConfig{Out: out, Synthetic: true}, "--synthetic-lines 0: want at least 1"},
	} {
		_, err := Prepare(context.Background(), c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("%+v: out was created", c.cfg)
		}
	}
}

// A Prepare that fails on its input leaves no staging directory and no
// file in Out; one killed earlier left a staging directory that the next
// Prepare removes.
func TestPrepareStaging(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("▁a\n"), 0o644)
	killed := filepath.Join(out, ".prepare.tmp123")
	if err := os.MkdirAll(killed, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(killed, TrainFile), []byte("half"), 0o644)
	_, err := Prepare(context.Background(), PrepareConfig{Out: out, Src: "testdata/sample.en.tok", Tgt: short, Vocab: "testdata/m_common.vocab"})
	if err == nil || !strings.Contains(err.Error(), "testdata/sample.en.tok has 8 lines but "+short+" has 1") {
		t.Fatalf("error %v", err)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("out holds %v after a failed Prepare", ents)
	}
}
