package openseq2seq

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Config is a text2text Transformer config of OpenSeq2Seq as gorun runs it.
// The model and training fields come from the training config: train_params
// nested-updated over base_params (after the command line's overrides), as
// OpenSeq2Seq builds its training model.
type Config struct {
	Path      string
	Logdir    string // base_params logdir; a relative path stays relative (to where the job starts), as in OpenSeq2Seq
	LogdirPos Pos

	BatchSizePerGPU int // training: sentence pairs per GPU (rank) per step
	MaxSteps        int // 0 if unset
	NumEpochs       int // 0 if unset; OpenSeq2Seq refuses max_steps and num_epochs together, and so does Load

	// How often, in steps; 0 = unset or None (OpenSeq2Seq: None disables).
	SaveSummariesSteps, PrintLossSteps, PrintSamplesSteps, EvalSteps, SaveCheckpointSteps int
	NumCheckpoints                                                                        int // checkpoints kept (num_checkpoints, OpenSeq2Seq's default 5)

	IterSize int // gradient accumulation (iter_size), 1 if unset

	Dtype       string // "float32" or "mixed" (tf.float16, all-fp16 training, is refused)
	LossScaling string // "" (float32) or "Backoff" (mixed); LogMax, static scales and mixed without loss_scaling are refused

	Optimizer             string // "LazyAdam" (tf.contrib.opt.LazyAdamOptimizer) or "Adam" (tf.train.AdamOptimizer, "Adam")
	Beta1, Beta2, Epsilon float64

	LRPolicy     string // "transformer" (transformer_policy) or "constant" (fixed_lr); "" if unset
	LearningRate float64
	WarmupSteps  int // transformer
	LRDModel     int // transformer; equals Encoder.Hidden

	Encoder, Decoder  Layers
	LayerNormEpsilon  float64 // norm_params epsilon, 1e-6 if unset (OpenSeq2Seq's default, gorun's too)
	BeamSize          int
	Alpha             float64
	ExtraDecodeLength int

	LabelSmoothing float64 // loss_params label_smoothing, 0 if unset (OpenSeq2Seq's default)

	RandomSeed    int
	RandomSeedSet bool

	// The data layers of the three modes: train_params, eval_params and
	// infer_params each nested-updated over base_params.
	Train, Eval, Infer DataLayer

	Ignored   []Note         // keys accepted without effect, with the reason (for a log line)
	Positions map[string]Pos // flattened key ("encoder_params/hidden_size", "train_params/data_layer_params/source_file") -> where it was set

	hasLoss bool
}

// Layers is the shape of the encoder or the decoder.
type Layers struct {
	Layers, Hidden, Heads, Filter                     int
	AttentionDropout, ReluDropout, PostprocessDropout float64
}

// DataLayer is ParallelTextDataLayer's settings for one mode.
type DataLayer struct {
	// Present: the mode's config has a data layer (its *_params dict
	// exists, or base_params holds data_layer_params, which OpenSeq2Seq
	// then uses for every mode).
	Present         bool
	BatchSizePerGPU int // sentence pairs; eval and infer use eval_batch_size_per_gpu when set, as OpenSeq2Seq
	SourceFile      string
	TargetFile      string
	VocabFile       string // src_vocab_file, which must equal tgt_vocab_file
	MaxLength       int
	Shuffle, Repeat bool
	// StartToken: OpenSeq2Seq starts every source and target with <s>
	// (use_start_token, true unless set to False); gorun's data does not
	// (a Note says so).
	StartToken bool

	section          string // "train_params", ...
	srcVocab, tgtVoc bool
}

// Note is a key that gorun accepts without effect.
type Note struct {
	Pos      Pos
	Key, Why string
}

func (n Note) String() string { return fmt.Sprintf("%s: %s: %s", n.Pos, n.Key, n.Why) }

// gorun's special ids (transformer.PAD, EOS, BOS).
const (
	padID = 0
	eosID = 1
	bosID = 2
)

// Load reads an OpenSeq2Seq config file, applies run.py-style overrides
// ("--key=value", "--a/b=value", or "--key" "value") to base_params, and
// checks every key: used, ignored (listed in Ignored) or refused (an error
// naming the file and line).
func Load(path string, overrides []string) (*Config, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return LoadSource(path, src, overrides)
}

// LoadSource is Load on a config's text; path names it in positions.
func LoadSource(path string, src []byte, overrides []string) (*Config, error) {
	m, err := Parse(path, src)
	if err != nil {
		return nil, err
	}
	ld := &loader{file: path, c: &Config{Path: path, Positions: map[string]Pos{}}, seen: map[string]bool{}}
	if err := ld.load(m, overrides); err != nil {
		return nil, err
	}
	return ld.c, nil
}

