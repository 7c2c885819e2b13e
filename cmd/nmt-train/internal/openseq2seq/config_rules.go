package openseq2seq

import (
	"strings"
)

// ---------------------------------------------------------------------------
// Keys: each is used, ignored (with a reason) or refused (with a reason).

type treatment int

const (
	tUse treatment = iota
	tIgnore
	tRefuse
)

type rule struct {
	kinds  []Kind           // accepted kinds; nil: any
	sub    map[string]*rule // keys of a dict
	decide func(v *Value) (treatment, string)
}

func use(k ...Kind) *rule { return &rule{kinds: k} }

func ign(why string, k ...Kind) *rule {
	return &rule{kinds: k, decide: func(*Value) (treatment, string) { return tIgnore, why }}
}

func ref(why string) *rule {
	return &rule{decide: func(*Value) (treatment, string) { return tRefuse, why }}
}

// ignIf ignores a value ok accepts and refuses the others.
func ignIf(ok func(*Value) bool, ignWhy, refWhy string, k ...Kind) *rule {
	return &rule{kinds: k, decide: func(v *Value) (treatment, string) {
		if ok(v) {
			return tIgnore, ignWhy
		}
		return tRefuse, refWhy
	}}
}

func isNone(v *Value) bool  { return v.Kind == None }
func isFalse(v *Value) bool { return v.Kind == Bool && !v.Bool }
func isTrue(v *Value) bool  { return v.Kind == Bool && v.Bool }

var (
	kInt     = []Kind{Int}
	kNum     = []Kind{Int, Float}
	kStr     = []Kind{Str}
	kBool    = []Kind{Bool}
	kIntNone = []Kind{Int, None}
)

const (
	whyTRT       = "TensorRT settings, used only with use_trt"
	whyBatchNorm = "used by norm_params type batch_norm only"
	whySetByO2S  = "OpenSeq2Seq overwrites it (from the vocabulary file and batch_size_per_gpu)"
	whyPad8      = "pads to a multiple of 8, which changes nothing when the vocabulary already is one (the lab's 32768 is); gorun does not pad"
	whyTFData    = "tf.data's parallelism; gorun's reader has its own"
)

var initRules = map[string]*rule{
	"regularizer":        ignIf(isNone, "None: no regularizer", "gorun adds no regularization loss (remove it to run)"),
	"regularizer_params": ign("no effect without a regularizer", Dict),
	"initializer":        ignIf(isNone, "None: the default initializer", "gorun initializes as OpenSeq2Seq's defaults do (Glorot uniform; embeddings N(0, hidden_size^-0.5)); another initializer changes the model (remove it to run)"),
	"initializer_params": ign("no effect without an initializer", Dict),
}

var normRules = map[string]*rule{
	"type":               use(Str),
	"epsilon":            use(kNum...),
	"momentum":           ign(whyBatchNorm, kNum...),
	"center_scale":       ign(whyBatchNorm, kBool...),
	"regularizer":        ign(whyBatchNorm),
	"regularizer_params": ign(whyBatchNorm, Dict),
}

func withInit(m map[string]*rule) map[string]*rule {
	for k, r := range initRules {
		m[k] = r
	}
	m["norm_params"] = &rule{kinds: []Kind{Dict}, sub: normRules}
	m["dtype"] = use(Symbol, Str) // must equal the model's (model())
	return m
}

var encoderRules = withInit(map[string]*rule{
	"encoder_layers":            use(kInt...),
	"hidden_size":               use(kInt...),
	"num_heads":                 use(kInt...),
	"filter_size":               use(kInt...),
	"attention_dropout":         use(kNum...),
	"relu_dropout":              use(kNum...),
	"layer_postprocess_dropout": use(kNum...),
	"remove_padding":            ign("a speed-up of OpenSeq2Seq's encoder that does not change its result; gorun masks padded positions", kBool...),
	"pad_embeddings_2_eight":    ign(whyPad8, kBool...),
	"src_vocab_size":            ign(whySetByO2S, kInt...),
})

var decoderRules = withInit(map[string]*rule{
	"num_hidden_layers":         use(kInt...),
	"hidden_size":               use(kInt...),
	"num_heads":                 use(kInt...),
	"filter_size":               use(kInt...),
	"attention_dropout":         use(kNum...),
	"relu_dropout":              use(kNum...),
	"layer_postprocess_dropout": use(kNum...),
	"beam_size":                 use(kInt...),
	"alpha":                     use(kNum...),
	"extra_decode_length":       use(kInt...),
	"EOS_ID":                    use(Int, Symbol), // checked against gorun's ids (model())
	"END_SYMBOL":                use(Int, Symbol),
	"GO_SYMBOL":                 use(Int, Symbol),
	"PAD_SYMBOL":                use(Int, Symbol),
	"batch_size":                ign(whySetByO2S, kInt...),
	"tgt_vocab_size":            ign(whySetByO2S, kInt...),
})

