package openseq2seq

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
)

func readLab(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/lab-transformer-base.py")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lineOf returns the 1-based line of the first line of src containing s.
func lineOf(t *testing.T, src, s string) int {
	t.Helper()
	for i, l := range strings.Split(src, "\n") {
		if strings.Contains(l, s) {
			return i + 1
		}
	}
	t.Fatalf("%q is not in the config", s)
	return 0
}

// TestLoadLab: the lab's transformer-base config, field by field.
func TestLoadLab(t *testing.T) {
	src := readLab(t)
	c, err := LoadSource("lab.py", []byte(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) Pos { return Pos(fmt.Sprintf("lab.py:%d", lineOf(t, src, s))) }
	dl := func(sec, src, tgt string, batch, maxLen int, shuffle, repeat bool) DataLayer {
		return DataLayer{Present: true, BatchSizePerGPU: batch, SourceFile: "/data/wmt16_de_en/" + src, TargetFile: "/data/wmt16_de_en/" + tgt,
			VocabFile: "/data/wmt16_de_en/m_common.vocab", MaxLength: maxLen, Shuffle: shuffle, Repeat: repeat, StartToken: true,
			section: sec, srcVocab: true, tgtVoc: true}
	}
	shape := Layers{Layers: 6, Hidden: 512, Heads: 8, Filter: 2048, AttentionDropout: 0.1, ReluDropout: 0.1, PostprocessDropout: 0.1}
	want := Config{
		Path: "lab.py", Logdir: "Transformer-FP32-H-128", LogdirPos: at(`"logdir"`),
		BatchSizePerGPU: 128, MaxSteps: 300000,
		SaveSummariesSteps: 100, PrintLossSteps: 100, PrintSamplesSteps: 100, EvalSteps: 4001, SaveCheckpointSteps: 299998,
		NumCheckpoints: 5, IterSize: 1, Dtype: "float32",
		Optimizer: "LazyAdam", Beta1: 0.9, Beta2: 0.997, Epsilon: 1e-9,
		LRPolicy: "transformer", LearningRate: 2, WarmupSteps: 8000, LRDModel: 512,
		Encoder: shape, Decoder: shape, LayerNormEpsilon: 1e-6,
		BeamSize: 4, Alpha: 0.6, ExtraDecodeLength: 50, LabelSmoothing: 0.1,
		Train:   dl("train_params", "train.clean.en.shuffled.BPE_common.32K.tok", "train.clean.de.shuffled.BPE_common.32K.tok", 128, 56, true, true),
		Eval:    dl("eval_params", "wmt13-en-de.src.BPE_common.32K.tok", "wmt13-en-de.ref.BPE_common.32K.tok", 16, 256, false, true),
		Infer:   dl("infer_params", "wmt14-en-de.src.BPE_common.32K.tok", "wmt14-en-de.src.BPE_common.32K.tok", 1, 256, false, false),
		hasLoss: true,
	}
	got := *c
	got.Ignored, got.Positions = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%+v\nwant\n%+v", got, want)
	}

	// Every key is used or listed as ignored, with its line.
	ignored := map[string]Pos{}
	for _, n := range c.Ignored {
		if n.Why == "" {
			t.Errorf("%s: no reason", n.Key)
		}
		ignored[n.Key] = n.Pos
	}
	for key, line := range map[string]string{
		"use_horovod":                                        `"use_horovod"`,
		"num_gpus":                                           `"num_gpus"`,
		"encoder_params/pad_embeddings_2_eight":              `"pad_embeddings_2_eight"`,
		"encoder_params/remove_padding":                      `"remove_padding"`,
		"decoder_params/EOS_ID":                              `"EOS_ID"`,
		"decoder_params/GO_SYMBOL":                           `"GO_SYMBOL"`,
		"decoder_params/END_SYMBOL":                          `"END_SYMBOL"`,
		"decoder_params/PAD_SYMBOL":                          `"PAD_SYMBOL"`,
		"train_params/data_layer_params/shuffle_buffer_size": `"shuffle_buffer_size"`,
		"train_params/data_layer_params/map_parallel_calls":  `"map_parallel_calls"`,
		"train_params/data_layer_params/pad_vocab_to_eight":  `"pad_vocab_to_eight"`,
		"train_params/data_layer_params/delimiter":           `"delimiter"`,
	} {
		if p, ok := ignored[key]; !ok || p != at(line) {
			t.Errorf("%s: ignored at %q, want %s", key, p, at(line))
		}
	}
	if len(c.Ignored) != 17 {
		for _, n := range c.Ignored {
			t.Log(n)
		}
		t.Errorf("%d notes, want 17", len(c.Ignored))
	}
	for k, line := range map[string]string{
		"encoder_params/hidden_size":                 `"hidden_size": d_model`,
		"lr_policy_params/learning_rate":             `"learning_rate"`,
		"train_params/data_layer_params/source_file": `train.clean.en`,
		"eval_params/batch_size_per_gpu":             `"batch_size_per_gpu": 16`,
		"base_model":                                 `base_model = Text2Text`,
	} {
		if p := c.Positions[k]; p != at(line) {
			t.Errorf("Positions[%s] = %q, want %s", k, p, at(line))
		}
	}
	for _, mode := range []string{"train", "train_eval", "eval", "infer"} {
		if err := c.ModeCheck(mode); err != nil {
			t.Errorf("ModeCheck(%s): %v", mode, err)
		}
	}
}

// TestLoadBig: a transformer-big-like config in mixed precision, written
// with names, a shared norm_params dict and a data layer in base_params.
func TestLoadBig(t *testing.T) {
	c, err := Load("testdata/transformer-big-mixed.py", nil)
	if err != nil {
		t.Fatal(err)
	}
	shape := Layers{Layers: 6, Hidden: 1024, Heads: 16, Filter: 4096, AttentionDropout: 0.1, ReluDropout: 0.3, PostprocessDropout: 0.3}
	if c.Encoder != shape || c.Decoder != shape {
		t.Errorf("shape %+v / %+v", c.Encoder, c.Decoder)
	}
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"Dtype", c.Dtype, "mixed"}, {"LossScaling", c.LossScaling, "Backoff"}, {"Optimizer", c.Optimizer, "Adam"},
		{"IterSize", c.IterSize, 2}, {"NumCheckpoints", c.NumCheckpoints, 3}, {"PrintSamplesSteps (None)", c.PrintSamplesSteps, 0},
		{"RandomSeed", c.RandomSeed, 42}, {"RandomSeedSet", c.RandomSeedSet, true}, {"LRDModel", c.LRDModel, 1024},
		{"LayerNormEpsilon", c.LayerNormEpsilon, 1e-6},
		{"Train.StartToken", c.Train.StartToken, false}, {"Train.MaxLength", c.Train.MaxLength, 64},
		{"Eval batch (eval_batch_size_per_gpu)", c.Eval.BatchSizePerGPU, 32},
		{"Infer present (base_params has the data layer)", c.Infer.Present, true},
		{"Infer batch", c.Infer.BatchSizePerGPU, 256},
		{"Infer vocabulary (from base_params)", c.Infer.VocabFile, "/raid/wmt16/m_common.vocab"},
	} {
		if !reflect.DeepEqual(f.got, f.want) {
			t.Errorf("%s = %v, want %v", f.name, f.got, f.want)
		}
	}
	if err := c.ModeCheck("train_eval"); err != nil {
		t.Error(err)
	}
	want := "testdata/transformer-big-mixed.py: --mode=infer: infer_params lacks data_layer_params source_file, max_length"
	if err := c.ModeCheck("infer"); err == nil || err.Error() != want {
		t.Errorf("ModeCheck(infer) = %v, want %s", err, want)
	}
}