type loader struct {
	file string
	c    *Config
	seen map[string]bool // notes already listed
}

func (ld *loader) errAt(p Pos, format string, a ...any) error {
	return &Error{Pos: p, Msg: fmt.Sprintf(format, a...)}
}

func (ld *loader) note(it *Item, path, why string) {
	key := qualified(it, path)
	if ld.seen[string(it.KeyPos)+"\x00"+key] {
		return
	}
	ld.seen[string(it.KeyPos)+"\x00"+key] = true
	ld.c.Ignored = append(ld.c.Ignored, Note{Pos: it.KeyPos, Key: key, Why: why})
}

// qualified names a merged entry with the *_params dict it came from.
func qualified(it *Item, path string) string {
	if it.origin != "" {
		return it.origin + "/" + path
	}
	return path
}

var sections = []string{"train_params", "eval_params", "infer_params"}

func (ld *loader) load(m *Module, overrides []string) error {
	base := m.Get("base_params")
	if base == nil {
		return &Error{Pos: Pos(ld.file), Msg: "base_params is missing (an OpenSeq2Seq config defines base_params = {...})"}
	}
	if base.Kind != Dict {
		return ld.errAt(base.Pos, "base_params is %s, not a dict", base.Kind.a())
	}
	bm := m.Get("base_model")
	if bm == nil {
		if it := base.Get("base_model"); it != nil {
			return ld.errAt(it.KeyPos, "base_model inside base_params is the layout of early OpenSeq2Seq versions; gorun reads the module-level base_model = Text2Text of later ones")
		}
		return &Error{Pos: Pos(ld.file), Msg: "base_model is missing (the text2text Transformer's config sets base_model = Text2Text)"}
	}
	if !symbolIs(bm, "Text2Text") {
		return ld.errAt(bm.Pos, "base_model is %s: %s", bm, onlyTransformer)
	}
	ld.c.Positions["base_model"] = bm.Pos
	base = clone(base)
	if err := ld.override(base, overrides); err != nil {
		return err
	}
	record(ld.c.Positions, "", base)

	merged := map[string]*Value{}
	for _, s := range sections {
		mv := clone(base)
		if sv := m.Get(s); sv != nil {
			if sv.Kind != Dict {
				return ld.errAt(sv.Pos, "%s is %s, not a dict", s, sv.Kind.a())
			}
			sv = clone(sv)
			markOrigin(sv, s)
			record(ld.c.Positions, s+"/", sv)
			if err := ld.nestedUpdate(mv, sv, s); err != nil {
				return err
			}
		}
		merged[s] = mv
	}
	// The model family first: a GNMT config gets one line, not a list of
	// unknown keys.
	for _, s := range sections {
		if err := ld.family(merged[s]); err != nil {
			return err
		}
	}
	for _, s := range sections {
		if err := ld.choices(merged[s]); err != nil {
			return err
		}
	}
	for _, s := range sections {
		if err := ld.walk(merged[s], modelRules, ""); err != nil {
			return err
		}
	}
	if err := ld.model(merged["train_params"]); err != nil {
		return err
	}
	for _, s := range sections[1:] {
		if sv := m.Get(s); sv != nil {
			if err := ld.sameAsTraining(s, sv, merged["train_params"]); err != nil {
				return err
			}
		}
	}
	dls := []*DataLayer{&ld.c.Train, &ld.c.Eval, &ld.c.Infer}
	for i, s := range sections {
		if err := ld.dataLayer(dls[i], s, merged[s]); err != nil {
			return err
		}
	}
	if err := ld.oneVocabulary(merged); err != nil {
		return err
	}
	sort.SliceStable(ld.c.Ignored, func(i, j int) bool { return posLine(ld.c.Ignored[i].Pos) < posLine(ld.c.Ignored[j].Pos) })
	return nil
}

const onlyTransformer = "gorun runs the text2text Transformer only (base_model Text2Text, encoder TransformerEncoder, decoder TransformerDecoder, loss PaddedCrossEntropyLossWithSmoothing, data_layer ParallelTextDataLayer)"

// symbolIs reports whether v is an imported name whose last part is name.
func symbolIs(v *Value, name string) bool {
	if v == nil || v.Kind != Symbol {
		return false
	}
	return v.Str == name || strings.HasSuffix(v.Str, "."+name)
}

func (ld *loader) family(cfg *Value) error {
	for _, f := range []struct{ key, want string }{
		{"encoder", "TransformerEncoder"}, {"decoder", "TransformerDecoder"},
		{"loss", "PaddedCrossEntropyLossWithSmoothing"}, {"data_layer", "ParallelTextDataLayer"},
	} {
		it := cfg.Get(f.key)
		if it == nil {
			if f.key == "encoder" || f.key == "decoder" {
				return &Error{Pos: Pos(ld.file), Msg: fmt.Sprintf("base_params has no %q (%s)", f.key, onlyTransformer)}
			}
			continue
		}
		if !symbolIs(it.Value, f.want) {
			return ld.errAt(it.KeyPos, "%s is %s: %s", qualified(it, f.key), it.Value, onlyTransformer)
		}
	}
	return nil
}

