package train

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/internal/atomicfile"
	"github.com/gorun/gorun/report"
)

// TextData names the corpus as an OpenSeq2Seq config does: tokenized text
// files (pieces separated by spaces) and a SentencePiece vocabulary, used
// directly; prepared into a cache on first use.
type TextData struct {
	TrainSrc, TrainTgt string // training pairs
	EvalSrc, EvalTgt   string // evaluation pairs ("" : none)
	Vocab              string // shared by both sides
	CacheDir           string // "": DefaultCacheDir(); the command passes $GORUN_DATA_CACHE in if set
}

// EnvDataCache is the variable the command reads into TextData.CacheDir.
const EnvDataCache = "GORUN_DATA_CACHE"

// DefaultCacheDir is $XDG_CACHE_HOME/gorun/corpus, else
// ~/.cache/gorun/corpus (os.UserCacheDir's choice on Linux; on macOS
// ~/Library/Caches/gorun/corpus).
func DefaultCacheDir() (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("data: no cache directory for the prepared corpus (%w): set %s", err, EnvDataCache)
	}
	return filepath.Join(d, "gorun", "corpus"), nil
}

// cacheFormat is part of every entry's key: raise it when what
// data.Prepare writes or an entry's layout changes, and every cache is
// prepared anew.
const cacheFormat = 1

// Names in a cache directory: the lock every preparation holds, the
// staging directories (".tmp-<name>-N", removed by the next holder of the
// lock when a preparer was killed), and in each entry its source.json.
const (
	cacheLock    = ".lock"
	cacheStaging = ".tmp-"
	cacheMeta    = "source.json"
	headTail     = 1 << 20 // bytes hashed at each end of a text file
)

// Cached is a prepared corpus in the cache: a directory that `train
// --data` would read.
type Cached struct {
	Dir    string
	Reused bool          // prepared by an earlier run, or (Waited > 0) by another process meanwhile
	Waited time.Duration // waiting for the cache's lock
	Took   time.Duration // preparing it (0 when reused)
	Pairs  int           // training pairs
	Line   string        // the log line: where, and reused or prepared

	text    *TextData
	logged  atomic.Bool
	content string // the sources' sizes and head/tail hashes and the vocabulary's: what every host must agree on
}

// cacheSource is one source file's identity in an entry's key.
type cacheSource struct {
	Role   string `json:"role"` // train-src, train-tgt, eval-src, eval-tgt, vocab
	Path   string `json:"path"` // absolute; not part of the key
	Size   int64  `json:"size"`
	MTime  int64  `json:"mtime_ns"`
	Head   string `json:"head_sha256,omitempty"` // text: SHA-256 of the first MiB
	Tail   string `json:"tail_sha256,omitempty"` // text: of the last MiB
	SHA256 string `json:"sha256,omitempty"`      // the vocabulary: of all of it
}

// cacheEntry is an entry's source.json.
type cacheEntry struct {
	Format    int           `json:"format"`
	Key       string        `json:"key"`
	MaxLength int           `json:"max_length"` // 0: no limit (the Batcher skips what --max-length does not allow)
	Sources   []cacheSource `json:"sources"`
	Host      string        `json:"host"`
	Prepared  time.Time     `json:"prepared"`
	Seconds   float64       `json:"seconds"`
	Pairs     int           `json:"pairs"`
	Valid     int           `json:"valid_pairs"`
}

// roles are the source files in key order, with the words errors use.
var roles = []struct{ role, what string }{
	{"train-src", "training source"}, {"train-tgt", "training target"},
	{"eval-src", "evaluation source"}, {"eval-tgt", "evaluation target"}, {"vocab", "vocabulary"},
}

func (d *TextData) path(role string) string {
	switch role {
	case "train-src":
		return d.TrainSrc
	case "train-tgt":
		return d.TrainTgt
	case "eval-src":
		return d.EvalSrc
	case "eval-tgt":
		return d.EvalTgt
	}
	return d.Vocab
}

// testHookPrepared, when set (by tests), runs after an entry is written in
// its staging directory and before it is published.
var testHookPrepared func(stage string)

