package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/data"
)

// runCmd runs one of this file's subcommands in-process.
func runCmd(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := &cli.App{
		Name:           "nmt-train",
		Commands:       []*cli.Command{prepareCommand(), bleuCommand()},
		Writer:         &out,
		ErrWriter:      &out,
		ExitErrHandler: func(*cli.Context, error) {},
	}
	if stdin != "" {
		f, err := os.CreateTemp(t.TempDir(), "stdin")
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(stdin)
		f.Seek(0, 0)
		old := os.Stdin
		os.Stdin = f
		defer func() { os.Stdin = old; f.Close() }()
	}
	err := app.Run(append([]string{"nmt-train"}, args...))
	return out.String(), err
}

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPrepareSynthetic(t *testing.T) {
	dir := t.TempDir()
	out, err := runCmd(t, "", "prepare", "--synthetic", "--synthetic-lines", "300", "--out", dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "| line pairs read | 300 |") || !strings.Contains(out, "| line pairs kept | 300 |") {
		t.Errorf("statistics:\n%s", out)
	}
	v, err := data.LoadVocab(filepath.Join(dir, "vocab.txt"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := data.OpenCorpus(filepath.Join(dir, "train.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.CheckVocab(v); err != nil || c.Len() != 300 {
		t.Fatalf("%v, %d lines", err, c.Len())
	}
	src, tgt := data.Synthetic(data.SyntheticTrainSeed, 300)
	for i := 0; i < c.Len(); i++ {
		s, g := c.Pair(i)
		if data.Detokenize(v.Decode(s)) != src[i] || data.Detokenize(v.Decode(g)) != tgt[i] {
			t.Fatalf("pair %d: %q / %q", i, data.Detokenize(v.Decode(s)), data.Detokenize(v.Decode(g)))
		}
	}
	vc, err := data.OpenCorpus(filepath.Join(dir, "valid.bin"))
	if err != nil || vc.Len() != data.SyntheticValidLines {
		t.Fatalf("valid: %v", err)
	}
	vc.Close()
	if b, err := os.ReadFile(filepath.Join(dir, "prepare.md")); err != nil || !bytes.Contains(b, []byte("## Training data")) {
		t.Errorf("prepare.md: %v", err)
	}
}

func TestPrepareLabFormat(t *testing.T) {
	dir := t.TempDir()
	td := "../../data/testdata/"
	out, err := runCmd(t, "", "prepare", "--src", td+"sample.en.tok", "--tgt", td+"sample.de.tok", "--vocab", td+"m_common.vocab",
		"--valid-src", td+"sample.en.tok", "--valid-tgt", td+"sample.de.tok", "--max-length", "10", "--out", dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"| line pairs kept | 5 |", "| dropped: longer than 10 tokens (with EOS) | 3 |", "| unknown pieces source / target | 0 / 1 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	c, err := data.OpenCorpus(filepath.Join(dir, "train.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Len() != 5 || c.Dropped() != 3 {
		t.Errorf("%d lines, %d dropped", c.Len(), c.Dropped())
	}
	// validation pairs are not length-filtered: all 8, in file order
	vc, err := data.OpenCorpus(filepath.Join(dir, "valid.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	all, _ := data.OpenCorpus(filepath.Join(dir, "train.bin"))
	defer all.Close()
	if vc.Len() != 8 || vc.Dropped() != 0 {
		t.Errorf("valid.bin: %d pairs, %d dropped; want all 8 of the validation files (--max-length does not apply)", vc.Len(), vc.Dropped())
	}
	if vs, vt := vc.Tokens(); vs != 8+10+11+8+8+13+5+6 || vt != 8+8+11+7+8+14+3+6 {
		t.Errorf("valid.bin has %d+%d tokens, want the files' 69+65", vs, vt)
	}
	v, _ := data.LoadVocab(td + "m_common.vocab")
	w, _ := data.LoadVocab(filepath.Join(dir, "vocab.txt"))
	if v.Hash() != w.Hash() {
		t.Errorf("the vocabulary copy differs")
	}
}

func TestPrepareRawBPE(t *testing.T) {
	dir := t.TempDir()
	en := []string{"The houses in Munich are big.", "Bears greet 1234 citizens.", "Over 3 million citizens.", "The bears are big."}
	de := []string{"Die Häuser in München sind groß.", "Bären grüßen 1234 Bürger.", "Über 3 Millionen Bürger.", "Die Bären sind groß."}
	var s, g []string
	for i := 0; i < 30; i++ {
		s, g = append(s, en...), append(g, de...)
	}
	sp := writeFile(t, dir, "train.en", strings.Join(s, "\n")+"\n")
	gp := writeFile(t, dir, "train.de", strings.Join(g, "\n")+"\n")
	outDir := filepath.Join(dir, "out")
	out, err := runCmd(t, "", "prepare", "--src", sp, "--tgt", gp, "--bpe-merges", "60", "--valid-lines", "4", "--out", outDir)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	b, err := data.LoadBPE(filepath.Join(outDir, "bpe.codes"))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := data.LoadVocab(filepath.Join(outDir, "vocab.txt"))
	c, err := data.OpenCorpus(filepath.Join(outDir, "train.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Len() != 116 {
		t.Errorf("%d training pairs, want 120 - 4 held out", c.Len())
	}
	for i := 0; i < c.Len(); i++ {
		x, y := c.Pair(i)
		if data.Detokenize(v.Decode(x)) != s[i] || data.Detokenize(v.Decode(y)) != g[i] {
			t.Fatalf("pair %d decodes to %q / %q", i, data.Detokenize(v.Decode(x)), data.Detokenize(v.Decode(y)))
		}
		if got := len(b.Apply(s[i])); got != len(x) {
			t.Fatalf("pair %d: %d ids for %d pieces", i, len(x), got)
		}
	}
	// valid.bin holds the 4 held-out pairs: the last 4 of the file, in order
	vc, err := data.OpenCorpus(filepath.Join(outDir, "valid.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	if vc.Len() != 4 {
		t.Fatalf("valid.bin: %d pairs, want 4", vc.Len())
	}
	for i := 0; i < vc.Len(); i++ {
		x, y := vc.Pair(i)
		if got, want := data.Detokenize(v.Decode(x))+" / "+data.Detokenize(v.Decode(y)), s[116+i]+" / "+g[116+i]; got != want {
			t.Errorf("held-out pair %d: %q, want line %d %q", i, got, 117+i, want)
		}
	}
	// the merges file applies again with --bpe
	out2 := filepath.Join(dir, "out2")
	if out, err := runCmd(t, "", "prepare", "--src", sp, "--tgt", gp, "--bpe", filepath.Join(outDir, "bpe.codes"), "--valid-lines", "4", "--out", out2); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	a1, _ := os.ReadFile(filepath.Join(outDir, "train.bin"))
	a2, _ := os.ReadFile(filepath.Join(out2, "train.bin"))
	if !bytes.Equal(a1, a2) {
		t.Errorf("--bpe with the learned merges gives another corpus")
	}
}

func TestPrepareErrors(t *testing.T) {
	dir := t.TempDir()
	a := writeFile(t, dir, "a", "▁a ▁b\n▁c\n▁d\n")
	b := writeFile(t, dir, "b", "▁a\n▁b\n")
	bad := writeFile(t, dir, "bad", "▁a\n▁b \xff\n▁c\n")
	long := writeFile(t, dir, "long", "▁a ▁b\n▁c ▁d\n")
	dup := writeFile(t, dir, "dup.vocab", "<pad>\t0\n</s>\t0\n<s>\t0\n<unk>\t0\n▁a\t-0\n▁a\t-1\n")
	out := filepath.Join(dir, "out")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--src", a, "--tgt", b, "--vocab-size", "10"}, a + " has 3 lines but " + b + " has 2: the files are not parallel"},
		{[]string{"--src", a, "--tgt", bad, "--vocab-size", "10"}, bad + ":2: invalid UTF-8"},
		{[]string{"--src", a, "--tgt", a, "--vocab", dup}, dup + ":6: duplicate piece \"▁a\" (first on line 5)"},
		{[]string{"--src", a}, "prepare: want --src and --tgt (or --synthetic)"},
		{[]string{"--src", a, "--tgt", a}, "prepare: want --vocab FILE or --vocab-size N"},
		{[]string{"--synthetic", "--src", a}, "prepare: --synthetic makes its own data; --src does not apply"},
		{[]string{"--src", a, "--tgt", a, "--bpe", filepath.Join(dir, "none")}, "none: no such file"},
		{[]string{"--src", a, "--tgt", a, "--vocab-size", "10", "--valid-lines", "2"}, a + " has 3 usable pairs, too few to hold out --valid-lines 2"},
		{[]string{"--src", a, "--tgt", a, "--vocab-size", "10", "--valid-lines", "0"}, "prepare: --valid-lines 0: want at least 1"},
		{[]string{"--src", a, "--tgt", a, "--vocab-size", "10", "--max-length", "-1"}, "prepare: --max-length -1: want 0 (no limit) or at least 2"},
		{[]string{"--src", a, "--tgt", a, "--vocab-size", "4"}, "prepare: --vocab-size 4: want at least 5"},
		{[]string{"--src", a, "--tgt", a, "--bpe-merges", "0"}, "prepare: --bpe-merges 0: want at least 1"},
		{[]string{"--src", a, "--tgt", a, "--vocab-size", "10", "--valid-src", a}, "prepare: --valid-src and --valid-tgt go together"},
		{[]string{"--src", a, "--tgt", a, "--vocab", dup, "--bpe-merges", "10"}, "prepare: --vocab, --bpe-merges and --bpe exclude each other"},
		{[]string{"--src", a, "--tgt", a, "--vocab", dup, "--vocab-size", "10"}, "prepare: --vocab and --vocab-size exclude each other"},
		{[]string{"--src", a, "--tgt", a, "--vocab-size", "10", "--out", out, "stray"}, `prepare: unexpected argument "stray"`},
		{[]string{"--src", long, "--tgt", long, "--vocab-size", "10", "--max-length", "2", "--valid-src", a, "--valid-tgt", a}, "prepare: no pair of " + long + " / " + long + " is kept"},
	} {
		o, err := runCmd(t, "", append(append([]string{"prepare"}, c.args...), "--out", out)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q\n%s", c.args, err, c.want, o)
		}
		// nothing half-written is left: no corpus, no temporary file
		es, _ := os.ReadDir(out)
		for _, e := range es {
			if strings.Contains(e.Name(), "tmp") || strings.HasSuffix(e.Name(), ".bin") {
				t.Errorf("%q: left %s in --out", c.args, e.Name())
			}
		}
	}
}

func TestBLEUCommand(t *testing.T) {
	dir := t.TempDir()
	hyp := "The dog bit the man.\nIt wasn't surprising.\nThe man had just bitten him.\n"
	r1 := writeFile(t, dir, "r1", "The dog bit the man.\nIt was not unexpected.\nThe man bit him first.\n")
	r2 := writeFile(t, dir, "r2", "The dog had bit the man.\nNo one was surprised.\nThe man had bitten the dog.\n")
	out, err := runCmd(t, hyp, "bleu", "-r", r1, "-r", r2)
	if err != nil {
		t.Fatal(err)
	}
	want := "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)\nsignature: nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:" + data.BLEUVersion + "\n"
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	out, err = runCmd(t, hyp, "bleu", "-r", r1, "-r", r2, "--json")
	if err != nil || !strings.Contains(out, `"score": 48.530827`) {
		t.Errorf("json: %v\n%s", err, out)
	}
	h := writeFile(t, dir, "h", "▁the ▁cat\n")
	out, err = runCmd(t, "", "bleu", "-r", h, "--tokenized", h)
	if err != nil || !strings.Contains(out, "tokenized BLEU (the lab's number, whitespace tokens, no smoothing, 0-1): 0.0000") {
		// two tokens: no 3- and 4-grams, so unsmoothed BLEU is 0
		t.Errorf("tokenized: %v\n%s", err, out)
	}
	if _, err := runCmd(t, "a\nb\n", "bleu", "-r", r1); err == nil || err.Error() != "bleu: "+r1+" has 3 lines but <stdin> has 2: one segment per line in both" {
		t.Errorf("line counts: %v", err)
	}
	if _, err := runCmd(t, "a\n\xff\nc\n", "bleu", "-r", r1); err == nil || err.Error() != "bleu: <stdin>:2: invalid UTF-8" {
		t.Errorf("utf8: %v", err)
	}
}

// Without --valid-src the last --valid-lines kept pairs are held out:
// train.bin has the others and valid.bin those, both in file order (a
// count that is not a multiple of the ring's size).
func TestPrepareHeldOut(t *testing.T) {
	dir := t.TempDir()
	var s, g []string
	for i := 1; i <= 10; i++ {
		s, g = append(s, fmt.Sprintf("▁s%d ▁x", i)), append(g, fmt.Sprintf("▁t%d", i))
	}
	sp := writeFile(t, dir, "s", strings.Join(s, "\n")+"\n")
	gp := writeFile(t, dir, "g", strings.Join(g, "\n")+"\n")
	out := filepath.Join(dir, "out")
	if o, err := runCmd(t, "", "prepare", "--src", sp, "--tgt", gp, "--vocab-size", "100", "--valid-lines", "3", "--out", out); err != nil {
		t.Fatalf("%v\n%s", err, o)
	}
	v, err := data.LoadVocab(filepath.Join(out, "vocab.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range []string{"train.bin", "valid.bin"} {
		c, err := data.OpenCorpus(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < c.Len(); i++ {
			x, y := c.Pair(i)
			got = append(got, f+": "+strings.Join(v.Decode(x), " ")+" / "+strings.Join(v.Decode(y), " "))
		}
		c.Close()
	}
	var want []string
	for i := range s {
		f := "train.bin"
		if i >= 7 {
			f = "valid.bin"
		}
		want = append(want, f+": "+s[i]+" / "+g[i])
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("pairs:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestPrepareFailureKeepsOut: a prepare that fails leaves the files of an
// earlier one in --out as they were (its vocabulary and BPE merges are not
// replaced before the corpora are written), and a later prepare without
// BPE does not leave the earlier bpe.codes beside its vocabulary.
func TestPrepareFailureKeepsOut(t *testing.T) {
	dir := t.TempDir()
	outDir := filepath.Join(dir, "out")
	a := writeFile(t, dir, "a", "the bears are big .\nthe houses are big .\nbears greet .\nover 3 bears .\n")
	b := writeFile(t, dir, "b", "die bären sind groß .\ndie häuser sind groß .\nbären grüßen .\nüber 3 bären .\n")
	short := writeFile(t, dir, "short", "die bären .\n")
	if out, err := runCmd(t, "", "prepare", "--src", a, "--tgt", b, "--bpe-merges", "20", "--vocab-size", "40", "--valid-lines", "1", "--out", outDir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	snapshot := func() map[string]string {
		m := map[string]string{}
		ents, _ := os.ReadDir(outDir)
		for _, e := range ents {
			by, err := os.ReadFile(filepath.Join(outDir, e.Name()))
			if err != nil {
				t.Fatalf("%s: %v", e.Name(), err)
			}
			m[e.Name()] = string(by)
		}
		return m
	}
	before := snapshot()
	for _, name := range []string{"train.bin", "valid.bin", "vocab.txt", "bpe.codes", "prepare.md"} {
		if _, ok := before[name]; !ok {
			t.Fatalf("the first prepare wrote no %s (%v)", name, before)
		}
	}
	// other merges and another vocabulary, then a line-count mismatch
	_, err := runCmd(t, "", "prepare", "--src", a, "--tgt", short, "--bpe-merges", "5", "--vocab-size", "30", "--valid-lines", "1", "--out", outDir)
	if err == nil || !strings.Contains(err.Error(), "not parallel") {
		t.Fatalf("mismatched files: %v", err)
	}
	after := snapshot()
	if len(after) != len(before) {
		t.Errorf("--out holds %d entries after the failure, %d before", len(after), len(before))
	}
	for name, was := range before {
		if after[name] != was {
			t.Errorf("%s changed by a prepare that failed", name)
		}
	}
	// a prepare without BPE: its own vocabulary, and no stale bpe.codes
	tok := writeFile(t, dir, "tok", "▁the ▁bears\n▁the ▁houses\n▁bears\n▁over\n")
	if out, err := runCmd(t, "", "prepare", "--src", tok, "--tgt", tok, "--vocab-size", "10", "--valid-lines", "1", "--out", outDir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(outDir, "bpe.codes")); err == nil {
		t.Error("bpe.codes of the earlier prepare left beside a vocabulary made without it")
	}
	if ents, _ := os.ReadDir(outDir); len(ents) != 4 {
		t.Errorf("--out holds %v, want train.bin, valid.bin, vocab.txt, prepare.md", ents)
	}
}

// Flags given with a value that data.PrepareConfig would read as "not
// given" are refused as given, and flags that do not apply to --synthetic
// are refused whatever their value; --valid-lines matters only without
// validation files.
func TestPrepareFlagValues(t *testing.T) {
	dir := t.TempDir()
	a := writeFile(t, dir, "a", "▁a ▁b\n▁c\n▁d\n▁e\n")
	out := filepath.Join(dir, "out")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--src", a, "--tgt", a, "--vocab-size", "0"}, "prepare: --vocab-size 0: want at least 5"},
		{[]string{"--src", a, "--tgt", a, "--bpe-merges", "0", "--vocab-size", "10"}, "prepare: --bpe-merges 0: want at least 1"},
		{[]string{"--synthetic", "--vocab-size", "3"}, "prepare: --synthetic makes its own data; --vocab-size does not apply"},
		{[]string{"--synthetic", "--src", ""}, "prepare: --synthetic makes its own data; --src does not apply"},
		{[]string{"--synthetic", "--synthetic-lines", "0"}, "prepare: --synthetic-lines 0: want at least 1"},
		{[]string{"--src", "", "--tgt", a, "--vocab-size", "10"}, "prepare: --src: want a file name"},
		{[]string{"--src", a, "--tgt", a, "--vocab", ""}, "prepare: --vocab: want a file name"},
	} {
		if o, err := runCmd(t, "", append(append([]string{"prepare"}, c.args...), "--out", out)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q\n%s", c.args, err, c.want, o)
		}
	}
	if o, err := runCmd(t, "", "prepare", "--src", a, "--tgt", a, "--vocab-size", "10", "--valid-src", a, "--valid-tgt", a, "--valid-lines", "0", "--out", out); err != nil {
		t.Errorf("--valid-lines 0 with validation files: %v\n%s", err, o)
	}
	if o, err := runCmd(t, "", "prepare", "--synthetic", "--synthetic-lines", "20", "--valid-lines", "0", "--out", out); err != nil {
		t.Errorf("--valid-lines 0 with --synthetic: %v\n%s", err, o)
	}
}