// ---------------------------------------------------------------------------
// Values

func clone(v *Value) *Value {
	c := *v
	if v.Items != nil {
		c.Items = make([]*Value, len(v.Items))
		for i, it := range v.Items {
			c.Items[i] = clone(it)
		}
	}
	if v.Dict != nil {
		c.Dict = make([]*Item, len(v.Dict))
		for i, it := range v.Dict {
			c.Dict[i] = &Item{Key: it.Key, KeyPos: it.KeyPos, Value: clone(it.Value), origin: it.origin}
		}
	}
	return &c
}

func markOrigin(v *Value, origin string) {
	for _, it := range v.Dict {
		it.origin = origin
		if it.Value.Kind == Dict {
			markOrigin(it.Value, origin)
		}
	}
}

func record(pos map[string]Pos, prefix string, d *Value) {
	for _, it := range d.Dict {
		pos[prefix+it.Key] = it.KeyPos
		if it.Value.Kind == Dict {
			record(pos, prefix+it.Key+"/", it.Value)
		}
	}
}

// nestedUpdate is OpenSeq2Seq's nested_update: dicts merge recursively,
// other values replace.
func (ld *loader) nestedUpdate(org, upd *Value, section string) error {
	for _, u := range upd.Dict {
		o := org.Get(u.Key)
		if u.Value.Kind == Dict && o != nil {
			if o.Value.Kind != Dict {
				return ld.errAt(u.KeyPos, "%s: %q is a dict here but %s in base_params (%s); OpenSeq2Seq refuses the mismatch too", section, u.Key, o.Value.Kind.a(), o.KeyPos)
			}
			if err := ld.nestedUpdate(o.Value, u.Value, section); err != nil {
				return err
			}
			continue
		}
		if o != nil {
			o.Value, o.KeyPos, o.origin = u.Value, u.KeyPos, u.origin
		} else {
			org.Dict = append(org.Dict, u)
		}
	}
	return nil
}

// ---------------------------------------------------------------------------
// Overrides (run.py's second argparse parser)

type leaf struct {
	path string
	it   *Item
}

// flatten lists base_params' entries as OpenSeq2Seq's flatten_dict does:
// nested dicts joined with '/'; only ints, floats, strings and bools can be
// overridden.
func flatten(prefix string, d *Value, all *[]leaf) {
	for _, it := range d.Dict {
		*all = append(*all, leaf{prefix + it.Key, it})
		if it.Value.Kind == Dict {
			flatten(prefix+it.Key+"/", it.Value, all)
		}
	}
}

// cmdPos is the position of a command-line argument (quoted when it has
// spaces or characters that would break the one-line message).
func cmdPos(arg string) Pos {
	q := strconv.Quote(arg)
	if q[1:len(q)-1] != arg || strings.ContainsAny(arg, " ") {
		arg = q
	}
	return Pos("command line " + arg)
}

func overridable(k Kind) bool { return k == Int || k == Float || k == Str || k == Bool }

// isNegNumber is argparse's test for an argument that looks like a negative
// number (and so is a value, not an option).
func isNegNumber(s string) bool {
	// argparse: '^-\d+$|^-\d*\.\d+$'
	if len(s) < 2 || s[0] != '-' {
		return false
	}
	intPart, frac, dot := strings.Cut(s[1:], ".")
	digits := func(t string) bool {
		for i := 0; i < len(t); i++ {
			if t[i] < '0' || t[i] > '9' {
				return false
			}
		}
		return true
	}
	if !dot {
		return digits(intPart)
	}
	return digits(intPart) && frac != "" && digits(frac)
}

