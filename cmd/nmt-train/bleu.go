package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/data"
)

func bleuCommand() *cli.Command {
	return &cli.Command{
		Name:  "bleu",
		Usage: "score a translation like sacrebleu: nmt-train bleu -r REF.txt [-r REF2.txt] < HYP.txt",
		Description: `Corpus BLEU as sacreBLEU computes it by default (13a tokenizer, exp smoothing, closest reference
   length, mixed case), on detokenized text, one segment per line. Prints the score, the 1-4-gram
   precisions, the brevity penalty, the length ratio, the lengths and the signature.
   --tokenized also prints the lab's number: BLEU on the whitespace-split text as given (e.g. BPE pieces),
   no smoothing, on a 0-1 scale (first reference only).`,
		ArgsUsage: "[HYP.txt]",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "ref", Aliases: []string{"r"}, Usage: "reference `FILE`, one segment per line (required; repeat for several references)"},
			&cli.BoolFlag{Name: "tokenized", Usage: "also print the lab's tokenized BLEU (0-1)"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object instead of text"},
			&cli.BoolFlag{Name: "score-only", Aliases: []string{"b"}, Usage: "print only the score"},
		},
		Action: runBLEU,
	}
}

// readTextLines reads lines from r, checking UTF-8; errors name name:line.
func readTextLines(name string, r io.Reader) ([]string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var out []string
	for sc.Scan() {
		b := sc.Bytes()
		if !utf8.Valid(b) {
			return nil, fmt.Errorf("%s:%d: invalid UTF-8", name, len(out)+1)
		}
		out = append(out, strings.TrimSuffix(string(b), "\r"))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", name, len(out)+1, err)
	}
	return out, nil
}

func runBLEU(c *cli.Context) error {
	switch {
	case c.NArg() > 1:
		return usage(fmt.Errorf("bleu: want at most one hypothesis file (or stdin), got %d arguments", c.NArg()))
	case len(c.StringSlice("ref")) == 0:
		return usage(fmt.Errorf("bleu: no reference: give one with -r REF.txt (see nmt-train bleu --help)"))
	case c.Bool("json") && c.Bool("score-only"):
		return usage(fmt.Errorf("bleu: --json and --score-only: give one of them"))
	}
	hypName := "<stdin>"
	var in io.Reader = os.Stdin
	if c.NArg() == 1 {
		hypName = c.Args().First()
		f, err := os.Open(hypName)
		if err != nil {
			return fmt.Errorf("bleu: %w", err)
		}
		defer f.Close()
		in = f
	}
	hyps, err := readTextLines(hypName, in)
	if err != nil {
		return fmt.Errorf("bleu: %w", err)
	}
	var refs [][]string
	for _, p := range c.StringSlice("ref") {
		r, err := data.ReadLines(p)
		if err != nil {
			return fmt.Errorf("bleu: %w", err)
		}
		if len(r) != len(hyps) {
			return fmt.Errorf("bleu: %s has %d lines but %s has %d: one segment per line in both", p, len(r), hypName, len(hyps))
		}
		refs = append(refs, r)
	}
	res := data.CorpusBLEU(hyps, refs...)
	w := c.App.Writer
	if w == nil {
		w = os.Stdout
	}
	var tok float64
	if c.Bool("tokenized") {
		hp, rp := make([][]string, len(hyps)), make([][]string, len(hyps))
		for i := range hyps {
			hp[i], rp[i] = strings.Fields(hyps[i]), strings.Fields(refs[0][i])
		}
		tok = data.TokenizedBLEU(hp, rp)
	}
	switch {
	case c.Bool("json"):
		o := map[string]any{
			"name": "BLEU", "score": round(res.Score, 6), "signature": res.Signature(), "verbose_score": res.String(),
			"counts": res.Counts, "totals": res.Totals, "precisions": res.Precisions, "bp": res.BP, "ratio": res.Ratio,
			"hyp_len": res.SysLen, "ref_len": res.RefLen, "segments": len(hyps),
		}
		if c.Bool("tokenized") {
			o["tokenized_bleu"] = tok
		}
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(o)
	case c.Bool("score-only"):
		fmt.Fprintf(w, "%.2f\n", res.Score)
	default:
		fmt.Fprintln(w, res.String())
		fmt.Fprintf(w, "signature: %s\n", res.Signature())
		if c.Bool("tokenized") {
			fmt.Fprintf(w, "tokenized BLEU (the lab's number, whitespace tokens, no smoothing, 0-1): %.4f\n", tok)
		}
	}
	return nil
}

func round(x float64, digits int) float64 {
	p := 1.0
	for i := 0; i < digits; i++ {
		p *= 10
	}
	if x < 0 {
		return -float64(int64(-x*p+0.5)) / p
	}
	return float64(int64(x*p+0.5)) / p
}
