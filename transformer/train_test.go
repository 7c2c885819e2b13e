package transformer

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
)

// toyPairs makes n sentence pairs: a random source of 3-8 ids in [4, 4+k)
// and, as its translation, the source reversed with every id shifted by one
// (mod k), each ending with EOS.
func toyPairs(n, k int, seed uint64) (src, tgt [][]int32) {
	r := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i < n; i++ {
		l := 3 + r.IntN(6)
		s := make([]int32, l)
		t := make([]int32, l)
		for j := range s {
			s[j] = int32(4 + r.IntN(k))
		}
		for j := range s {
			t[l-1-j] = 4 + (s[j]-4+1)%int32(k)
		}
		src = append(src, append(s, EOS))
		tgt = append(tgt, append(t, EOS))
	}
	return
}

// pad builds a Batch from ragged sentences.
func pad(src, tgt [][]int32) *Batch {
	b, err := PadBatch(src, tgt)
	if err != nil {
		panic(err)
	}
	return b
}

func trainToy(t *testing.T, steps int) (*Model, [][]int32, [][]int32, Loss) {
	t.Helper()
	src, tgt := toyPairs(32, 12, 7)
	cfg, err := Preset("tiny", 16)
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.NoDropout()
	m, err := New(cfg, cpu.New(), 11)
	if err != nil {
		t.Fatal(err)
	}
	opt := NewLazyAdam(m)
	lr := InverseSqrt{LearningRate: 3e-3, Warmup: 30}
	b := pad(src, tgt)
	var l Loss
	for s := 0; s < steps; s++ {
		if l, err = m.Forward(b, true); err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(nil); err != nil {
			t.Fatal(err)
		}
		if err := opt.Step(m, lr.LR(s), nil); err != nil {
			t.Fatal(err)
		}
	}
	return m, src, tgt, l
}

func TestOverfitAndDecode(t *testing.T) {
	m, src, tgt, l := trainToy(t, 250)
	ev, err := m.Forward(pad(src, tgt), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after 250 steps: train loss raw %.4f lab %.4f; eval raw %.4f lab %.4f", l.Raw, l.Lab, ev.Raw, ev.Lab)
	if ev.Lab > 0.05 {
		t.Fatalf("tiny model did not memorise 32 pairs: lab loss %.4f (raw %.4f)", ev.Lab, ev.Raw)
	}
	greedy, err := m.Translate(src, DecodeOptions{Beam: 1, MaxExtra: 50})
	if err != nil {
		t.Fatal(err)
	}
	for i := range src {
		if want := tgt[i][:len(tgt[i])-1]; !slices.Equal(greedy[i], want) {
			t.Errorf("pair %d: greedy %v, want %v", i, greedy[i], want)
		}
	}
	// The beam-search code path with beam 1 and no length penalty finds
	// the greedy output. (On an arbitrary model it need not: like
	// tensor2tensor's, it keeps an EOS-ending hypothesis found in the top
	// 2*beam candidates, which greedy decoding never considers.)
	b1, err := m.translateBeam(src, 1, 0, 50)
	if err != nil {
		t.Fatal(err)
	}
	for i := range src {
		if !slices.Equal(b1[i], greedy[i]) {
			t.Errorf("pair %d: beam search with beam 1 %v, greedy %v", i, b1[i], greedy[i])
		}
	}
	beam, err := m.Translate(src, DefaultDecode)
	if err != nil {
		t.Fatal(err)
	}
	for i := range src {
		if want := tgt[i][:len(tgt[i])-1]; !slices.Equal(beam[i], want) {
			t.Errorf("pair %d: beam %v, want %v", i, beam[i], want)
		}
	}
}

func TestDecodeConsistency(t *testing.T) {
	// An untrained model: outputs are arbitrary, which makes ties unlikely
	// and sequences long.
	cfg, _ := Preset("tiny", 40)
	m, err := New(cfg, cpu.New(), 5)
	if err != nil {
		t.Fatal(err)
	}
	src, _ := toyPairs(6, 30, 3)
	opts := DecodeOptions{Beam: 1, MaxExtra: 6}
	greedy, err := m.Translate(src, opts)
	if err != nil {
		t.Fatal(err)
	}
	bs1 := make([][]int32, len(src))
	for i := range src {
		out, _ := m.Translate(src[i:i+1], opts)
		bs1[i] = out[0]
	}
	for i := range src {
		if len(greedy[i]) > len(src[i])+6 {
			t.Fatalf("output %d longer than input+max: %d", i, len(greedy[i]))
		}
		if !slices.Equal(greedy[i], bs1[i]) {
			t.Fatalf("batched greedy %v != one-by-one %v", greedy[i], bs1[i])
		}
	}
	// beam 4: batched equals one by one
	b4, _ := m.Translate(src, DecodeOptions{Beam: 4, Alpha: 0.6, MaxExtra: 6})
	for i := range src {
		one, _ := m.Translate(src[i:i+1], DecodeOptions{Beam: 4, Alpha: 0.6, MaxExtra: 6})
		if !slices.Equal(b4[i], one[0]) {
			t.Fatalf("batched beam %v != one-by-one %v", b4[i], one[0])
		}
	}
	// incremental decoding agrees with the full teacher-forced pass: the
	// greedy tokens are the argmax of the full forward pass's logits.
	for i := range src {
		tg := append(append([]int32(nil), greedy[i]...), EOS)
		if _, err := m.Forward(pad(src[i:i+1], [][]int32{tg}), false); err != nil {
			t.Fatal(err)
		}
		V := m.Cfg.Vocab
		lg := m.logits.T.F32
		for p, want := range greedy[i] {
			row := lg[p*V : (p+1)*V]
			best := 0
			for j, v := range row {
				if v > row[best] {
					best = j
				}
			}
			if int32(best) != want {
				t.Fatalf("sentence %d position %d: full pass argmax %d, incremental %d", i, p, best, want)
			}
		}
	}
}

// translateBeam runs the beam-search code path even for beam 1 (tests).
func (m *Model) translateBeam(src [][]int32, beam int, alpha float64, extra int) ([][]int32, error) {
	return m.Translate(src, DecodeOptions{Beam: beam, Alpha: alpha, MaxExtra: extra, forceBeam: true})
}
