package main

import (
	"bytes"
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
	} {
		o, err := runCmd(t, "", append(append([]string{"prepare"}, c.args...), "--out", out)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q\n%s", c.args, err, c.want, o)
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