// TestLoadOverrides: run.py's --KEY=VALUE, typed by the config's value.
func TestLoadOverrides(t *testing.T) {
	src := []byte(readLab(t))
	c, err := LoadSource("lab.py", src, []string{
		"--batch_size_per_gpu=64", "--lr_policy_params/learning_rate=1.5", "--use_horovod=False",
		"--logdir=/runs/x", "--encoder_params/num_heads", "4", "--decoder_params/num_heads=4",
		"--max_step=1000", // argparse takes a unique prefix
		"--optimizer_params/beta2=0.98", "--optimizer_params/epsilon=-1e-9",
	})
	if err == nil || err.Error() != "command line --optimizer_params/epsilon=-1e-9: optimizer_params/epsilon: -1e-09 is outside [0.0, 1.7976931348623157e+308]" {
		t.Fatalf("a negative epsilon: %v", err)
	}
	// argparse takes "-1e-9" for an option, not a value ("-1" and "-.5" are values)
	if _, err = LoadSource("lab.py", src, []string{"--optimizer_params/epsilon", "-1e-9"}); err == nil ||
		err.Error() != "command line --optimizer_params/epsilon: expected one argument (run.py reads --KEY=VALUE or --KEY VALUE; a bool takes True or False)" {
		t.Fatalf("-1e-9 as a value: %v", err)
	}
	c, err = LoadSource("lab.py", src, []string{
		"--batch_size_per_gpu=64", "--lr_policy_params/learning_rate=1.5", "--use_horovod=False",
		"--logdir=/runs/x", "--encoder_params/num_heads", "4", "--decoder_params/num_heads=4",
		"--max_step=1000", "--optimizer_params/beta2=0.98",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.BatchSizePerGPU != 64 || c.Train.BatchSizePerGPU != 64 || c.Eval.BatchSizePerGPU != 16 || c.Infer.BatchSizePerGPU != 1 {
		t.Errorf("batch %d/%d/%d/%d: the *_params entries win over the command line, as in run.py", c.BatchSizePerGPU, c.Train.BatchSizePerGPU, c.Eval.BatchSizePerGPU, c.Infer.BatchSizePerGPU)
	}
	if c.LearningRate != 1.5 || c.Logdir != "/runs/x" || c.Encoder.Heads != 4 || c.Decoder.Heads != 4 || c.MaxSteps != 1000 || c.Beta2 != 0.98 {
		t.Errorf("overrides not applied: %+v", c)
	}
	for k, want := range map[string]Pos{
		"batch_size_per_gpu":             "command line --batch_size_per_gpu=64",
		"encoder_params/num_heads":       "command line --encoder_params/num_heads=4",
		"max_steps":                      "command line --max_step=1000",
		"lr_policy_params/learning_rate": "command line --lr_policy_params/learning_rate=1.5",
	} {
		if c.Positions[k] != want {
			t.Errorf("Positions[%s] = %q, want %q", k, c.Positions[k], want)
		}
	}
	for _, n := range c.Ignored {
		if n.Key == "use_horovod" && n.Pos != "command line --use_horovod=False" {
			t.Errorf("use_horovod noted at %s", n.Pos)
		}
	}
	// An override's errors name the command line.
	if _, err := LoadSource("lab.py", src, []string{"--encoder_params/num_heads=7"}); err == nil ||
		err.Error() != "command line --encoder_params/num_heads=7: encoder_params/num_heads: hidden_size 512 is not divisible by num_heads 7" {
		t.Errorf("got %v", err)
	}

	dtypeLine := lineOf(t, string(src), `"dtype": tf.float32`)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--batch_size=8"}, ""}, // unique prefix of batch_size_per_gpu
		{[]string{"--nope=1"}, `command line --nope=1: unknown key "nope": run.py overrides entries of base_params (nested keys joined with '/', e.g. lr_policy_params/learning_rate) that hold a number, a string or True/False`},
		{[]string{"--print=1"}, "command line --print=1: ambiguous option: --print could match --print_loss_steps, --print_samples_steps (as run.py's argparse says)"},
		{[]string{"--dtype=float16"}, fmt.Sprintf(`command line --dtype=float16: key "dtype" holds tensorflow.float32 (lab.py:%d), which run.py does not override from the command line: only numbers, strings and True/False`, dtypeLine)},
		{[]string{"--encoder_params=1"}, `command line --encoder_params=1: key "encoder_params" is a dict (lab.py:53): override one of its entries, --encoder_params/KEY=VALUE`},
		{[]string{"--batch_size_per_gpu=6.5"}, `command line --batch_size_per_gpu=6.5: "6.5" is not an int (batch_size_per_gpu is 128 at lab.py:`},
		{[]string{"--alpha=x"}, `command line --alpha=x: unknown key "alpha"`},
		{[]string{"--decoder_params/alpha=x"}, `command line --decoder_params/alpha=x: "x" is not a float (decoder_params/alpha is 0.6 at lab.py:`},
		{[]string{"--use_horovod=1"}, `command line --use_horovod=1: "1": want True or False (run.py reads bools with ast.literal_eval)`},
		{[]string{"--use_horovod"}, "command line --use_horovod: expected one argument (run.py reads --KEY=VALUE or --KEY VALUE; a bool takes True or False)"},
		{[]string{"--use_horovod", "--logdir=x"}, "command line --use_horovod: expected one argument"},
		{[]string{"stray"}, "command line stray: unrecognized argument (run.py takes --KEY=VALUE for an entry of base_params)"},
		{[]string{"--logdir=a b"}, ""},
		{[]string{"--max_steps=0"}, "command line --max_steps=0: max_steps: 0 is less than 1"},
		{[]string{"--loss_params/label_smoothing=1"}, "command line --loss_params/label_smoothing=1: loss_params/label_smoothing: 1.0 is outside [0.0, 1.0)"},
	} {
		_, err := LoadSource("lab.py", src, c.args)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.want != "" && (err == nil || !strings.HasPrefix(err.Error(), c.want)):
			t.Errorf("%v:\n got  %v\n want %s", c.args, err, c.want)
		}
	}
}