// preparations counts the entries this process prepared (tests).
var preparations atomic.Int64

// Open returns the prepared directory of d's files: the cache's entry for
// them if it is there (their size, modification time, first and last MiB,
// the vocabulary's contents and the preparation's settings unchanged),
// else one prepared now. Processes that start at once on one host prepare
// once: one holds the cache's lock and prepares, the others wait for it
// and use its entry. A preparer killed midway leaves a staging directory
// that the next preparation removes; nothing is ever published half. A
// new entry replaces the entries this host prepared earlier from the same
// training files (they changed, so those can never be used again).
//
// Bad input (a missing, unreadable or empty file, files of different line
// counts, invalid UTF-8, a malformed vocabulary) is one error naming the
// file (and line), and leaves the cache as it was.
func (d *TextData) Open(ctx context.Context) (*Cached, error) {
	for _, r := range []string{"train-src", "train-tgt", "vocab"} {
		if d.path(r) == "" {
			return nil, fmt.Errorf("data: no %s file given", whatOf(r))
		}
	}
	if (d.EvalSrc == "") != (d.EvalTgt == "") {
		return nil, fmt.Errorf("data: the evaluation source and target files go together (got %q and %q)", d.EvalSrc, d.EvalTgt)
	}
	dir := d.CacheDir
	if dir == "" {
		var err error
		if dir, err = DefaultCacheDir(); err != nil {
			return nil, err
		}
	}
	ent, err := d.identify()
	if err != nil {
		return nil, err
	}
	name := ent.Key[:16]
	c := &Cached{Dir: filepath.Join(dir, name), text: d, content: contentOf(ent.Sources)}
	if e := published(c.Dir, ent.Key); e != nil {
		c.Reused, c.Pairs = true, e.Pairs
		c.Line = fmt.Sprintf("data: using the prepared %s (sources unchanged)", c.Dir)
		return c, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data: the corpus cache: %w (%s names another directory)", err, EnvDataCache)
	}
	t0 := time.Now()
	unlock, err := lockCache(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	c.Waited = time.Since(t0)
	if e := published(c.Dir, ent.Key); e != nil {
		c.Reused, c.Pairs = true, e.Pairs
		c.Line = fmt.Sprintf("data: using %s, prepared by another process while this one waited %.1f s", c.Dir, c.Waited.Seconds())
		return c, nil
	}
	// This process holds the lock: every staging directory is a killed
	// preparer's, and an entry of this name is not a usable one.
	sweepStaging(dir)
	if err := removeEntry(dir, name); err != nil {
		return nil, fmt.Errorf("data: the corpus cache: %w", err)
	}
	t1 := time.Now()
	if err := d.prepare(ctx, dir, name, ent); err != nil {
		return nil, err
	}
	c.Took, c.Pairs = time.Since(t1), ent.Pairs
	pruneStale(dir, name, ent)
	c.Line = fmt.Sprintf("data: prepared %s + %s (%s pairs) into %s in %.1f s",
		filepath.Base(d.TrainSrc), filepath.Base(d.TrainTgt), report.Commas(int64(c.Pairs)), c.Dir, c.Took.Seconds())
	return c, nil
}

func whatOf(role string) string {
	for _, r := range roles {
		if r.role == role {
			return r.what
		}
	}
	return role
}

// identify stats and hashes the source files: the entry they make, key
// included. A missing, unreadable or empty file is an error naming it.
func (d *TextData) identify() (*cacheEntry, error) {
	host, _ := os.Hostname()
	ent := &cacheEntry{Format: cacheFormat, Host: host}
	h := sha256.New()
	fmt.Fprintf(h, "gorun corpus cache %d\nmax_length 0\n", cacheFormat)
	for _, r := range roles {
		p := d.path(r.role)
		if p == "" {
			fmt.Fprintf(h, "%s none\n", r.role)
			continue
		}
		s, err := identifyFile(r.role, p)
		if err != nil {
			return nil, err
		}
		ent.Sources = append(ent.Sources, s)
		fmt.Fprintf(h, "%s %d %d %s %s %s\n", s.Role, s.Size, s.MTime, s.Head, s.Tail, s.SHA256)
	}
	ent.Key = hex.EncodeToString(h.Sum(nil))
	return ent, nil
}

func identifyFile(role, p string) (cacheSource, error) {
	fail := func(err error) (cacheSource, error) {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return cacheSource{}, fmt.Errorf("data: %s (the %s): %w", p, whatOf(role), err)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return fail(err)
	}
	f, err := os.Open(p)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	if fi.IsDir() {
		return fail(errors.New("a directory, not a file"))
	}
	if fi.Size() == 0 {
		return fail(errors.New("empty file"))
	}
	s := cacheSource{Role: role, Path: abs, Size: fi.Size(), MTime: fi.ModTime().UnixNano()}
	sum := func(off, n int64) (string, error) {
		h := sha256.New()
		if _, err := io.Copy(h, io.NewSectionReader(f, off, n)); err != nil {
			return "", err
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	if role == "vocab" {
		s.SHA256, err = sum(0, fi.Size())
	} else if s.Head, err = sum(0, min(fi.Size(), headTail)); err == nil {
		s.Tail, err = sum(max(0, fi.Size()-headTail), min(fi.Size(), headTail))
	}
	if err != nil {
		return fail(err)
	}
	return s, nil
}

// contentOf is the part of the key that must agree across hosts: the
// files' sizes and hashes, not their paths or modification times (a copy
// to another machine has new ones).
func contentOf(ss []cacheSource) string {
	by := map[string]cacheSource{}
	for _, s := range ss {
		by[s.Role] = s
	}
	var parts []string
	for _, r := range roles {
		s, ok := by[r.role]
		switch {
		case !ok:
			parts = append(parts, r.role+"=none")
		case r.role == "vocab":
			parts = append(parts, fmt.Sprintf("%s=%d:%.16s", r.role, s.Size, s.SHA256))
		default:
			parts = append(parts, fmt.Sprintf("%s=%d:%.16s:%.16s", r.role, s.Size, s.Head, s.Tail))
		}
	}
	return "text " + strings.Join(parts, " ")
}

// published returns the entry in dir when it is complete and made from the
// sources of key; nil otherwise.
func published(dir, key string) *cacheEntry {
	b, err := os.ReadFile(filepath.Join(dir, cacheMeta))
	if err != nil {
		return nil
	}
	var e cacheEntry
	if json.Unmarshal(b, &e) != nil || e.Key != key || e.Format != cacheFormat {
		return nil
	}
	for _, f := range []string{TrainFile, ValidFile, VocabFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return nil
		}
	}
	return &e
}

// lockCache takes the cache's lock (flock: the kernel releases it when
// its holder dies), waiting for another holder.
func lockCache(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, cacheLock), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data: the corpus cache's lock: %w (%s names another directory)", err, EnvDataCache)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("data: locking %s: %w", f.Name(), err)
	}
	return func() {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

// sweepStaging removes the staging directories in dir (the lock's holder
// calls it: they are killed preparers').
func sweepStaging(dir string) {
	old, _ := filepath.Glob(filepath.Join(dir, cacheStaging+"*"))
	for _, d := range old {
		os.RemoveAll(d)
	}
}

// removeEntry removes the entry name from dir, first moving it to a
// staging name so that a removal cut short leaves no entry.
func removeEntry(dir, name string) error {
	p := filepath.Join(dir, name)
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	trash := filepath.Join(dir, cacheStaging+name+"-removed")
	os.RemoveAll(trash)
	if err := os.Rename(p, trash); err != nil {
		return err
	}
	return os.RemoveAll(trash)
}

// prepare writes the entry name into a staging directory and publishes it
// with one rename; on error the staging directory is removed.
func (d *TextData) prepare(ctx context.Context, dir, name string, ent *cacheEntry) (err error) {
	stage, err := atomicfile.MkdirTemp(dir, cacheStaging+name+"-*")
	if err != nil {
		return fmt.Errorf("data: the corpus cache: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(stage)
		}
	}()
	cmd := fmt.Sprintf("nmt-train train, the corpus cache (format %d): --src %s --tgt %s --vocab %s", cacheFormat, d.TrainSrc, d.TrainTgt, d.Vocab)
	if d.EvalSrc != "" {
		cmd += fmt.Sprintf(" --valid-src %s --valid-tgt %s", d.EvalSrc, d.EvalTgt)
	}
	t0 := time.Now()
	p, err := data.Prepare(ctx, data.PrepareConfig{Out: stage, Src: d.TrainSrc, Tgt: d.TrainTgt, ValidSrc: d.EvalSrc, ValidTgt: d.EvalTgt,
		Vocab: d.Vocab, MaxLen: 0, ValidLines: 0, Command: cmd + " --max-length 0"})
	if err != nil {
		return dataError(err)
	}
	ent.Prepared, ent.Seconds, ent.Pairs, ent.Valid = time.Now().UTC(), time.Since(t0).Seconds(), p.Train, p.Valid
	b, _ := json.MarshalIndent(ent, "", "  ")
	if err := atomicfile.WriteFile(filepath.Join(stage, cacheMeta), "."+cacheMeta+".tmp*", append(b, '\n')); err != nil {
		return fmt.Errorf("data: the corpus cache: %w", err)
	}
	if testHookPrepared != nil {
		testHookPrepared(stage)
	}
	if err := os.Rename(stage, filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("data: the corpus cache: %w", err)
	}
	preparations.Add(1)
	if err := atomicfile.SyncDir(dir); err != nil {
		return fmt.Errorf("data: the corpus cache: %w", err)
	}
	return nil
}

// dataError gives data.Prepare's errors the trainer's words: they name
// the file (and line) already; "prepare: " becomes "data: ".
func dataError(err error) error {
	msg := err.Error()
	if s, ok := strings.CutPrefix(msg, "prepare: "); ok {
		return errors.New("data: " + s)
	}
	return fmt.Errorf("data: %w", err)
}

// pruneStale removes the entries this host prepared from the same
// training files (the same paths) with another key: the files changed,
// so those entries can never be used again. Entries of other files stay,
// and so do other hosts' (a cache on a shared disk).
func pruneStale(dir, name string, ent *cacheEntry) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	pathOf := func(e *cacheEntry, role string) string {
		for _, s := range e.Sources {
			if s.Role == role {
				return s.Path
			}
		}
		return ""
	}
	for _, de := range ents {
		if !de.IsDir() || de.Name() == name || strings.HasPrefix(de.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, de.Name(), cacheMeta))
		if err != nil {
			continue
		}
		var old cacheEntry
		if json.Unmarshal(b, &old) != nil || old.Host != ent.Host || old.Key == ent.Key ||
			pathOf(&old, "train-src") != pathOf(ent, "train-src") || pathOf(&old, "train-tgt") != pathOf(ent, "train-tgt") {
			continue
		}
		removeEntry(dir, de.Name())
	}
}

