package train

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gorun/gorun/report"
)

// setting is one option that every rank of a job must agree on.
type setting struct{ name, value string }

// settings lists, in a fixed order (the flags'), what every rank must
// agree on: everything that shapes the model, the data, the updates, the
// collectives the ranks run (logging, eval, timeline and the link probe
// all run collectives), and the checkpoints.
//
// Exempt, as they may differ without harm: --threads (cores per host),
// --quiet, --timeout, --device (a CPU and a GPU rank may train together;
// what must agree is the precision it resolves to, compared below),
// --run-dir and --resume (rank 0 alone reads and writes the run
// directory, and broadcasts the checkpoint), --config (its values are
// compared). --data is compared by content (vocabulary hash and corpus
// size), not by path, so hosts may mount it in different places; text
// files (Options.Text) by their sizes and first and last MiB's hashes and
// the vocabulary's hash, not by path or modification time.
func (t *Trainer) settings() []setting {
	o := t.o
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	i := strconv.Itoa
	b := strconv.FormatBool
	data := "built-in corpus"
	if o.Data != "" && t.data != nil {
		s := t.data.Stats
		data = fmt.Sprintf("vocabulary %.12s with %s pairs and %s+%s tokens", t.data.VocabHash,
			report.Commas(s.Lines), report.Commas(s.SrcTokens), report.Commas(s.TgtTokens))
	}
	if ct := cachedOf(t.data); o.Text != nil && ct != nil {
		data = ct.content // the files' sizes and hashes, not paths or times (textDiffer reads it)
	}
	lines := "unused"
	if o.Data == "" && o.Text == nil {
		lines = i(o.SyntheticLines)
	}
	return []setting{
		{"--data", data},
		{"--synthetic-lines", lines},
		{"--preset", o.Preset},
		{"--batch-tokens", i(o.BatchTokens)},
		{"--batch-pairs", i(o.BatchPairs)},
		{"model", modelSetting(o)},
		{"optimizer", adamSetting(o.Adam)},
		{"--max-length", i(o.MaxLength)},
		{"--lr-policy", o.LRPolicy},
		{"--learning-rate", f(o.LearningRate)},
		{"--warmup-steps", i(o.Warmup)},
		{"--max-steps", i(o.MaxSteps)},
		{"--log-every", i(o.LogEvery)},
		{"--eval-every", i(o.EvalEvery)},
		{"--eval-sentences", i(o.EvalSentences)},
		{"--eval-max-length", i(o.EvalMaxLength)},
		{"eval batch pairs", i(o.EvalBatchPairs)},
		{"evaluation", b(!o.NoEval)},
		{"--beam", i(o.Beam)},
		{"--alpha", f(o.Alpha)},
		{"--decode-extra", i(o.DecodeExtra)},
		{"--checkpoint-every", i(o.CkptEvery)},
		{"--keep-checkpoints", i(o.KeepCkpts)},
		{"--seed", strconv.FormatUint(o.Seed, 10)},
		{"--compression", o.Compression},
		{"--powersgd-rank", i(o.PowerSGDRank)},
		{"--powersgd-start-step", i(o.PowerSGDStart)},
		{"--bucket-cap-mb", f(o.BucketCapMB)},
		{"--first-bucket-mb", f(o.FirstBucketMB)},
		{"--cycle-time", o.CycleTime.String()},
		{"--overlap", b(o.Overlap)},
		{"--backward-passes-per-step", i(o.PassesPerStep)},
		{"--timeline", strconv.Quote(o.Timeline)},
		{"--link-gbps", f(o.LinkGbps)},
		{"--precision", t.prec}, // as resolved: auto is fp16 on a GPU, fp32 on the CPU
		{"--no-dropout", b(o.NoDropout)},
	}
}

// modelSetting is the architecture a config gives, or "--preset's".
func modelSetting(o Options) string {
	if o.Model == nil {
		return "--preset's"
	}
	j, _ := json.Marshal(o.Model)
	return string(j)
}

// adamSetting is the optimizer a config gives, or "LazyAdam's defaults".
func adamSetting(a *AdamConfig) string {
	if a == nil {
		return "LazyAdam's defaults"
	}
	return fmt.Sprintf("%+v", *a)
}

func encodeSettings(ss []setting) []byte {
	var sb strings.Builder
	for _, s := range ss {
		sb.WriteString(s.name)
		sb.WriteByte(0)
		sb.WriteString(s.value)
		sb.WriteByte(0)
	}
	return []byte(sb.String())
}