// TestLoadMerging: train_params, eval_params and infer_params are each
// nested-updated over base_params.
func TestLoadMerging(t *testing.T) {
	head := `from open_seq2seq.models import Text2Text
from open_seq2seq.encoders import TransformerEncoder
from open_seq2seq.decoders import TransformerDecoder
from open_seq2seq.data.text2text.text2text import ParallelTextDataLayer
base_model = Text2Text
shape = {"hidden_size": 64, "num_heads": 4, "filter_size": 256, "attention_dropout": 0.1,
         "relu_dropout": 0.1, "layer_postprocess_dropout": 0.1}
base_params = {
  "batch_size_per_gpu": 32,
  "max_steps": 10,
  "encoder": TransformerEncoder,
  "encoder_params": {"encoder_layers": 2, "hidden_size": 64, "num_heads": 4, "filter_size": 256,
                     "attention_dropout": 0.1, "relu_dropout": 0.1, "layer_postprocess_dropout": 0.1},
  "decoder": TransformerDecoder,
  "decoder_params": {"num_hidden_layers": 2, "hidden_size": 64, "num_heads": 4, "filter_size": 256,
                     "attention_dropout": 0.1, "relu_dropout": 0.1, "layer_postprocess_dropout": 0.1,
                     "beam_size": 2, "alpha": 0.6, "extra_decode_length": 10},
  "data_layer": ParallelTextDataLayer,
  "data_layer_params": {"src_vocab_file": "v", "tgt_vocab_file": "v", "max_length": 50,
                        "shuffle": True, "repeat": True, "use_start_token": False},
}
`
	t.Run("nested update", func(t *testing.T) {
		src := head + `
train_params = {"data_layer_params": {"source_file": "tr.en", "target_file": "tr.de"}}
eval_params = {
  "eval_batch_size_per_gpu": 8,
  "data_layer_params": {"source_file": "va.en", "target_file": "va.de", "shuffle": False, "max_length": 99},
  "num_gpus": 4,
}
`
		c, err := LoadSource("m.py", []byte(src), nil)
		if err != nil {
			t.Fatal(err)
		}
		wantTrain := DataLayer{Present: true, BatchSizePerGPU: 32, SourceFile: "tr.en", TargetFile: "tr.de", VocabFile: "v", MaxLength: 50,
			Shuffle: true, Repeat: true, section: "train_params", srcVocab: true, tgtVoc: true}
		wantEval := DataLayer{Present: true, BatchSizePerGPU: 8, SourceFile: "va.en", TargetFile: "va.de", VocabFile: "v", MaxLength: 99,
			Shuffle: false, Repeat: true, section: "eval_params", srcVocab: true, tgtVoc: true}
		wantInfer := DataLayer{Present: true, BatchSizePerGPU: 32, VocabFile: "v", MaxLength: 50, Shuffle: true, Repeat: true,
			section: "infer_params", srcVocab: true, tgtVoc: true}
		for _, d := range []struct{ got, want DataLayer }{{c.Train, wantTrain}, {c.Eval, wantEval}, {c.Infer, wantInfer}} {
			if !reflect.DeepEqual(d.got, d.want) {
				t.Errorf("got  %+v\nwant %+v", d.got, d.want)
			}
		}
		if c.Positions["eval_params/data_layer_params/max_length"] != "m.py:26" || c.Positions["data_layer_params/max_length"] != "m.py:19" {
			t.Errorf("positions %v", c.Positions)
		}
		found := false
		for _, n := range c.Ignored {
			if n.Key == "eval_params/num_gpus" && n.Pos == "m.py:27" {
				found = true
			}
		}
		if !found {
			t.Errorf("eval_params/num_gpus not noted: %v", c.Ignored)
		}
		if err := c.ModeCheck("infer"); err == nil || err.Error() != "m.py: --mode=infer: infer_params lacks data_layer_params source_file" {
			t.Errorf("ModeCheck(infer) = %v", err)
		}
		if err := c.ModeCheck("train_eval"); err == nil || err.Error() != "m.py: --mode=train_eval: training needs optimizer, lr_policy in base_params or train_params" {
			t.Errorf("ModeCheck(train_eval) = %v", err)
		}
	})
	for _, c := range []struct{ name, tail, want string }{
		{"a dict over a value", `train_params = {"max_steps": {"a": 1}}`,
			`m.py:23: train_params: "max_steps" is a dict here but an int in base_params (m.py:10); OpenSeq2Seq refuses the mismatch too`},
		{"eval changes the model", `eval_params = {"decoder_params": {"beam_size": 8}}`,
			"m.py:23: eval_params/decoder_params/beam_size is 8 but training has 2 (m.py:17): gorun uses one model and the training settings in every mode (only data_layer_params and the batch size are per mode); set it in base_params"},
		{"infer adds a setting", `infer_params = {"random_seed": 3}`,
			"m.py:23: infer_params/random_seed is 3 but training has unset: gorun uses one model and the training settings in every mode (only data_layer_params and the batch size are per mode); set it in base_params"},
		{"the same value is fine", `eval_params = {"max_steps": 10, "decoder_params": {"beam_size": 2}}`, ""},
		{"train_params may change the training", `train_params = {"max_steps": 20, "decoder_params": {"beam_size": 3}}`, ""},
		{"vocabularies differ across modes", `eval_params = {"data_layer_params": {"src_vocab_file": "w", "tgt_vocab_file": "w"}}`,
			`m.py:23: eval_params/data_layer_params/src_vocab_file "w" differs from data_layer_params/src_vocab_file "v" (m.py:19): gorun uses one vocabulary in every mode`},
		{"a section that is not a dict", `infer_params = 3`, "m.py:23: infer_params is an int, not a dict"},
		{"unknown key in a section", `train_params = {"data_layer_params": {"sauce_file": "x"}}`, `m.py:23: unknown key "train_params/data_layer_params/sauce_file"`},
		{"use_targets False for inference", `infer_params = {"data_layer_params": {"use_targets": False, "source_file": "s"}}`, ""},
		{"use_targets False for training", `train_params = {"data_layer_params": {"use_targets": False}}`,
			`m.py:23: train_params/data_layer_params/use_targets: False: training and evaluation need targets`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadSource("m.py", []byte(head+c.tail+"\n"), nil)
			c.want = strings.ReplaceAll(c.want, "m.py:23:", fmt.Sprintf("m.py:%d:", strings.Count(head, "\n")+1))
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || err.Error() != c.want {
				t.Errorf("got  %v\nwant %s", err, c.want)
			}
		})
	}
}

