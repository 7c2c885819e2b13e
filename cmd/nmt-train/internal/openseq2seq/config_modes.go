package openseq2seq

import (
	"fmt"
	"strings"
)

// ---------------------------------------------------------------------------
// The modes: each mode's data layer, and what run.py's --mode needs.

// sameAsTraining refuses eval_params or infer_params entries that change
// what gorun takes from the training config: gorun has one model and one
// set of settings for every mode; only the data layer and the batch size
// are per mode.
func (ld *loader) sameAsTraining(section string, sv *Value, train *Value) error {
	var leaves []leaf
	flatten("", sv, &leaves)
	for _, l := range leaves {
		if l.it.Value.Kind == Dict {
			continue
		}
		switch {
		case l.path == "batch_size_per_gpu", l.path == "eval_batch_size_per_gpu", l.path == "data_layer",
			strings.HasPrefix(l.path, "data_layer_params/"):
			continue
		}
		if r := ruleFor(l.path); r != nil && r.decide != nil {
			if t, _ := r.decide(l.it.Value); t == tIgnore {
				continue
			}
		}
		tv := get(train, l.path)
		if tv != nil && tv.Value.String() == l.it.Value.String() {
			continue
		}
		was := "unset"
		if tv != nil {
			was = tv.Value.String() + " (" + string(tv.KeyPos) + ")"
		}
		return ld.errAt(l.it.KeyPos, "%s/%s is %s but training has %s: gorun uses one model and the training settings in every mode (only data_layer_params and the batch size are per mode); set it in base_params", section, l.path, l.it.Value, was)
	}
	return nil
}

func (ld *loader) dataLayer(dl *DataLayer, section string, cfg *Value) error {
	dl.section = section
	p := get(cfg, "data_layer_params")
	dl.Present = p != nil
	r := &reader{ld: ld, cfg: cfg}
	if section == "train_params" {
		dl.BatchSizePerGPU, _ = r.int("batch_size_per_gpu", 1)
	} else if n, ok := r.int("eval_batch_size_per_gpu", 1); ok {
		dl.BatchSizePerGPU = n
	} else {
		dl.BatchSizePerGPU, _ = r.int("batch_size_per_gpu", 1)
	}
	if !dl.Present {
		return r.err
	}
	if get(cfg, "data_layer") == nil {
		return ld.errAt(p.KeyPos, "%s has data_layer_params but no data_layer (ParallelTextDataLayer)", qualified(p, "data_layer_params"))
	}
	str := func(k string) (string, *Item) {
		it := get(cfg, "data_layer_params/"+k)
		if it == nil {
			return "", nil
		}
		return it.Value.Str, it
	}
	dl.SourceFile, _ = str("source_file")
	dl.TargetFile, _ = str("target_file")
	src, si := str("src_vocab_file")
	tgt, ti := str("tgt_vocab_file")
	dl.srcVocab, dl.tgtVoc = si != nil, ti != nil
	if si != nil && ti != nil && src != tgt {
		return ld.errAt(ti.KeyPos, "%s %q differs from %s %q (%s): gorun shares one vocabulary between source and target", qualified(ti, "data_layer_params/tgt_vocab_file"), tgt, qualified(si, "data_layer_params/src_vocab_file"), src, si.KeyPos)
	}
	dl.VocabFile = src
	if si == nil {
		dl.VocabFile = tgt
	}
	dl.MaxLength, _ = r.int("data_layer_params/max_length", 2)
	if it := get(cfg, "data_layer_params/shuffle"); it != nil {
		dl.Shuffle = it.Value.Bool
	}
	if it := get(cfg, "data_layer_params/repeat"); it != nil {
		dl.Repeat = it.Value.Bool
	}
	dl.StartToken = true
	st := get(cfg, "data_layer_params/use_start_token")
	if st != nil {
		dl.StartToken = st.Value.Bool
	}
	if dl.StartToken {
		at := st
		if at == nil {
			at = p
		}
		ld.note(at, "data_layer_params/use_start_token", "OpenSeq2Seq starts every source and target sentence with <s> (id 2) unless use_start_token is False; gorun does not (docs/openseq2seq.md, Differences)")
	}
	if it := get(cfg, "data_layer_params/use_targets"); it != nil {
		if !it.Value.Bool && section != "infer_params" {
			return ld.errAt(it.KeyPos, "%s: False: training and evaluation need targets", qualified(it, "data_layer_params/use_targets"))
		}
		ld.note(it, "data_layer_params/use_targets", map[bool]string{true: "True, the default", false: "inference reads no targets"}[it.Value.Bool])
	}
	return r.err
}

// oneVocabulary checks that every mode reads the same vocabulary file.
func (ld *loader) oneVocabulary(merged map[string]*Value) error {
	var first *Item
	for _, s := range sections {
		it := get(merged[s], "data_layer_params/src_vocab_file")
		if it == nil {
			continue
		}
		if first == nil {
			first = it
			continue
		}
		if it.Value.Str != first.Value.Str {
			return ld.errAt(it.KeyPos, "%s %q differs from %s %q (%s): gorun uses one vocabulary in every mode", qualified(it, "data_layer_params/src_vocab_file"), it.Value.Str, qualified(first, "data_layer_params/src_vocab_file"), first.Value.Str, first.KeyPos)
		}
	}
	return nil
}

// ModeCheck says what run.py's --mode needs from the config: train and
// train_eval the training data, train_eval and eval the evaluation data,
// infer the inference source file.
func (c *Config) ModeCheck(mode string) error {
	var need []*DataLayer
	switch mode {
	case "train":
		need = []*DataLayer{&c.Train}
	case "train_eval":
		need = []*DataLayer{&c.Train, &c.Eval}
	case "eval":
		need = []*DataLayer{&c.Eval}
	case "infer":
		need = []*DataLayer{&c.Infer}
	case "interactive_infer":
		return fmt.Errorf("--mode=interactive_infer: gorun has no interactive inference (run.py refuses it too)")
	default:
		return fmt.Errorf("--mode=%s: want train, eval, train_eval or infer", mode)
	}
	fail := func(format string, a ...any) error {
		return &Error{Pos: Pos(c.Path), Msg: fmt.Sprintf("--mode=%s: ", mode) + fmt.Sprintf(format, a...)}
	}
	if mode == "train" || mode == "train_eval" {
		var missing []string
		if c.MaxSteps == 0 && c.NumEpochs == 0 {
			missing = append(missing, "max_steps or num_epochs")
		}
		if c.Optimizer == "" {
			missing = append(missing, "optimizer")
		}
		if c.LRPolicy == "" {
			missing = append(missing, "lr_policy")
		}
		if len(missing) > 0 {
			return fail("training needs %s in base_params or train_params", strings.Join(missing, ", "))
		}
	}
	if mode != "infer" && !c.hasLoss {
		return fail("training and evaluation need loss (PaddedCrossEntropyLossWithSmoothing) in base_params")
	}
	for _, dl := range need {
		var missing []string
		if dl.SourceFile == "" {
			missing = append(missing, "source_file")
		}
		if dl.TargetFile == "" && dl.section != "infer_params" {
			missing = append(missing, "target_file")
		}
		if !dl.srcVocab {
			missing = append(missing, "src_vocab_file")
		}
		if !dl.tgtVoc {
			missing = append(missing, "tgt_vocab_file")
		}
		if dl.MaxLength == 0 {
			missing = append(missing, "max_length")
		}
		if len(missing) > 0 {
			what := "has no data layer"
			if dl.Present {
				what = "lacks data_layer_params " + strings.Join(missing, ", ")
			}
			return fail("%s %s", dl.section, what)
		}
	}
	return nil
}