var dataRules = map[string]*rule{
	"source_file":          use(kStr...),
	"target_file":          use(kStr...),
	"src_vocab_file":       use(kStr...),
	"tgt_vocab_file":       use(kStr...),
	"max_length":           use(kInt...),
	"shuffle":              use(kBool...),
	"repeat":               use(kBool...),
	"use_start_token":      use(kBool...),
	"use_targets":          use(kBool...), // False only for inference (dataLayer())
	"delimiter":            ignIf(func(v *Value) bool { return v.Str == " " }, "gorun splits sentences on spaces too", "gorun splits sentences on single spaces only", kStr...),
	"map_parallel_calls":   ign(whyTFData, kInt...),
	"prefetch_buffer_size": ign(whyTFData, kInt...),
	"shuffle_buffer_size":  ign("gorun shuffles the whole corpus every epoch (OpenSeq2Seq shuffles within a window of this many pairs)", kInt...),
	"pad_lengths_to_eight": ign("pads batches to lengths that are multiples of 8 with PAD, which the model masks", kBool...),
	"pad_vocab_to_eight":   ign(whyPad8, kBool...),
	"special_tokens_already_in_vocab": ignIf(isTrue, "gorun's vocabulary lists <pad>, </s>, <s>, <unk> as ids 0-3, as the lab's does",
		"gorun's vocabulary must list <pad>, </s>, <s>, <unk> as ids 0-3 (special_tokens_already_in_vocab True)", kBool...),
	"batch_size":  ign(whySetByO2S, kInt...),
	"mode":        ign("OpenSeq2Seq sets it from --mode", kStr...),
	"interactive": ign("OpenSeq2Seq sets it for interactive inference", kBool...),
	"dtype":       ign("ParallelTextDataLayer does not use it"),
}

var modelRules = map[string]*rule{
	"use_horovod":             ign("gorun always runs data-parallel ranks, as Horovod does; the ranks come from gorun (-np, the hostfile)", kBool...),
	"num_gpus":                ign("the number of ranks comes from gorun (-np, the hostfile); OpenSeq2Seq ignores it under Horovod too", kInt...),
	"gpu_ids":                 ign("each rank uses one GPU, chosen by gorun (CUDA_VISIBLE_DEVICES, --device)", List),
	"batch_size_per_gpu":      use(kInt...),
	"eval_batch_size_per_gpu": use(kInt...),
	"data_layer":              use(Symbol),
	"data_layer_params":       {kinds: []Kind{Dict}, sub: dataRules},
	"logdir":                  use(kStr...),
	"load_model": ignIf(func(v *Value) bool { return v.Kind == None || v.Kind == Str && v.Str == "" }, "empty: no base model",
		"gorun cannot start from another model's checkpoint (transfer learning) yet (remove it to run)", Str, None),
	"save_summaries_steps":    use(kIntNone...),
	"print_loss_steps":        use(kIntNone...),
	"print_samples_steps":     use(kIntNone...),
	"save_checkpoint_steps":   use(kIntNone...),
	"eval_steps":              use(kInt...),
	"num_checkpoints":         use(kInt...),
	"print_bench_info_steps":  ign("gorun reports throughput on every loss line", kIntNone...),
	"restore_best_checkpoint": ignIf(isFalse, "False: the latest checkpoint", "gorun keeps no best-model checkpoint (remove it to run)", kBool...),
	"finetune":                ign("OpenSeq2Seq reads it but nothing uses it", kBool...),
	"hooks": ignIf(func(v *Value) bool { return len(v.Items) == 0 }, "empty",
		"gorun cannot run Python training hooks (remove them to run)", List),
	"random_seed":                  use(kInt...),
	"num_epochs":                   use(kInt...),
	"max_steps":                    use(kInt...),
	"bench_start":                  ign("benchmark timing: gorun's metrics time every step", kInt...),
	"optimizer":                    use(Symbol, Str),
	"optimizer_params":             {kinds: []Kind{Dict}, sub: optimizerRules},
	"freeze_variables_regex":       ignIf(isNone, "None: every variable trains", "gorun trains every parameter (remove it to run)", Str, None),
	"initializer":                  initRules["initializer"],
	"initializer_params":           initRules["initializer_params"],
	"regularizer":                  initRules["regularizer"],
	"regularizer_params":           initRules["regularizer_params"],
	"dtype":                        use(Symbol, Str),
	"lr_policy":                    use(Symbol),
	"lr_policy_params":             {kinds: []Kind{Dict}, sub: lrRules},
	"max_grad_norm":                ref("gorun does not do gradient clipping yet (remove it to run)"),
	"larc_params":                  ref("gorun does not do LARC/LARS yet (remove it to run)"),
	"loss_scaling":                 use(Str, Int, Float),
	"loss_scaling_params":          ref("gorun's Backoff loss scaler takes no parameters from the config yet (remove them to run)"),
	"summaries":                    ign("gorun writes its own TensorBoard scalars (loss, learning rate, loss scale, throughput)", List),
	"iter_size":                    use(kInt...),
	"lm_vocab_file":                ref("belongs to OpenSeq2Seq's language models; the text2text Transformer does not read it"),
	"processed_data_folder":        ref("belongs to OpenSeq2Seq's speech and language-model data layers; the text2text Transformer does not read it"),
	"use_trt":                      ignIf(isFalse, "False", "gorun has no TensorRT (remove it to run)", kBool...),
	"trt_precision_mode":           ign(whyTRT),
	"trt_max_workspace_size_bytes": ign(whyTRT),
	"trt_minimum_segment_size":     ign(whyTRT),
	"trt_is_dynamic_op":            ign(whyTRT),
	"trt_maximum_cached_engines":   ign(whyTRT),
	"use_xla_jit":                  ign("XLA is TensorFlow's compiler; gorun runs its own kernels", kBool...),
	"encoder":                      use(Symbol),
	"encoder_params":               {kinds: []Kind{Dict}, sub: encoderRules},
	"decoder":                      use(Symbol),
	"decoder_params":               {kinds: []Kind{Dict}, sub: decoderRules},
	"loss":                         use(Symbol),
	"loss_params":                  {kinds: []Kind{Dict}, sub: lossRules},
	"bpe_used":                     ign("how OpenSeq2Seq's BLEU joins BPE pieces; gorun's BLEU detokenizes with the SentencePiece vocabulary", kBool...),
	"eval_using_bleu":              ign("gorun's evaluation always reports BLEU", kBool...),
}