// TestLoadRefusals: each key gorun refuses, each shape it cannot run and
// each missing piece is one error naming the line (or the file).
func TestLoadRefusals(t *testing.T) {
	lab := readLab(t)
	cases := []struct {
		name string
		edit func(string) string // from the lab's config
		mark string              // the error's line: the first line containing mark ("" = the file)
		want string              // the message after "lab.py:N: "
	}{
		{"gradient clipping", ins(`"max_grad_norm": 1.0,`), `"max_grad_norm"`, `key "max_grad_norm": gorun does not do gradient clipping yet (remove it to run)`},
		{"LARC", ins(`"larc_params": {"larc_eta": 0.001},`), `"larc_params"`, `key "larc_params": gorun does not do LARC/LARS yet (remove it to run)`},
		{"unknown key", ins(`"batch_size": 8,`), `"batch_size": 8`, `unknown key "batch_size"`},
		{"unknown nested key", repl(`"remove_padding": True,`, `"remove_padding": True, "norm_type": "x",`), `"norm_type"`, `unknown key "encoder_params/norm_type"`},
		{"wrong type", repl(`"max_steps": 300000`, `"max_steps": "300000"`), `"max_steps"`, `key "max_steps": want an int, got '300000'`},
		{"float for an int", repl(`"beam_size": 4`, `"beam_size": 4.0`), `"beam_size"`, `key "decoder_params/beam_size": want an int, got 4.0`},
		{"hooks", ins(`"hooks": [tf.train.StopAtStepHook],`), `"hooks"`, `key "hooks": gorun cannot run Python training hooks (remove them to run)`},
		{"transfer learning", ins(`"load_model": "base-run",`), `"load_model"`, `key "load_model": gorun cannot start from another model's checkpoint (transfer learning) yet (remove it to run)`},
		{"best checkpoint", ins(`"restore_best_checkpoint": True,`), `"restore_best_checkpoint"`, `key "restore_best_checkpoint": gorun keeps no best-model checkpoint (remove it to run)`},
		{"frozen variables", ins(`"freeze_variables_regex": "ForwardPass/transformer_encoder",`), `"freeze_variables_regex"`, `key "freeze_variables_regex": gorun trains every parameter (remove it to run)`},
		{"initializer", ins(`"initializer": tf.glorot_normal_initializer,`), `"initializer"`, `key "initializer": gorun initializes as OpenSeq2Seq's defaults do (Glorot uniform; embeddings N(0, hidden_size^-0.5)); another initializer changes the model (remove it to run)`},
		{"regularizer", repl(`"remove_padding": True,`, `"remove_padding": True, "regularizer": tf.contrib.layers.l2_regularizer,`), `"regularizer"`, `key "encoder_params/regularizer": gorun adds no regularization loss (remove it to run)`},
		{"TensorRT", ins(`"use_trt": True,`), `"use_trt"`, `key "use_trt": gorun has no TensorRT (remove it to run)`},
		{"language-model key", ins(`"lm_vocab_file": "v",`), `"lm_vocab_file"`, `key "lm_vocab_file": belongs to OpenSeq2Seq's language models; the text2text Transformer does not read it`},
		{"loss scaling parameters", ins(`"loss_scaling_params": {"scale_max": 1024.0},`), `"loss_scaling_params"`, `key "loss_scaling_params": gorun's Backoff loss scaler takes no parameters from the config yet (remove them to run)`},
		{"float16", repl(`"dtype": tf.float32,`, `"dtype": tf.float16,`), `"dtype"`, `dtype tf.float16 (weights and optimizer in float16) is not something gorun does; use "mixed" (float16 compute, float32 weights) with "loss_scaling": "Backoff"`},
		{"bfloat16", repl(`"dtype": tf.float32,`, `"dtype": tf.bfloat16,`), `"dtype"`, `dtype tensorflow.bfloat16: want tf.float32, tf.float16 or "mixed" (OpenSeq2Seq's choices)`},
		{"mixed without loss scaling", repl(`"dtype": tf.float32,`, `"dtype": "mixed",`), `"dtype"`, `dtype "mixed" without loss_scaling: OpenSeq2Seq then scales the loss by 1.0 (no scaling), while gorun's mixed precision always scales dynamically; add "loss_scaling": "Backoff" to run`},
		{"LogMax", repl(`"dtype": tf.float32,`, `"dtype": "mixed", "loss_scaling": "LogMax",`), `"dtype"`, `loss_scaling "LogMax": gorun has OpenSeq2Seq's Backoff scaler only (use "Backoff" to run)`},
		{"static loss scale", repl(`"dtype": tf.float32,`, `"dtype": "mixed", "loss_scaling": 512.0,`), `"dtype"`, `loss_scaling 512.0: gorun has no static loss scaling, only OpenSeq2Seq's dynamic Backoff scaler (use "Backoff" to run)`},
		{"unknown scaler", repl(`"dtype": tf.float32,`, `"dtype": "mixed", "loss_scaling": "Dynamic",`), `"dtype"`, `loss_scaling 'Dynamic': want "Backoff" or "LogMax" or a number (OpenSeq2Seq's choices)`},
		{"another optimizer", repl(`tf.contrib.opt.LazyAdamOptimizer`, `"Momentum"`), `"optimizer":`, `optimizer is 'Momentum': gorun has Adam and LazyAdam only (tf.contrib.opt.LazyAdamOptimizer, tf.train.AdamOptimizer or "Adam")`},
		{"another policy", repl(`"lr_policy": transformer_policy,`, `"lr_policy": tf.train.poly_decay,`), `"lr_policy"`, `lr_policy is tensorflow.train.poly_decay: gorun has transformer_policy and fixed_lr only`},
		{"max_lr", repl(`"warmup_steps": 8000,`, `"warmup_steps": 8000, "max_lr": 1e-3,`), `"max_lr"`, `key "lr_policy_params/max_lr": gorun's transformer policy has no max_lr cap yet (remove it to run)`},
		{"missing warmup", repl(`"warmup_steps": 8000,`, ``), `"lr_policy_params"`, `lr_policy_params lacks "warmup_steps" (open_seq2seq.optimizers.lr_policies.transformer_policy requires it)`},
		{"d_model differs", repl(`"d_model": d_model,`, `"d_model": 1024,`), `"d_model": 1024`, `lr_policy_params/d_model 1024 differs from hidden_size 512 (lab.py:@"hidden_size": d_model@): gorun's transformer policy uses the model's d_model`},
		{"epochs and steps", ins(`"num_epochs": 10,`), `"num_epochs"`, `max_steps (lab.py:@"max_steps"@) and num_epochs (lab.py:@"num_epochs"@) are both set; OpenSeq2Seq refuses that too: remove one`},
		{"samples not a multiple of the loss", repl(`"print_samples_steps": 100`, `"print_samples_steps": 150`), `"print_samples_steps"`, `print_samples_steps 150 is not a multiple of print_loss_steps 100; OpenSeq2Seq refuses that too`},
		{"heads do not divide", repl(`"num_heads": 8,`, `"num_heads": 7,`), `"num_heads": 7`, `encoder_params/num_heads: hidden_size 512 is not divisible by num_heads 7`},
		{"hidden sizes differ", replN(`"hidden_size": d_model,`, `"hidden_size": 256,`, 2), `"hidden_size": 256`, `decoder_params/hidden_size 256 differs from encoder_params/hidden_size 512 (lab.py:@"hidden_size": d_model@): the encoder and the decoder share one embedding`},
		{"heads differ", replN(`"num_heads": 8,`, `"num_heads": 16,`, 2), `"num_heads": 16`, `decoder_params/num_heads 16 differs from encoder_params/num_heads 8 (lab.py:@"num_heads": 8@): gorun's Transformer has one num_heads for the encoder and the decoder`},
		{"dropouts differ", replN(`"relu_dropout": dropout,`, `"relu_dropout": 0.3,`, 2), `"relu_dropout": 0.3`, `decoder_params/relu_dropout 0.3 differs from encoder_params/relu_dropout 0.1 (lab.py:@"relu_dropout": dropout@): gorun's Transformer has one relu_dropout for the encoder and the decoder`},
		{"odd size", repl(`d_model = 512`, `d_model = 513`), `"hidden_size": d_model`, `encoder_params/hidden_size: hidden_size 513 is odd; gorun's sinusoidal positions need an even size`},
		{"dropout out of range", repl(`dropout = 0.1`, `dropout = 1.0`), `"attention_dropout": dropout`, `encoder_params/attention_dropout: 1.0 is outside [0.0, 1.0)`},
		{"missing encoder key", repl(`"encoder_layers": num_layers,`, ``), `"encoder_params": {`, `encoder_params lacks "encoder_layers" (OpenSeq2Seq requires it)`},
		{"wrong special id", repl(`"GO_SYMBOL": SpecialTextTokens.S_ID.value`, `"GO_SYMBOL": SpecialTextTokens.UNK_ID.value`), `"GO_SYMBOL"`, `decoder_params/GO_SYMBOL is 3 (open_seq2seq.data.text2text.text2text.SpecialTextTokens.UNK_ID.value): gorun's BOS (<s>) is 2 (its ids are PAD 0, EOS 1, BOS 2, UNK 3, fixed by the vocabulary)`},
		{"unknown special symbol", repl(`"EOS_ID": EOS_ID,`, `"EOS_ID": tf.int32,`), `"EOS_ID"`, `decoder_params/EOS_ID is tensorflow.int32, whose value gorun does not know (write the number: gorun's ids are PAD 0, EOS 1, BOS 2)`},
		{"batch norm", repl(`"remove_padding": True,`, `"remove_padding": True, "norm_params": {"type": "batch_norm"},`), `"norm_params"`, `encoder_params/norm_params/type 'batch_norm': gorun's Transformer uses layer normalization ("layernorm_L2", OpenSeq2Seq's default) only`},
		{"epsilons differ", repl(`"remove_padding": True,`, `"remove_padding": True, "norm_params": {"epsilon": 1e-5},`), `"decoder_params": {`, `decoder_params/norm_params/epsilon is unset (1e-06) but encoder_params' is 1e-05 (lab.py:@"norm_params"@): gorun's Transformer has one layer-norm epsilon`},
		{"another delimiter", repl(`"delimiter": " ",`, `"delimiter": "\t",`), `"delimiter"`, `key "train_params/data_layer_params/delimiter": gorun splits sentences on single spaces only`},
		{"special tokens not in the vocabulary", repl(`"pad_vocab_to_eight": True,`, `"special_tokens_already_in_vocab": False,`), `"special_tokens_already_in_vocab"`, `key "train_params/data_layer_params/special_tokens_already_in_vocab": gorun's vocabulary must list <pad>, </s>, <s>, <unk> as ids 0-3 (special_tokens_already_in_vocab True)`},
		{"two vocabularies", repl(`"tgt_vocab_file": vocab,`, `"tgt_vocab_file": data_root + "de.vocab",`), `de.vocab`, `train_params/data_layer_params/tgt_vocab_file "/data/wmt16_de_en/de.vocab" differs from train_params/data_layer_params/src_vocab_file "/data/wmt16_de_en/m_common.vocab" (lab.py:@"src_vocab_file": vocab@): gorun shares one vocabulary between source and target`},
		{"GNMT", repl(`base_model = Text2Text`, `base_model = BasicText2TextWithAttention`), ``, `cannot read the name BasicText2TextWithAttention: it is not assigned or imported before this line (gorun reads module-level assignments of literals, names and arithmetic; see docs/openseq2seq.md)`},
		{"another model", repl(`base_model = Text2Text`, `base_model = tf.Speech2Text`), `base_model = `, `base_model is tensorflow.Speech2Text: ` + onlyTransformer},
		{"another encoder", repl(`"encoder": TransformerEncoder,`, `"encoder": tf.ConvS2SEncoder,`), `"encoder":`, `encoder is tensorflow.ConvS2SEncoder: ` + onlyTransformer},
		{"another data layer", repl(`"data_layer": ParallelTextDataLayer,`, `"data_layer": tf.TransformerDataLayer,`), `tf.TransformerDataLayer`, `train_params/data_layer is tensorflow.TransformerDataLayer: ` + onlyTransformer},
		{"another loss", repl(`"loss": PaddedCrossEntropyLossWithSmoothing,`, `"loss": tf.BasicSequenceLoss,`), `"loss":`, `loss is tensorflow.BasicSequenceLoss: ` + onlyTransformer},
		{"no base_params", repl(`base_params = {`, `other = {`), "", `base_params is missing (an OpenSeq2Seq config defines base_params = {...})`},
		{"base_params not a dict", func(s string) string { return s + "\nbase_params = [1]\n" }, "base_params = [1]", `base_params is a list, not a dict`},
		{"no base_model", repl(`base_model = Text2Text`, ``), "", `base_model is missing (the text2text Transformer's config sets base_model = Text2Text)`},
		{"no batch size", repl(`"batch_size_per_gpu": 128,`, ``), "", `base_params has no batch_size_per_gpu (OpenSeq2Seq requires it)`},
		{"no encoder", repl(`"encoder": TransformerEncoder,`, ``), "", `base_params has no "encoder" (` + onlyTransformer + `)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := c.edit(lab)
			if src == lab {
				t.Fatal("the edit changed nothing")
			}
			_, err := LoadSource("lab.py", []byte(src), nil)
			c.want = regexp.MustCompile(`@([^@]+)@`).ReplaceAllStringFunc(c.want, func(m string) string {
				return fmt.Sprint(lineOf(t, src, m[1:len(m)-1]))
			})
			want := "lab.py: " + c.want
			if c.mark != "" {
				want = fmt.Sprintf("lab.py:%d: %s", lineOf(t, src, c.mark), c.want)
			}
			if c.name == "GNMT" {
				want = fmt.Sprintf("lab.py:%d: %s", lineOf(t, src, "base_model ="), c.want)
			}
			if err == nil || err.Error() != want {
				t.Errorf("got  %v\nwant %s", err, want)
			}
		})
	}
}

func ins(line string) func(string) string {
	return func(s string) string {
		return strings.Replace(s, "    \"max_steps\": 300000,\n", "    \"max_steps\": 300000,\n    "+line+"\n", 1)
	}
}

func repl(old, new string) func(string) string { return replN(old, new, 1) }

func replN(old, new string, n int) func(string) string {
	return func(s string) string {
		if n == 2 { // the decoder's copy: the second occurrence
			i := strings.Index(s, old)
			j := strings.Index(s[i+len(old):], old)
			if j < 0 {
				return s
			}
			j += i + len(old)
			return s[:j] + new + s[j+len(old):]
		}
		return strings.Replace(s, old, new, n)
	}
}

func TestModeCheck(t *testing.T) {
	c, err := Load("testdata/lab-transformer-base.py", nil)
	if err != nil {
		t.Fatal(err)
	}
	for mode, want := range map[string]string{
		"interactive_infer": "--mode=interactive_infer: gorun has no interactive inference (run.py refuses it too)",
		"predict":           "--mode=predict: want train, eval, train_eval or infer",
	} {
		if err := c.ModeCheck(mode); err == nil || err.Error() != want {
			t.Errorf("%s: %v", mode, err)
		}
	}
	noEval := *c
	noEval.Eval = DataLayer{section: "eval_params"}
	if err := noEval.ModeCheck("train_eval"); err == nil || err.Error() != "testdata/lab-transformer-base.py: --mode=train_eval: eval_params has no data layer" {
		t.Errorf("train_eval without eval data: %v", err)
	}
	if err := noEval.ModeCheck("train"); err != nil {
		t.Errorf("train without eval data: %v", err)
	}
	noSteps := *c
	noSteps.MaxSteps = 0
	if err := noSteps.ModeCheck("train"); err == nil || !strings.Contains(err.Error(), "training needs max_steps or num_epochs") {
		t.Errorf("train without steps: %v", err)
	}
	if err := noSteps.ModeCheck("eval"); err != nil {
		t.Errorf("eval without steps: %v", err)
	}
}

// TestKeysDocumented: docs/openseq2seq.md lists every key Load knows.
func TestKeysDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../../../docs/openseq2seq.md")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("`([A-Za-z0-9_/]+)`").FindAllStringSubmatch(string(doc), -1) {
		listed[m[1]] = true
	}
	for _, k := range knownKeys() {
		if !listed[k] {
			t.Errorf("docs/openseq2seq.md does not list `%s`", k)
		}
	}
}

// knownKeys lists every key Load knows, '/'-joined, sorted.
func knownKeys() []string {
	var out []string
	var walk func(prefix string, rules map[string]*rule)
	walk = func(prefix string, rules map[string]*rule) {
		for k, r := range rules {
			out = append(out, prefix+k)
			if r.sub != nil {
				walk(prefix+k+"/", r.sub)
			}
		}
	}
	walk("", modelRules)
	sort.Strings(out)
	return out
}
