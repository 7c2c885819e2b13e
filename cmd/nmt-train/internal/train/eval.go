package train

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/report"
	"github.com/gorun/gorun/transformer"
)

// evaluate computes the validation loss (all validation sentences, split
// over the ranks) and BLEU (the first --eval-sentences, translated in
// parallel by all ranks), and logs them on rank 0.
func (t *Trainer) evaluate(ctx context.Context) error {
	t0 := time.Now()
	end := t.tl.Begin("eval", "loss+bleu")
	defer end()
	valid := t.data.Valid
	N, r := t.id.Size, t.id.Rank
	// Loss over this rank's share, in batches of at most BatchTokens/2
	// tokens, or of EvalBatchPairs pairs.
	var n, raw, lab float64
	var src, tgt [][]int32
	toks := 0
	flush := func() error {
		if len(src) == 0 {
			return nil
		}
		b, err := transformer.PadBatch(src, tgt)
		if err != nil {
			return err
		}
		l, err := t.m.Forward(b, false)
		if err != nil {
			return err
		}
		n += float64(l.Tokens)
		raw += l.Raw * float64(l.Tokens)
		lab += l.Lab * float64(l.Tokens)
		src, tgt, toks = src[:0], tgt[:0], 0
		return nil
	}
	for i := r; i < len(valid); i += N {
		p := valid[i]
		if full := t.o.EvalBatchPairs > 0 && len(src) == t.o.EvalBatchPairs; full || t.o.EvalBatchPairs == 0 && toks+len(p[0])+len(p[1]) > t.o.BatchTokens/2 {
			if err := flush(); err != nil {
				return err
			}
		}
		src, tgt = append(src, p[0]), append(tgt, p[1])
		toks += len(p[0]) + len(p[1])
	}
	if err := flush(); err != nil {
		return err
	}
	glob, err := t.allreduceSums(ctx, []float64{n, raw, lab})
	if err != nil {
		return err
	}
	vals := map[string]float64{}
	if glob[0] > 0 {
		vals["loss_raw"], vals["loss"] = glob[1]/glob[0], glob[2]/glob[0]
	}

	// BLEU: sentence i is translated by rank i % N.
	K := min(t.o.EvalSentences, len(valid))
	hyps, err := t.translateShared(ctx, valid[:K])
	if err != nil {
		return err
	}
	var text map[string]string
	if K > 0 && t.leader() {
		hypText := make([]string, K)
		hypPieces := make([][]string, K)
		refPieces := make([][]string, K)
		for i := range hyps {
			hypText[i] = t.data.Decode(hyps[i])
			hypPieces[i] = t.data.Pieces(hyps[i])
			refPieces[i] = t.data.Pieces(trimEOS(valid[i][1]))
		}
		res := data.CorpusBLEU(hypText, t.data.ValidRefs[:K])
		vals["bleu"] = res.Score
		vals["bleu_lab"] = data.TokenizedBLEU(hypPieces, refPieces)
		text = map[string]string{}
		for i := 0; i < min(3, K); i++ {
			src := t.data.Decode(trimEOS(valid[i][0]))
			text[fmt.Sprintf("sample_%d", i)] = fmt.Sprintf("%s => %s (ref: %s)", src, hypText[i], t.data.ValidRefs[i])
			t.logf("  src: %s\n  hyp: %s\n  ref: %s", src, hypText[i], t.data.ValidRefs[i])
		}
		t.logf("eval at step %s | loss %.4f (raw %.4f) | BLEU %.2f (sacreBLEU, %d sentences, %s) | lab's tokenized BLEU %.4f | %.1f s",
			report.Commas(int64(t.step)), vals["loss"], vals["loss_raw"], res.Score, K, decodeName(t.o.Beam), vals["bleu_lab"], time.Since(t0).Seconds())
	}
	if t.run != nil {
		return t.run.Log("eval", int64(t.step), vals, text)
	}
	return nil
}

func decodeName(beam int) string {
	if beam <= 1 {
		return "greedy"
	}
	return fmt.Sprintf("beam %d", beam)
}

func trimEOS(s []int32) []int32 {
	if len(s) > 0 && s[len(s)-1] == 1 {
		return s[:len(s)-1]
	}
	return s
}

// translateShared translates pairs[i][0] on rank i%N and gathers every
// translation on every rank.
func (t *Trainer) translateShared(ctx context.Context, pairs [][2][]int32) ([][]int32, error) {
	N, r := t.id.Size, t.id.Rank
	K := len(pairs)
	if K == 0 {
		return nil, nil
	}
	maxSrc := 0
	for _, p := range pairs {
		maxSrc = max(maxSrc, len(p[0]))
	}
	width := maxSrc + t.o.DecodeExtra + 1 // slot: length, then ids
	slots := (K + N - 1) / N
	mine := make([]int32, slots*width)
	var idx []int
	var srcs [][]int32
	for i := r; i < K; i += N {
		idx = append(idx, i)
		srcs = append(srcs, pairs[i][0]) // with EOS, as in training
	}
	opt := transformer.DecodeOptions{Beam: t.o.Beam, Alpha: t.o.Alpha, MaxExtra: t.o.DecodeExtra}
	const chunk = 64
	for lo := 0; lo < len(srcs); lo += chunk {
		hi := min(lo+chunk, len(srcs))
		out, err := t.m.Translate(srcs[lo:hi], opt)
		if err != nil {
			return nil, err
		}
		for j, h := range out {
			s := mine[(lo+j)*width:]
			n := min(len(h), width-1)
			s[0] = int32(n)
			copy(s[1:1+n], h[:n])
		}
	}
	send := int32Bytes(mine)
	recv := make([]byte, len(send)*N)
	if err := t.comm.Allgather(ctx, send, recv); err != nil {
		return nil, err
	}
	out := make([][]int32, K)
	for i := 0; i < K; i++ {
		owner, slot := i%N, i/N
		off := (owner*slots + slot) * width * 4
		n := int(int32(binary.LittleEndian.Uint32(recv[off:])))
		h := make([]int32, n)
		for j := range h {
			h[j] = int32(binary.LittleEndian.Uint32(recv[off+4*(1+j):]))
		}
		out[i] = h
	}
	return out, nil
}

func int32Bytes(s []int32) []byte {
	b := make([]byte, 4*len(s))
	for i, v := range s {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	return b
}
