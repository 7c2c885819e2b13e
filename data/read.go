package data

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"unicode/utf8"
)

// HistWidth is the width of the length histogram's bins (in tokens).
const HistWidth = 8

// Stats describes a parallel corpus as it was read: what the lab asks ("how
// big was the training set, how many lines") and what was dropped and why.
// Lengths count pieces plus the EOS the model sees.
type Stats struct {
	SrcPath, TgtPath string
	Bytes            int64 // both input files on disk
	Lines            int64 // line pairs read
	Kept             int64
	DroppedEmpty     int64 // a side with no pieces
	DroppedLong      int64 // a side longer than MaxLen
	MaxLen           int   // 0: no limit
	SrcTokens        int64 // kept lines, without EOS
	TgtTokens        int64
	SrcUnk, TgtUnk   int64 // pieces not in the vocabulary (kept lines)
	// Hist[k] counts non-empty line pairs whose longer side (with EOS) is
	// in (k*HistWidth, (k+1)*HistWidth]; dropped long lines included.
	Hist []int64
}

// Dropped is the number of line pairs dropped.
func (s *Stats) Dropped() int64 { return s.DroppedEmpty + s.DroppedLong }

// MB is the size of the inputs on disk in MB (10^6 bytes).
func (s *Stats) MB() float64 { return float64(s.Bytes) / 1e6 }

func (s *Stats) addHist(n int) {
	k := (n - 1) / HistWidth
	for len(s.Hist) <= k {
		s.Hist = append(s.Hist, 0)
	}
	s.Hist[k]++
}

// String is a short human summary.
func (s *Stats) String() string {
	return fmt.Sprintf("%s + %s: %.1f MB, %d line pairs read, %d kept, %d dropped (%d empty, %d longer than %d tokens), %d source and %d target tokens (%d and %d unknown)",
		s.SrcPath, s.TgtPath, s.MB(), s.Lines, s.Kept, s.Dropped(), s.DroppedEmpty, s.DroppedLong, s.MaxLen,
		s.SrcTokens, s.TgtTokens, s.SrcUnk, s.TgtUnk)
}

// Markdown writes the statistics as a Markdown section titled title.
func (s *Stats) Markdown(w io.Writer, title string) {
	fmt.Fprintf(w, "## %s\n\n", title)
	fmt.Fprintf(w, "| | |\n|---|---|\n")
	fmt.Fprintf(w, "| source file | `%s` |\n| target file | `%s` |\n", s.SrcPath, s.TgtPath)
	fmt.Fprintf(w, "| size on disk | %.1f MB |\n", s.MB())
	fmt.Fprintf(w, "| line pairs read | %d |\n| line pairs kept | %d |\n", s.Lines, s.Kept)
	fmt.Fprintf(w, "| dropped: empty side | %d |\n", s.DroppedEmpty)
	if s.MaxLen > 0 {
		fmt.Fprintf(w, "| dropped: longer than %d tokens (with EOS) | %d |\n", s.MaxLen, s.DroppedLong)
	}
	fmt.Fprintf(w, "| source tokens (kept, without EOS) | %d |\n| target tokens (kept, without EOS) | %d |\n", s.SrcTokens, s.TgtTokens)
	fmt.Fprintf(w, "| unknown pieces source / target | %d / %d |\n\n", s.SrcUnk, s.TgtUnk)
	if len(s.Hist) > 0 {
		fmt.Fprintf(w, "Length of the longer side (tokens with EOS), non-empty pairs:\n\n| length | pairs | |\n|---|---:|---|\n")
		rows := s.histRows()
		var most int64
		for _, r := range rows {
			most = max(most, r.n)
		}
		for _, r := range rows {
			bar := 0
			if most > 0 {
				bar = int(40 * r.n / most)
			}
			fmt.Fprintf(w, "| %d-%d | %d | %s |\n", r.lo, r.hi, r.n, strings.Repeat("#", bar))
		}
		fmt.Fprintln(w)
	}
}

// histFine is the length up to which the report's histogram has a row for
// every bin of HistWidth tokens; above it the rows double in width
// (257-512, 513-1024, ...).
const histFine = 256

type histRow struct {
	lo, hi int // lengths lo..hi
	n      int64
}