var optimizerRules = map[string]*rule{
	"beta1":       use(kNum...),
	"beta2":       use(kNum...),
	"epsilon":     use(kNum...),
	"use_locking": ign("TensorFlow's variable locking", kBool...),
	"name":        ign("a TensorFlow name scope", kStr...),
}

var lrRules = map[string]*rule{
	"learning_rate": use(kNum...),
	"warmup_steps":  use(kInt...),
	"d_model":       use(kInt...), // must equal hidden_size (model())
	"max_lr":        ignIf(isNone, "None: no cap", "gorun's transformer policy has no max_lr cap yet (remove it to run)", Int, Float, None),
	"coefficient": ignIf(func(v *Value) bool { f, _ := v.Number(); return f == 1 }, "1.0, the default",
		"gorun's transformer policy has no coefficient; fold it into learning_rate (remove it to run)", kNum...),
	"dtype": ign("the precision of the schedule's arithmetic; gorun computes it in float64", Symbol),
}

var lossRules = map[string]*rule{
	"label_smoothing":        use(kNum...),
	"pad_embeddings_2_eight": ign(whyPad8, kBool...),
	"batch_size":             ign(whySetByO2S, kInt...),
	"tgt_vocab_size":         ign(whySetByO2S, kInt...),
	"dtype": ignIf(func(v *Value) bool { return symbolIs(v, "float32") }, "tf.float32: the loss in float32, as gorun computes it",
		"gorun computes the loss in float32 (remove it to run)", Symbol),
}

func kindList(ks []Kind) string {
	var s []string
	for _, k := range ks {
		s = append(s, k.a())
	}
	return strings.Join(s, " or ")
}

// walk checks every key of d against rules.
func (ld *loader) walk(d *Value, rules map[string]*rule, prefix string) error {
	for _, it := range d.Dict {
		path := prefix + it.Key
		r, ok := rules[it.Key]
		if !ok {
			return ld.errAt(it.KeyPos, "unknown key %q", qualified(it, path))
		}
		if r.kinds != nil && !kindIn(it.Value.Kind, r.kinds) {
			return ld.errAt(it.KeyPos, "key %q: want %s, got %s", qualified(it, path), kindList(r.kinds), it.Value)
		}
		if r.decide != nil {
			t, why := r.decide(it.Value)
			switch t {
			case tIgnore:
				ld.note(it, path, why)
			case tRefuse:
				return ld.errAt(it.KeyPos, "key %q: %s", qualified(it, path), why)
			}
		}
		if r.sub != nil {
			if err := ld.walk(it.Value, r.sub, path+"/"); err != nil {
				return err
			}
		}
	}
	return nil
}

func kindIn(k Kind, ks []Kind) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

// ruleFor returns the rule of a flattened key path.
func ruleFor(path string) *rule {
	rules := modelRules
	var r *rule
	for _, p := range strings.Split(path, "/") {
		if rules == nil {
			return nil
		}
		r = rules[p]
		if r == nil {
			return nil
		}
		rules = r.sub
	}
	return r
}
