package openseq2seq

import (
	"fmt"
	"os"
	"sort"
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