func decodeSettings(b []byte) map[string]string {
	m := map[string]string{}
	parts := strings.Split(string(b), "\x00")
	for k := 0; k+1 < len(parts); k += 2 {
		m[parts[k]] = parts[k+1]
	}
	return m
}

// abortFingerprint is rank 0's fingerprint when it failed before it knew
// its settings (abortJob): the other ranks skip the comparison and learn
// of the failure from the broadcast that follows.
var abortFingerprint [sha256.Size]byte

// checkSettings exchanges a hash of the settings (nil: rank 0 is
// aborting) and, when they differ, the settings themselves; every rank
// then returns the same one-line error naming the first differing setting
// and the ranks.
func (t *Trainer) checkSettings(ctx context.Context, ss []setting) error {
	n := t.comm.Size()
	if n == 1 {
		return nil
	}
	blob := encodeSettings(ss)
	mine := abortFingerprint
	if ss != nil {
		mine = sha256.Sum256(blob)
	}
	all := make([]byte, n*len(mine))
	if err := t.comm.Allgather(ctx, mine[:], all); err != nil {
		return fmt.Errorf("exchanging the settings' fingerprint: %w", err)
	}
	same := true
	for r := 0; r < n; r++ {
		h := all[r*len(mine) : (r+1)*len(mine)]
		if r == 0 && string(h) == string(abortFingerprint[:]) {
			return nil // rank 0 is aborting; broadcastState says why
		}
		same = same && string(h) == string(mine[:])
	}
	if same {
		return nil
	}
	// They differ: gather the settings (lengths first, then the padded bytes).
	var ln [8]byte
	binary.LittleEndian.PutUint64(ln[:], uint64(len(blob)))
	lens := make([]byte, 8*n)
	if err := t.comm.Allgather(ctx, ln[:], lens); err != nil {
		return fmt.Errorf("exchanging the settings: %w", err)
	}
	width := 0
	for r := 0; r < n; r++ {
		width = max(width, int(binary.LittleEndian.Uint64(lens[8*r:])))
	}
	send := make([]byte, width)
	copy(send, blob)
	recv := make([]byte, width*n)
	if err := t.comm.Allgather(ctx, send, recv); err != nil {
		return fmt.Errorf("exchanging the settings: %w", err)
	}
	per := make([]map[string]string, n)
	for r := 0; r < n; r++ {
		per[r] = decodeSettings(recv[r*width : r*width+int(binary.LittleEndian.Uint64(lens[8*r:]))])
	}
	return t.settingsDiffer(ss, per)
}

// settingsDiffer is the package's settingsDiffer, except that text files
// (Options.Text) that differ are named with the hosts that have each.
func (t *Trainer) settingsDiffer(ss []setting, per []map[string]string) error {
	if t.o.Text != nil {
		vals := make([]string, len(per))
		for r, m := range per {
			vals[r] = m["--data"]
		}
		if msg, ok := textDiffer(vals, t.mesh.HostNames(), t.o.Text); ok {
			return errors.New(msg)
		}
	}
	return settingsDiffer(ss, per)
}

// settingsDiffer names the first setting of ss (in its order) on which
// the ranks' settings per[r] differ: "settings differ between ranks:
// --learning-rate is 2 on ranks 0, 2 and 1 on rank 1".
func settingsDiffer(ss []setting, per []map[string]string) error {
	for _, s := range ss {
		var vals []string
		ranks := map[string][]string{}
		for r, m := range per {
			v, ok := m[s.name]
			if !ok {
				v = "(not known)"
			}
			if _, seen := ranks[v]; !seen {
				vals = append(vals, v)
			}
			ranks[v] = append(ranks[v], strconv.Itoa(r))
		}
		if len(vals) < 2 {
			continue
		}
		parts := make([]string, len(vals))
		for k, v := range vals {
			rs := ranks[v]
			word := "rank"
			if len(rs) > 1 {
				word = "ranks"
			}
			parts[k] = fmt.Sprintf("%s on %s %s", v, word, strings.Join(rs, ", "))
		}
		list := parts[0]
		if len(parts) > 1 {
			list = strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
		}
		return fmt.Errorf("settings differ between ranks: %s is %s; start every rank with the same settings", s.name, list)
	}
	return fmt.Errorf("settings differ between ranks (the ranks run different nmt-train builds?)")
}