// attach records the cache entry with the corpus c, whose training pairs
// train the Batcher b plans, names c after the text files, and makes its
// statistics those of the pairs b uses: the cache keeps every non-empty
// pair (no length limit, so that one entry serves any --max-length), and
// b skips those longer than --max-length, which c.Stats.Dropped counts
// already. Lines and tokens then count the pairs trained on, as they do
// for a directory prepared with that --max-length.
func (ct *Cached) attach(c *corpus, b *data.Batcher, train data.Source) {
	// b uses the lines up to a length bound: the b.Lines() shortest,
	// counting the longer side and the EOS
	var hist []int
	for i := 0; i < train.Len(); i++ {
		ls, lt := train.Lens(i)
		l := max(ls, lt) + 1
		for len(hist) <= l {
			hist = append(hist, 0)
		}
		hist[l]++
	}
	bound, n := 0, 0
	for bound < len(hist)-1 && n < b.Lines() {
		bound++
		n += hist[bound]
	}
	if n == b.Lines() {
		var st, tt int64
		for i := 0; i < train.Len(); i++ {
			ls, lt := train.Lens(i)
			if max(ls, lt)+1 <= bound {
				st, tt = st+int64(ls), tt+int64(lt)
			}
		}
		c.Stats.Lines, c.Stats.SrcTokens, c.Stats.TgtTokens = int64(n), st, tt
	}
	c.Name = fmt.Sprintf("%s + %s (%s pairs, from the cache %s)", filepath.Base(ct.text.TrainSrc), filepath.Base(ct.text.TrainTgt), report.Commas(c.Stats.Lines), ct.Dir)
	c.Stats.Name = c.Name
	c.text = ct
}