// histRows is the histogram as the report prints it: bins of HistWidth up
// to histFine tokens, ranges doubling in width above, and a run of empty
// rows as one row, so that a line of 150,000 tokens adds a few rows to
// the report, not 19,000 (TestStatsMarkdownLongLine).
func (s *Stats) histRows() []histRow {
	var rows []histRow
	top := len(s.Hist) * HistWidth
	for lo := 1; lo <= top; {
		hi := lo + HistWidth - 1
		if lo > histFine {
			hi = 2 * (lo - 1)
		}
		var n int64
		for k := (lo - 1) / HistWidth; k <= (hi-1)/HistWidth && k < len(s.Hist); k++ {
			n += s.Hist[k]
		}
		if n == 0 && len(rows) > 0 && rows[len(rows)-1].n == 0 {
			rows[len(rows)-1].hi = hi
		} else {
			rows = append(rows, histRow{lo, hi, n})
		}
		lo = hi + 1
	}
	return rows
}

// lineReader reads lines of one file, checking UTF-8.
type lineReader struct {
	path string
	sc   *bufio.Scanner
	n    int
}

func (r *lineReader) next() (string, bool, error) {
	if !r.sc.Scan() {
		if err := r.sc.Err(); err != nil {
			return "", false, fmt.Errorf("%s:%d: %w", r.path, r.n+1, err)
		}
		return "", false, nil
	}
	r.n++
	b := r.sc.Bytes()
	if !utf8.Valid(b) {
		return "", false, fmt.Errorf("%s:%d: invalid UTF-8", r.path, r.n)
	}
	return strings.TrimSuffix(string(b), "\r"), true, nil
}

// ReadParallelFunc reads two line-aligned files, turns each line into
// pieces with split and into ids with v, and keeps the pairs whose sides
// are non-empty and at most maxLen tokens with EOS (maxLen <= 0: no limit).
// Files of different line counts, invalid UTF-8 and unreadable files are
// errors naming the file (and line).
func ReadParallelFunc(srcPath, tgtPath string, split func(string) []string, v *Vocab, maxLen int) (src, tgt [][]int32, st Stats, err error) {
	st, err = ReadParallelEach(srcPath, tgtPath, split, v, maxLen, func(s, t []int32) error {
		src, tgt = append(src, s), append(tgt, t)
		return nil
	})
	if err != nil {
		return nil, nil, st, err
	}
	return src, tgt, st, nil
}

// ReadParallelEach is ReadParallelFunc calling keep for every kept pair,
// in file order, instead of collecting them (prepare streams the lab's
// 4.5 M pairs into a CorpusWriter this way). Lines are split and encoded on
// up to GOMAXPROCS goroutines, so split must be safe for concurrent use.
// An error from keep stops the reading.
func ReadParallelEach(srcPath, tgtPath string, split func(string) []string, v *Vocab, maxLen int, keep func(src, tgt []int32) error) (st Stats, err error) {
	return readParallel(srcPath, tgtPath, split, v, maxLen, readOptions{}, keep)
}

// readOptions are what Prepare adds to ReadParallelEach.
type readOptions struct {
	// ctx stops the reading when cancelled (nil: never); readParallel
	// then returns ctx.Err().
	ctx context.Context
	// check, when set, is called on every line before split; its error
	// stops the reading, returned as "file:line: error" (the first in
	// file order).
	check func(line string) error
}