func (ld *loader) override(base *Value, args []string) error {
	var leaves []leaf
	flatten("", base, &leaves)
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") || a == "--" || strings.HasPrefix(a, "--=") {
			return &Error{Pos: cmdPos(a), Msg: "unrecognized argument (run.py takes --KEY=VALUE for an entry of base_params)"}
		}
		key, val, hasVal := strings.Cut(a[2:], "=")
		if !hasVal {
			if i+1 < len(args) && (!strings.HasPrefix(args[i+1], "-") || isNegNumber(args[i+1])) {
				i++
				val = args[i]
				a = a + "=" + val
			} else {
				return &Error{Pos: cmdPos(a), Msg: "expected one argument (run.py reads --KEY=VALUE or --KEY VALUE; a bool takes True or False)"}
			}
		}
		pos := cmdPos(a)
		var match []leaf
		for _, l := range leaves {
			if l.path == key {
				match = []leaf{l}
				break
			}
			if strings.HasPrefix(l.path, key) && overridable(l.it.Value.Kind) {
				match = append(match, l) // argparse takes a unique prefix
			}
		}
		if len(match) > 1 {
			var names []string
			for _, l := range match {
				names = append(names, "--"+l.path)
			}
			return &Error{Pos: pos, Msg: fmt.Sprintf("ambiguous option: --%s could match %s (as run.py's argparse says)", key, strings.Join(names, ", "))}
		}
		if len(match) == 0 {
			return &Error{Pos: pos, Msg: fmt.Sprintf("unknown key %q: run.py overrides entries of base_params (nested keys joined with '/', e.g. lr_policy_params/learning_rate) that hold a number, a string or True/False", key)}
		}
		l := match[0]
		old := l.it.Value
		if old.Kind == Dict {
			return &Error{Pos: pos, Msg: fmt.Sprintf("key %q is a dict (%s): override one of its entries, --%s/KEY=VALUE", l.path, l.it.KeyPos, l.path)}
		}
		if !overridable(old.Kind) {
			return &Error{Pos: pos, Msg: fmt.Sprintf("key %q holds %s (%s), which run.py does not override from the command line: only numbers, strings and True/False", l.path, old, l.it.KeyPos)}
		}
		nv := &Value{Kind: old.Kind, Pos: pos}
		switch old.Kind {
		case Int:
			n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			if err != nil {
				return &Error{Pos: pos, Msg: fmt.Sprintf("%q is not an int (%s is %s at %s)", val, l.path, old, l.it.KeyPos)}
			}
			nv.Int = n
		case Float:
			t := strings.TrimSpace(val)
			f, err := strconv.ParseFloat(t, 64)
			if err != nil && !math.IsInf(f, 0) || strings.ContainsAny(t, "xX_") {
				return &Error{Pos: pos, Msg: fmt.Sprintf("%q is not a float (%s is %s at %s)", val, l.path, old, l.it.KeyPos)}
			}
			nv.Float = f
		case Str:
			nv.Str = val
		case Bool:
			switch strings.TrimSpace(val) {
			case "True":
				nv.Bool = true
			case "False":
			default:
				return &Error{Pos: pos, Msg: fmt.Sprintf("%q: want True or False (run.py reads bools with ast.literal_eval)", val)}
			}
		}
		l.it.Value, l.it.KeyPos = nv, pos
	}
	return nil
}

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

// ---------------------------------------------------------------------------
// The model and training settings (from the training config)

// get returns the entry at a '/'-joined path.
func get(d *Value, path string) *Item {
	var it *Item
	for _, p := range strings.Split(path, "/") {
		if d == nil {
			return nil
		}
		it = d.Get(p)
		if it == nil {
			return nil
		}
		d = it.Value
	}
	return it
}

type reader struct {
	ld  *loader
	cfg *Value
	err error
}

func (r *reader) fail(it *Item, path, format string, a ...any) {
	if r.err == nil {
		r.err = r.ld.errAt(it.KeyPos, "%s: %s", qualified(it, path), fmt.Sprintf(format, a...))
	}
}

// int reads an int key, reporting whether it is set; min is the least value.
func (r *reader) int(path string, min int64) (int, bool) {
	it := get(r.cfg, path)
	if it == nil || it.Value.Kind == None {
		return 0, false
	}
	v := it.Value.Int
	if v < min {
		r.fail(it, path, "%d is less than %d", v, min)
		return 0, false
	}
	if v > math.MaxInt32 {
		r.fail(it, path, "%d is too large", v)
		return 0, false
	}
	return int(v), true
}

func (r *reader) float(path string, lo, hi float64, hiOpen bool) (float64, bool) {
	it := get(r.cfg, path)
	if it == nil || it.Value.Kind == None {
		return 0, false
	}
	f, _ := it.Value.Number()
	if math.IsNaN(f) || f < lo || f > hi || hiOpen && f == hi {
		closeB := "]"
		if hiOpen {
			closeB = ")"
		}
		r.fail(it, path, "%s is outside [%s, %s%s", it.Value, formatFloat(lo), formatFloat(hi), closeB)
		return 0, false
	}
	return f, true
}

// need reads a required int of an encoder or decoder.
func (r *reader) need(section, key string, min int64) int {
	sec := get(r.cfg, section)
	if get(r.cfg, section+"/"+key) == nil {
		if r.err == nil {
			if sec == nil {
				r.err = &Error{Pos: Pos(r.ld.file), Msg: fmt.Sprintf("base_params has no %s (the Transformer needs %s and the rest of its shape)", section, key)}
			} else {
				r.err = r.ld.errAt(sec.KeyPos, "%s lacks %q (OpenSeq2Seq requires it)", qualified(sec, section), key)
			}
		}
		return 0
	}
	v, _ := r.int(section+"/"+key, min)
	return v
}

