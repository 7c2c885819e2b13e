// Package transformer is the Transformer translation model of the lab
// (OpenSeq2Seq's transformer-base semantics) written against
// kernels.Backend: presets, parameters in one flat buffer, forward and
// backward written out layer by layer, label-smoothed loss, LazyAdam/Adam,
// learning-rate policies, greedy and beam decoding, and checkpoints.
package transformer

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Special token ids (the lab's SentencePiece ids).
const (
	PAD int32 = 0
	EOS int32 = 1
	BOS int32 = 2
	UNK int32 = 3
)

// Config is the architecture and the regularisation of a model.
type Config struct {
	Preset         string  `json:"preset"`
	Vocab          int     `json:"vocab_size"`
	DModel         int     `json:"d_model"`
	Heads          int     `json:"num_heads"`
	FFN            int     `json:"filter_size"`
	EncLayers      int     `json:"encoder_layers"`
	DecLayers      int     `json:"decoder_layers"`
	AttnDropout    float32 `json:"attention_dropout"`
	ReLUDropout    float32 `json:"relu_dropout"`
	PostDropout    float32 `json:"layer_postprocess_dropout"`
	LabelSmoothing float32 `json:"label_smoothing"`
	LNEps          float32 `json:"layer_norm_epsilon"`
}

var presets = map[string]Config{
	"tiny":  {DModel: 64, Heads: 4, FFN: 256, EncLayers: 2, DecLayers: 2, AttnDropout: 0.1, ReLUDropout: 0.1, PostDropout: 0.1, LabelSmoothing: 0.1},
	"small": {DModel: 256, Heads: 4, FFN: 1024, EncLayers: 3, DecLayers: 3, AttnDropout: 0.1, ReLUDropout: 0.1, PostDropout: 0.1, LabelSmoothing: 0.1},
	"base":  {DModel: 512, Heads: 8, FFN: 2048, EncLayers: 6, DecLayers: 6, AttnDropout: 0.1, ReLUDropout: 0.1, PostDropout: 0.1, LabelSmoothing: 0.1},
	"big":   {DModel: 1024, Heads: 16, FFN: 4096, EncLayers: 6, DecLayers: 6, AttnDropout: 0.3, ReLUDropout: 0.3, PostDropout: 0.3, LabelSmoothing: 0.1},
}

// Presets lists the preset names.
func Presets() []string {
	var n []string
	for k := range presets {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Preset returns the named configuration for a vocabulary of vocab ids.
func Preset(name string, vocab int) (Config, error) {
	c, ok := presets[name]
	if !ok {
		names := Presets() // by size, as --preset's help lists them
		sort.SliceStable(names, func(i, j int) bool { return presets[names[i]].DModel < presets[names[j]].DModel })
		return Config{}, fmt.Errorf("unknown preset %q: --preset takes %s or %s", name, strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
	}
	c.Preset = name
	c.Vocab = vocab
	c.LNEps = 1e-6
	return c, c.Validate()
}

// Validate checks that the dimensions are consistent.
func (c Config) Validate() error {
	switch {
	case c.Vocab < 4:
		return fmt.Errorf("transformer: vocabulary of %d ids is too small (PAD, EOS, BOS, UNK take 0-3)", c.Vocab)
	case c.DModel < 2 || c.DModel%2 != 0:
		return fmt.Errorf("transformer: d_model %d must be even and >= 2", c.DModel)
	case c.Heads < 1 || c.DModel%c.Heads != 0:
		return fmt.Errorf("transformer: d_model %d is not divisible by %d heads", c.DModel, c.Heads)
	case c.FFN < 1 || c.EncLayers < 1 || c.DecLayers < 1:
		return fmt.Errorf("transformer: filter size and layer counts must be positive")
	case c.LabelSmoothing < 0 || c.LabelSmoothing >= 1:
		return fmt.Errorf("transformer: label smoothing %g outside [0, 1)", c.LabelSmoothing)
	}
	for _, p := range []float32{c.AttnDropout, c.ReLUDropout, c.PostDropout} {
		if p < 0 || p >= 1 {
			return fmt.Errorf("transformer: dropout %g outside [0, 1)", p)
		}
	}
	return nil
}

// NoDropout returns c with every dropout rate set to 0.
func (c Config) NoDropout() Config {
	c.AttnDropout, c.ReLUDropout, c.PostDropout = 0, 0, 0
	return c
}

// SmoothedEntropy is the entropy (nats) of the label-smoothed target
// distribution: -(conf*log(conf) + (V-1)*low*log(low)) with conf = 1-ls and
// low = ls/(V-1). OpenSeq2Seq subtracts it from the cross entropy, so that a
// perfect model has loss 0; it is 1.3648 nats for V = 32768, ls = 0.1.
func SmoothedEntropy(vocab int, ls float64) float64 {
	if ls <= 0 || vocab < 2 {
		return 0
	}
	conf := 1 - ls
	low := ls / float64(vocab-1)
	return -(conf*math.Log(conf) + float64(vocab-1)*low*math.Log(low+1e-20))
}
