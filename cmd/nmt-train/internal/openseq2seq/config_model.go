package openseq2seq

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

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