func (r *reader) needFloat(section, key string, lo, hi float64, hiOpen bool) float64 {
	if get(r.cfg, section+"/"+key) == nil {
		r.need(section, key, 0)
		return 0
	}
	v, _ := r.float(section+"/"+key, lo, hi, hiOpen)
	return v
}

func (r *reader) layers(section, layersKey string) Layers {
	return Layers{
		Layers:             r.need(section, layersKey, 1),
		Hidden:             r.need(section, "hidden_size", 2),
		Heads:              r.need(section, "num_heads", 1),
		Filter:             r.need(section, "filter_size", 1),
		AttentionDropout:   r.needFloat(section, "attention_dropout", 0, 1, true),
		ReluDropout:        r.needFloat(section, "relu_dropout", 0, 1, true),
		PostprocessDropout: r.needFloat(section, "layer_postprocess_dropout", 0, 1, true),
	}
}

// specialIDs are the values of OpenSeq2Seq's special-token symbols.
var specialIDs = map[string]int64{
	"tokenizer.PAD_ID":                      0,
	"tokenizer.EOS_ID":                      1,
	"SpecialTextTokens.PAD_ID.value":        0,
	"SpecialTextTokens.EOS_ID.value":        1,
	"SpecialTextTokens.S_ID.value":          2,
	"SpecialTextTokens.UNK_ID.value":        3,
	"SpecialTextTokens.OUT_OF_BUCKET.value": 1234567890,
	"SpecialTextTokens.END_OF_CHOICE.value": -100,
}

func symbolID(v *Value) (int64, bool) {
	if v.Kind == Int {
		return v.Int, true
	}
	for k, id := range specialIDs {
		if strings.HasSuffix(v.Str, "."+k) {
			return id, true
		}
	}
	return 0, false
}