// readParallel is ReadParallelEach with opt's cancellation and line check.
func readParallel(srcPath, tgtPath string, split func(string) []string, v *Vocab, maxLen int, opt readOptions, keep func(src, tgt []int32) error) (st Stats, err error) {
	st = Stats{SrcPath: srcPath, TgtPath: tgtPath, MaxLen: maxLen}
	var done <-chan struct{} // nil: never closed
	if opt.ctx != nil {
		done = opt.ctx.Done()
		if err := opt.ctx.Err(); err != nil {
			return st, err
		}
	}
	cancelled := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	var rs [2]*lineReader
	for i, p := range []string{srcPath, tgtPath} {
		f, err := os.Open(p)
		if err != nil {
			return st, err
		}
		defer f.Close()
		if fi, err := f.Stat(); err == nil {
			st.Bytes += fi.Size()
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), maxLineBytes)
		rs[i] = &lineReader{path: p, sc: sc}
	}
	// The reader goroutine cuts the files into chunks; workers split and
	// encode them (split must be safe for concurrent use: SplitPieces,
	// WordPieces and (*BPE).Apply are); this goroutine takes the chunks in
	// file order, adds up the statistics and calls keep.
	type pairOut struct {
		is, it []int32
		n      int // longer side with EOS; 0: an empty side
	}
	type chunk struct {
		ls, lt []string
		first  int // the line number of ls[0] and lt[0]
		out    []pairOut
		err    error // opt.check's, naming file:line; or cancelled
		done   chan struct{}
	}
	const chunkLines = 512
	workers := max(1, min(runtime.GOMAXPROCS(0), 8))
	jobs := make(chan *chunk, 2*workers)
	ordered := make(chan *chunk, 4*workers)
	stop := make(chan struct{})
	var readErr error
	go func() {
		defer close(jobs)
		defer close(ordered)
		for {
			c := &chunk{first: rs[0].n + 1, done: make(chan struct{})}
			var err error
			for len(c.ls) < chunkLines {
				var ls, lt string
				var okS, okT bool
				if ls, okS, err = rs[0].next(); err != nil {
					break
				}
				if lt, okT, err = rs[1].next(); err != nil {
					break
				}
				if okS != okT {
					for _, r := range rs {
						for {
							var ok bool
							if _, ok, err = r.next(); err != nil || !ok {
								break
							}
						}
						if err != nil {
							break
						}
					}
					if err == nil {
						err = fmt.Errorf("%s has %d lines but %s has %d: the files are not parallel", srcPath, rs[0].n, tgtPath, rs[1].n)
					}
					break
				}
				if !okS {
					break
				}
				c.ls, c.lt = append(c.ls, ls), append(c.lt, lt)
			}
			if len(c.ls) > 0 {
				select {
				case jobs <- c:
				case <-stop:
					return
				case <-done:
					return
				}
				select {
				case ordered <- c:
				case <-stop:
					return
				}
			}
			if err != nil || len(c.ls) < chunkLines {
				readErr = err // read after ordered is closed
				return
			}
		}
	}()
	for w := 0; w < workers; w++ {
		go func() {
			for c := range jobs {
				c.out = make([]pairOut, len(c.ls))
				for i := range c.ls {
					if cancelled() {
						c.err = opt.ctx.Err()
						break
					}
					if opt.check != nil {
						if err := opt.check(c.ls[i]); err != nil {
							c.err = fmt.Errorf("%s:%d: %w", srcPath, c.first+i, err)
							break
						}
						if err := opt.check(c.lt[i]); err != nil {
							c.err = fmt.Errorf("%s:%d: %w", tgtPath, c.first+i, err)
							break
						}
					}
					ps, pt := split(c.ls[i]), split(c.lt[i])
					if len(ps) == 0 || len(pt) == 0 {
						continue
					}
					n := max(len(ps), len(pt)) + 1
					c.out[i].n = n
					if maxLen > 0 && n > maxLen {
						continue
					}
					c.out[i].is, c.out[i].it = v.Encode(ps), v.Encode(pt)
				}
				close(c.done)
			}
		}()
	}
	drain := func() {
		close(stop)
		for c := range ordered {
			<-c.done
		}
	}
	for c := range ordered {
		<-c.done
		if c.err == nil && cancelled() {
			c.err = opt.ctx.Err()
		}
		if c.err != nil {
			drain()
			return st, c.err
		}
		for _, o := range c.out {
			st.Lines++
			if o.n == 0 {
				st.DroppedEmpty++
				continue
			}
			st.addHist(o.n)
			if maxLen > 0 && o.n > maxLen {
				st.DroppedLong++
				continue
			}
			st.SrcUnk += countUnk(o.is)
			st.TgtUnk += countUnk(o.it)
			st.Kept++
			st.SrcTokens += int64(len(o.is))
			st.TgtTokens += int64(len(o.it))
			if err := keep(o.is, o.it); err != nil {
				drain()
				return st, err
			}
		}
	}
	if cancelled() {
		return st, opt.ctx.Err()
	}
	if readErr != nil {
		return st, readErr
	}
	return st, nil
}

func countUnk(ids []int32) int64 {
	var n int64
	for _, id := range ids {
		if id == UNK {
			n++
		}
	}
	return n
}

// ReadLines reads a text file's lines, checking UTF-8 (errors name
// file:line).
func ReadLines(path string) ([]string, error) {
	var out []string
	err := eachLine(path, func(_ int, l string) error {
		out = append(out, l)
		return nil
	})
	return out, err
}
