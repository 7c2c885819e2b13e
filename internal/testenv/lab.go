package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/data"
)

// LabFiles writes the built-in synthetic corpus under the lab's file
// names, as OpenSeq2Seq's get_en_de.sh leaves them (pieces separated by
// spaces, a SentencePiece vocabulary m_common.vocab): trainLines training
// pairs, 60 evaluation pairs (wmt13) and 25 lines to translate (wmt14),
// into a new directory under parent ("" : the test's own temporary
// directory). It returns the directory with a trailing slash, as the lab's
// data_root.
func LabFiles(t *testing.T, parent string, trainLines int) string {
	t.Helper()
	dir := t.TempDir()
	if parent != "" {
		var err error
		if dir, err = os.MkdirTemp(parent, "lab-data-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	if err := data.SyntheticVocab().WriteFile(filepath.Join(dir, "m_common.vocab")); err != nil {
		t.Fatal(err)
	}
	write := func(name string, lines []string) {
		var sb strings.Builder
		for _, l := range lines {
			sb.WriteString(strings.Join(data.WordPieces(l), " ") + "\n")
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, g := data.Synthetic(data.SyntheticTrainSeed, trainLines)
	write("train.clean.en.shuffled.BPE_common.32K.tok", s)
	write("train.clean.de.shuffled.BPE_common.32K.tok", g)
	vs, vg := data.Synthetic(data.SyntheticValidSeed, 60)
	write("wmt13-en-de.src.BPE_common.32K.tok", vs)
	write("wmt13-en-de.ref.BPE_common.32K.tok", vg)
	is, _ := data.Synthetic(data.SyntheticValidSeed+1, 25)
	write("wmt14-en-de.src.BPE_common.32K.tok", is)
	return dir + "/"
}

// LabConfig is the repository's configs/lab-base.py (repo: the
// repository's root) with the data under dataRoot and the sizes of a test:
// d_model 64, 2 layers, 24 pairs a GPU, 40 steps, a log line every 10,
// evaluation every 20 and a checkpoint every 30 steps, beam 2; then edits.
// Every edit must apply, so that the test reads the committed config, not
// a copy. It returns the path of the edited file, named as the lab's.
func LabConfig(t *testing.T, repo, dataRoot string, edits ...[2]string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "configs/lab-base.py"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, e := range append([][2]string{
		{`data_root = "/data/wmt16_de_en/"`, `data_root = "` + dataRoot + `"`},
		{`d_model = 512`, `d_model = 64`},
		{`num_layers = 6`, `num_layers = 2`},
		{`"batch_size_per_gpu": 128,`, `"batch_size_per_gpu": 24,`},
		{`"max_steps": 300000,`, `"max_steps": 40,`},
		{`"save_summaries_steps": 100,`, `"save_summaries_steps": 10,`},
		{`"print_loss_steps": 100,`, `"print_loss_steps": 10,`},
		{`"eval_steps": 4001,`, `"eval_steps": 20,`},
		{`"save_checkpoint_steps": 299998,`, `"save_checkpoint_steps": 30,`},
		{`"beam_size": 4,`, `"beam_size": 2,`},
		{`"extra_decode_length": 50,`, `"extra_decode_length": 8,`},
	}, edits...) {
		if !strings.Contains(s, e[0]) {
			t.Fatalf("configs/lab-base.py has no %q to edit", e[0])
		}
		s = strings.Replace(s, e[0], e[1], 1)
	}
	p := filepath.Join(t.TempDir(), "transformer-base.py")
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