func (ld *loader) model(cfg *Value) error {
	c := ld.c
	r := &reader{ld: ld, cfg: cfg}

	if it := get(cfg, "logdir"); it != nil {
		c.Logdir, c.LogdirPos = it.Value.Str, it.KeyPos
	}
	if get(cfg, "batch_size_per_gpu") == nil {
		return &Error{Pos: Pos(ld.file), Msg: "base_params has no batch_size_per_gpu (OpenSeq2Seq requires it)"}
	}
	c.BatchSizePerGPU, _ = r.int("batch_size_per_gpu", 1)
	c.MaxSteps, _ = r.int("max_steps", 1)
	c.NumEpochs, _ = r.int("num_epochs", 1)
	if ms, ne := get(cfg, "max_steps"), get(cfg, "num_epochs"); ms != nil && ne != nil {
		later := ne
		if posLine(ms.KeyPos) > posLine(ne.KeyPos) {
			later = ms
		}
		return ld.errAt(later.KeyPos, "max_steps (%s) and num_epochs (%s) are both set; OpenSeq2Seq refuses that too: remove one", ms.KeyPos, ne.KeyPos)
	}
	c.SaveSummariesSteps, _ = r.int("save_summaries_steps", 1)
	c.PrintLossSteps, _ = r.int("print_loss_steps", 1)
	c.PrintSamplesSteps, _ = r.int("print_samples_steps", 1)
	c.EvalSteps, _ = r.int("eval_steps", 1)
	c.SaveCheckpointSteps, _ = r.int("save_checkpoint_steps", 1)
	if r.err == nil && c.PrintSamplesSteps > 0 && c.PrintLossSteps > 0 && c.PrintSamplesSteps%c.PrintLossSteps != 0 {
		it := get(cfg, "print_samples_steps")
		return ld.errAt(it.KeyPos, "print_samples_steps %d is not a multiple of print_loss_steps %d; OpenSeq2Seq refuses that too", c.PrintSamplesSteps, c.PrintLossSteps)
	}
	c.NumCheckpoints = 5
	if n, ok := r.int("num_checkpoints", 1); ok {
		c.NumCheckpoints = n
	}
	c.IterSize = 1
	if n, ok := r.int("iter_size", 1); ok {
		c.IterSize = n
	}
	if n, ok := r.int("random_seed", 0); ok { // numpy, which OpenSeq2Seq seeds too, refuses negative seeds
		c.RandomSeed, c.RandomSeedSet = n, true
	}
	if r.err != nil {
		return r.err
	}

	// Precision
	c.Dtype = "float32"
	dtype := get(cfg, "dtype")
	if dtype != nil {
		switch v := dtype.Value; {
		case symbolIs(v, "float32") && strings.HasPrefix(v.Str, "tensorflow."):
		case v.Kind == Str && v.Str == "mixed":
			c.Dtype = "mixed"
		case symbolIs(v, "float16") && strings.HasPrefix(v.Str, "tensorflow."):
			return ld.errAt(dtype.KeyPos, "dtype tf.float16 (weights and optimizer in float16) is not something gorun does; use \"mixed\" (float16 compute, float32 weights) with \"loss_scaling\": \"Backoff\"")
		default:
			return ld.errAt(dtype.KeyPos, "dtype %s: want tf.float32, tf.float16 or \"mixed\" (OpenSeq2Seq's choices)", v)
		}
	}
	ls := get(cfg, "loss_scaling")
	switch {
	case ls != nil && c.Dtype != "mixed":
		if ls.Value.Kind == Str && !strings.EqualFold(strings.TrimSpace(ls.Value.Str), "backoff") && !strings.EqualFold(strings.TrimSpace(ls.Value.Str), "logmax") {
			return ld.errAt(ls.KeyPos, "loss_scaling %s: want \"Backoff\" or \"LogMax\" or a number (OpenSeq2Seq's choices)", ls.Value)
		}
		ld.note(ls, "loss_scaling", "used only with dtype \"mixed\", as in OpenSeq2Seq")
	case ls == nil && c.Dtype == "mixed":
		return ld.errAt(dtype.KeyPos, "dtype \"mixed\" without loss_scaling: OpenSeq2Seq then scales the loss by 1.0 (no scaling), while gorun's mixed precision always scales dynamically; add \"loss_scaling\": \"Backoff\" to run")
	case ls != nil:
		v := ls.Value
		switch {
		case v.Kind == Str && strings.EqualFold(strings.TrimSpace(v.Str), "backoff"):
			c.LossScaling = "Backoff"
		case v.Kind == Str && strings.EqualFold(strings.TrimSpace(v.Str), "logmax"):
			return ld.errAt(ls.KeyPos, "loss_scaling \"LogMax\": gorun has OpenSeq2Seq's Backoff scaler only (use \"Backoff\" to run)")
		case v.Kind == Str:
			return ld.errAt(ls.KeyPos, "loss_scaling %s: want \"Backoff\" or \"LogMax\" or a number (OpenSeq2Seq's choices)", v)
		default:
			return ld.errAt(ls.KeyPos, "loss_scaling %s: gorun has no static loss scaling, only OpenSeq2Seq's dynamic Backoff scaler (use \"Backoff\" to run)", v)
		}
	}

	// Optimizer
	c.Optimizer, _ = optimizerOf(cfg)
	// TensorFlow's defaults when optimizer_params leaves them out.
	c.Beta1, c.Beta2, c.Epsilon = 0.9, 0.999, 1e-8
	if f, ok := r.float("optimizer_params/beta1", 0, 1, true); ok {
		c.Beta1 = f
	}
	if f, ok := r.float("optimizer_params/beta2", 0, 1, true); ok {
		c.Beta2 = f
	}
	if f, ok := r.float("optimizer_params/epsilon", 0, math.MaxFloat64, false); ok {
		c.Epsilon = f
	}
	if r.err != nil {
		return r.err
	}

	// Model shape
	c.Encoder = r.layers("encoder_params", "encoder_layers")
	c.Decoder = r.layers("decoder_params", "num_hidden_layers")
	c.BeamSize = r.need("decoder_params", "beam_size", 1)
	c.Alpha = r.needFloat("decoder_params", "alpha", 0, math.MaxFloat64, false)
	c.ExtraDecodeLength = r.need("decoder_params", "extra_decode_length", 0)
	if r.err != nil {
		return r.err
	}
	if err := ld.shape(cfg); err != nil {
		return err
	}
	if err := ld.special(cfg); err != nil {
		return err
	}
	if err := ld.norms(cfg); err != nil {
		return err
	}
	for _, s := range []string{"encoder_params/dtype", "decoder_params/dtype"} {
		if it := get(cfg, s); it != nil {
			want := "tensorflow.float32"
			if c.Dtype == "mixed" {
				want = "mixed"
			}
			if it.Value.Str != want {
				return ld.errAt(it.KeyPos, "%s %s differs from the model's dtype: gorun runs the whole model in one precision (remove it to run)", qualified(it, s), it.Value)
			}
			ld.note(it, s, "the model's dtype")
		}
	}

	// Learning rate
	if it := get(cfg, "lr_policy"); it != nil {
		c.LRPolicy, _ = policyOf(cfg)
		lrp := get(cfg, "lr_policy_params")
		if lrp == nil {
			return ld.errAt(it.KeyPos, "lr_policy without lr_policy_params: %s needs learning_rate%s", it.Value, map[bool]string{true: ", warmup_steps and d_model"}[c.LRPolicy == "transformer"])
		}
		if c.LRPolicy == "constant" {
			for _, k := range lrp.Value.Dict {
				if k.Key != "learning_rate" {
					return ld.errAt(k.KeyPos, "lr_policy_params/%s: fixed_lr takes learning_rate only", k.Key)
				}
			}
		}
		need := []string{"learning_rate"}
		if c.LRPolicy == "transformer" {
			need = append(need, "warmup_steps", "d_model")
		}
		for _, k := range need {
			if lrp.Value.Get(k) == nil {
				return ld.errAt(lrp.KeyPos, "lr_policy_params lacks %q (%s requires it)", k, it.Value)
			}
		}
		lr, _ := r.float("lr_policy_params/learning_rate", 0, math.MaxFloat64, false)
		if r.err == nil && lr == 0 {
			r.fail(get(cfg, "lr_policy_params/learning_rate"), "lr_policy_params/learning_rate", "must be positive")
		}
		c.LearningRate = lr
		if c.LRPolicy == "transformer" {
			c.WarmupSteps, _ = r.int("lr_policy_params/warmup_steps", 1)
			c.LRDModel, _ = r.int("lr_policy_params/d_model", 1)
			if r.err == nil && c.LRDModel != c.Encoder.Hidden {
				dm := get(cfg, "lr_policy_params/d_model")
				return ld.errAt(dm.KeyPos, "lr_policy_params/d_model %d differs from hidden_size %d (%s): gorun's transformer policy uses the model's d_model", c.LRDModel, c.Encoder.Hidden, get(cfg, "encoder_params/hidden_size").KeyPos)
			}
		}
		if r.err != nil {
			return r.err
		}
	}

	// Loss
	c.hasLoss = get(cfg, "loss") != nil
	if f, ok := r.float("loss_params/label_smoothing", 0, 1, true); ok {
		c.LabelSmoothing = f
	}
	return r.err
}

