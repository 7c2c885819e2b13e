package report

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/gorun/gorun/metrics"
)

// segment is one part of a run, from a start (fresh, --resume, or a
// restart) to its last record.
type segment struct {
	from, to   int64   // the step it started after, the last step it made
	start, end float64 // unix seconds: its start, its last record
	logged     bool    // it made a training step: logged one, or stopped with a checkpoint after it
}

// segmentsOf cuts the records into segments at the "start" records. The
// records before the first (a run directory from before start records)
// form a segment that began at started, when known. A segment ends with
// its last record: a stop on a signal (its checkpoint holds the steps
// made since the last log line, and their time) or its last log line.
func segmentsOf(recs []metrics.Record, started float64) []segment {
	var segs []segment
	for _, rec := range recs {
		if rec.Kind == "start" {
			segs = append(segs, segment{from: rec.Step, to: rec.Step, start: rec.Time, end: rec.Time})
			continue
		}
		if len(segs) == 0 {
			s := rec.Time
			if started > 0 && started < s {
				s = started
			}
			segs = append(segs, segment{start: s, end: s})
		}
		sg := &segs[len(segs)-1]
		sg.end = max(sg.end, rec.Time)
		if rec.Kind == "train" || rec.Kind == "stop" && rec.Step > sg.from {
			sg.to, sg.logged = max(sg.to, rec.Step), true
		}
	}
	// a start that kept no step (its records were cut back on a resume)
	// took no time that the run shows
	return slices.DeleteFunc(segs, func(s segment) bool { return !s.logged })
}

func (r *report) timeSection() {
	r.w("## How long did it take, and how many steps?\n\n")
	segs := segmentsOf(r.recs, r.ri.Started)
	var total float64
	for _, s := range segs {
		total += s.end - s.start
	}
	switch {
	case len(segs) == 0:
		r.w("- No training step was logged.\n")
	case total <= 0:
		r.w("- **%s steps**; how long they took is unknown (the records hold a single time and run.json no start).\n", Commas(r.lastStep))
	case len(segs) == 1:
		r.w("- Training time: **%s** for **%s steps** (from the start to the last record, in one go).\n", fmtDur(total), Commas(r.lastStep))
	default:
		parts := make([]string, len(segs))
		for i, s := range segs {
			how := "started fresh"
			if s.from > 0 {
				how = fmt.Sprintf("resumed from the checkpoint of step %s", Commas(s.from))
			}
			parts[i] = fmt.Sprintf("steps %s-%s in %s (%s)", Commas(s.from+1), Commas(s.to), fmtDur(s.end-s.start), how)
		}
		r.w("- Training time: **%s** for **%s steps**, the sum of %d segments: %s.\n", fmtDur(total), Commas(r.lastStep), len(segs), strings.Join(parts, "; "))
		span := segs[len(segs)-1].end - segs[0].start
		r.w("- From the first start to the last record: %s, of which %s passed between the segments, while nothing trained.\n", fmtDur(span), fmtDur(span-total))
	}
	every := ""
	if len(segs) > 1 {
		every = ", from every segment"
	}
	if len(r.stepTime) == 0 {
		if len(segs) > 0 { // it stopped before its first log line
			r.w("- Step time and throughput: **not enough data**: no log line was written (--log-every logs more often).\n")
		}
	} else {
		r.w("- Average step time: **%s s** (median %s s) over %d logged intervals%s.\n", fmtNum(mean(r.stepTime), "%.3f"), fmtNum(median(r.stepTime), "%.3f"), len(r.stepTime), every)
		toks := "n/a"
		if m := mean(r.toks); !math.IsNaN(m) && !math.IsInf(m, 0) {
			toks = Commas(int64(math.Round(m)))
		}
		r.w("- Throughput: **%s target tokens/s** on average across the job.\n", toks)
	}
	r.w("%s\n", describeInterruptions(r.recs))
	r.w("%s\n\n", r.plot("step_time.png", "step time", "seconds", Line{"step time", r.stepTime}))
}

// describeInterruptions lists the stops on a signal ("stop" records) and
// the restarts after a failure ("restart" records) of a run, one bullet
// each; "" when it ran in one go.
func describeInterruptions(recs []metrics.Record) string {
	var b strings.Builder
	for _, r := range recs {
		switch r.Kind {
		case "stop":
			fmt.Fprintf(&b, "- Stopped by %s after step %s (checkpoint %s written).\n",
				orStr(r.Text["signal"], "a signal"), Commas(r.Step), orStr(r.Text["checkpoint"], "?"))
		case "restart":
			fmt.Fprintf(&b, "- Restart %.0f (gorun --max-restarts) after %s: resumed from step %s; %s logged steps of the failed start lost.\n",
				r.Values["restart"], orStr(r.Text["cause"], "a failure"), Commas(r.Step), Commas(int64(r.Values["steps_lost"])))
		}
	}
	return b.String()
}