// cachedOf is the cache entry of c (nil: c is not of text files).
func cachedOf(c *corpus) *Cached {
	if c == nil {
		return nil
	}
	return c.text
}

// logText prints rank 0's line about the corpus cache, once.
func (t *Trainer) logText() {
	ct := cachedOf(t.data)
	if ct == nil || !ct.logged.CompareAndSwap(false, true) {
		return
	}
	t.logf("%s", ct.Line)
}

// textDiffer says how the text files differ between the ranks whose
// content values (contentOf) are vals: the first file that differs, what
// it is on each host, the hosts and their ranks. local names the files on
// this rank. ok is false when vals are not all text values.
func textDiffer(vals []string, hosts []string, local *TextData) (msg string, ok bool) {
	per := make([]map[string]string, len(vals))
	for r, v := range vals {
		rest, isText := strings.CutPrefix(v, "text ")
		if !isText {
			return "", false
		}
		per[r] = map[string]string{}
		for _, f := range strings.Fields(rest) {
			if k, val, found := strings.Cut(f, "="); found {
				per[r][k] = val
			}
		}
	}
	host := func(r int) string {
		if r < len(hosts) && hosts[r] != "" {
			return hosts[r]
		}
		return "an unnamed host"
	}
	for _, ro := range roles {
		var order []string
		ranks := map[string][]int{}
		for r := range per {
			v := per[r][ro.role]
			if _, seen := ranks[v]; !seen {
				order = append(order, v)
			}
			ranks[v] = append(ranks[v], r)
		}
		if len(order) < 2 {
			continue
		}
		sizes := map[string]bool{}
		for _, v := range order {
			sz, _, _ := strings.Cut(v, ":")
			sizes[sz] = true
		}
		parts := make([]string, len(order))
		for k, v := range order {
			f := strings.Split(v, ":")
			desc := "not given"
			if v != "none" && len(f) >= 2 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				desc = report.Commas(n) + " bytes"
				if len(sizes) == 1 && len(f) == 3 && f[1] != f[2] {
					desc += fmt.Sprintf(" (first MiB %.8s, last MiB %.8s)", f[1], f[2])
				} else if len(sizes) == 1 {
					desc += fmt.Sprintf(" (SHA-256 %.8s)", f[1])
				}
			}
			// the ranks of this value, host by host
			byHost := map[string][]string{}
			var hostOrder []string
			for _, r := range ranks[v] {
				h := host(r)
				if _, seen := byHost[h]; !seen {
					hostOrder = append(hostOrder, h)
				}
				byHost[h] = append(byHost[h], strconv.Itoa(r))
			}
			var on []string
			for _, h := range hostOrder {
				word := "rank"
				if len(byHost[h]) > 1 {
					word = "ranks"
				}
				on = append(on, fmt.Sprintf("%s (%s %s)", h, word, strings.Join(byHost[h], ", ")))
			}
			parts[k] = desc + " on " + strings.Join(on, ", ")
		}
		list := strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
		file := ""
		if local != nil && local.path(ro.role) != "" {
			file = fmt.Sprintf(" (%s here)", filepath.Base(local.path(ro.role)))
		}
		return fmt.Sprintf("the data files differ between hosts: the %s%s is %s; give every host the same files", ro.what, file, list), true
	}
	return "", false
}