// choices refuses an optimizer or a learning-rate policy gorun does not
// have before their parameters are checked.
func (ld *loader) choices(cfg *Value) error {
	if _, err := optimizerOf(cfg); err != nil {
		return err
	}
	_, err := policyOf(cfg)
	return err
}

func optimizerOf(cfg *Value) (string, error) {
	it := get(cfg, "optimizer")
	if it == nil {
		return "", nil
	}
	v := it.Value
	switch {
	case symbolIs(v, "LazyAdamOptimizer") && strings.HasPrefix(v.Str, "tensorflow."):
		return "LazyAdam", nil
	case symbolIs(v, "AdamOptimizer") && strings.HasPrefix(v.Str, "tensorflow."), v.Kind == Str && v.Str == "Adam":
		return "Adam", nil
	}
	return "", &Error{Pos: it.KeyPos, Msg: fmt.Sprintf("%s is %s: gorun has Adam and LazyAdam only (tf.contrib.opt.LazyAdamOptimizer, tf.train.AdamOptimizer or \"Adam\")", qualified(it, "optimizer"), v)}
}

func policyOf(cfg *Value) (string, error) {
	it := get(cfg, "lr_policy")
	if it == nil {
		return "", nil
	}
	switch {
	case symbolIs(it.Value, "transformer_policy"):
		return "transformer", nil
	case symbolIs(it.Value, "fixed_lr"):
		return "constant", nil
	}
	return "", &Error{Pos: it.KeyPos, Msg: fmt.Sprintf("%s is %s: gorun has transformer_policy and fixed_lr only", qualified(it, "lr_policy"), it.Value)}
}

func posLine(p Pos) int {
	s := string(p)
	n, err := strconv.Atoi(s[strings.LastIndexByte(s, ':')+1:])
	if err != nil {
		return math.MaxInt
	}
	return n
}

// shape checks what gorun's Transformer can run: one embedding shared by
// the encoder and the decoder, one number of heads, one filter size and
// one set of dropouts for both.
func (ld *loader) shape(cfg *Value) error {
	c := ld.c
	e, d := c.Encoder, c.Decoder
	for _, s := range []struct {
		sec string
		l   Layers
	}{{"encoder_params", e}, {"decoder_params", d}} {
		if s.l.Hidden%2 != 0 {
			it := get(cfg, s.sec+"/hidden_size")
			return ld.errAt(it.KeyPos, "%s: hidden_size %d is odd; gorun's sinusoidal positions need an even size", qualified(it, s.sec+"/hidden_size"), s.l.Hidden)
		}
		if s.l.Hidden%s.l.Heads != 0 {
			it := get(cfg, s.sec+"/num_heads")
			return ld.errAt(it.KeyPos, "%s: hidden_size %d is not divisible by num_heads %d", qualified(it, s.sec+"/num_heads"), s.l.Hidden, s.l.Heads)
		}
	}
	same := []struct {
		key  string
		a, b float64
		why  string
	}{
		{"hidden_size", float64(e.Hidden), float64(d.Hidden), "the encoder and the decoder share one embedding"},
		{"num_heads", float64(e.Heads), float64(d.Heads), "gorun's Transformer has one num_heads for the encoder and the decoder"},
		{"filter_size", float64(e.Filter), float64(d.Filter), "gorun's Transformer has one filter_size for the encoder and the decoder"},
		{"attention_dropout", e.AttentionDropout, d.AttentionDropout, "gorun's Transformer has one attention_dropout for the encoder and the decoder"},
		{"relu_dropout", e.ReluDropout, d.ReluDropout, "gorun's Transformer has one relu_dropout for the encoder and the decoder"},
		{"layer_postprocess_dropout", e.PostprocessDropout, d.PostprocessDropout, "gorun's Transformer has one layer_postprocess_dropout for the encoder and the decoder"},
	}
	for _, s := range same {
		if s.a != s.b {
			di, ei := get(cfg, "decoder_params/"+s.key), get(cfg, "encoder_params/"+s.key)
			return ld.errAt(di.KeyPos, "decoder_params/%s %s differs from encoder_params/%s %s (%s): %s", s.key, di.Value, s.key, ei.Value, ei.KeyPos, s.why)
		}
	}
	return nil
}

// special checks the decoder's special ids against gorun's.
func (ld *loader) special(cfg *Value) error {
	for _, s := range []struct {
		key  string
		want int64
		name string
	}{{"EOS_ID", eosID, "EOS"}, {"END_SYMBOL", eosID, "EOS"}, {"GO_SYMBOL", bosID, "BOS (<s>)"}, {"PAD_SYMBOL", padID, "PAD"}} {
		it := get(cfg, "decoder_params/"+s.key)
		if it == nil {
			continue
		}
		id, ok := symbolID(it.Value)
		if !ok {
			return ld.errAt(it.KeyPos, "decoder_params/%s is %s, whose value gorun does not know (write the number: gorun's ids are PAD 0, EOS 1, BOS 2)", s.key, it.Value)
		}
		if id != s.want {
			return ld.errAt(it.KeyPos, "decoder_params/%s is %d (%s): gorun's %s is %d (its ids are PAD 0, EOS 1, BOS 2, UNK 3, fixed by the vocabulary)", s.key, id, it.Value, s.name, s.want)
		}
		ld.note(it, "decoder_params/"+s.key, fmt.Sprintf("%s equals gorun's %s id %d", it.Value, s.name, s.want))
	}
	return nil
}

// norms reads norm_params: layer normalization (layernorm_L2) only, one
// epsilon for the whole model.
func (ld *loader) norms(cfg *Value) error {
	ld.c.LayerNormEpsilon = 1e-6
	var from *Item
	for _, sec := range []string{"encoder_params", "decoder_params"} {
		if it := get(cfg, sec+"/norm_params/type"); it != nil && it.Value.Str != "layernorm_L2" {
			return ld.errAt(it.KeyPos, "%s/norm_params/type %s: gorun's Transformer uses layer normalization (\"layernorm_L2\", OpenSeq2Seq's default) only", sec, it.Value)
		}
		if it := get(cfg, sec+"/norm_params/type"); it != nil {
			ld.note(it, sec+"/norm_params/type", "layernorm_L2, the default")
		}
		it := get(cfg, sec+"/norm_params/epsilon")
		eps := 1e-6
		if it != nil {
			eps, _ = it.Value.Number()
			if !(eps > 0) || math.IsInf(eps, 0) {
				return ld.errAt(it.KeyPos, "%s/norm_params/epsilon %s must be positive", sec, it.Value)
			}
		}
		if from == nil {
			ld.c.LayerNormEpsilon = eps
			from = it
			if from == nil {
				from = &Item{KeyPos: "the default 1e-6"}
			}
			continue
		}
		if eps != ld.c.LayerNormEpsilon {
			if it == nil {
				return ld.errAt(get(cfg, sec).KeyPos, "%s/norm_params/epsilon is unset (%s) but encoder_params' is %s (%s): gorun's Transformer has one layer-norm epsilon", sec, formatFloat(eps), formatFloat(ld.c.LayerNormEpsilon), from.KeyPos)
			}
			return ld.errAt(it.KeyPos, "%s/norm_params/epsilon %s differs from encoder_params' %s (%s): gorun's Transformer has one layer-norm epsilon", sec, formatFloat(eps), formatFloat(ld.c.LayerNormEpsilon), from.KeyPos)
		}
	}
	return nil
}

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
