package train

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/transformer"
)

// The cache tests run this test binary again as a helper process: with
// GORUN_CACHE_TEST_TEXT set (a TextData in JSON) it opens the cache, prints
// the log line and exits. GORUN_CACHE_TEST_GO names a file to wait for
// before starting (so that several start at once); GORUN_CACHE_TEST_BLOCK a
// file the process writes once its entry is prepared in the staging
// directory, after which it blocks, holding the lock, until killed.
func init() {
	j := os.Getenv("GORUN_CACHE_TEST_TEXT")
	if j == "" {
		return
	}
	var td TextData
	if err := json.Unmarshal([]byte(j), &td); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if g := os.Getenv("GORUN_CACHE_TEST_GO"); g != "" {
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(2 * time.Millisecond) {
			if _, err := os.Stat(g); err == nil || time.Now().After(deadline) {
				break
			}
		}
	}
	if b := os.Getenv("GORUN_CACHE_TEST_BLOCK"); b != "" {
		testHookPrepared = func(string) {
			os.WriteFile(b, []byte("prepared, not published"), 0o644)
			select {}
		}
	}
	c, err := td.Open(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(c.Line)
	os.Exit(0)
}

const testdata = "../../../../data/testdata/"

// sampleText copies the lab-format sample (8 pairs, 101-piece vocabulary)
// into a directory of its own and names it, with a cache directory.
func sampleText(t *testing.T) *TextData {
	t.Helper()
	dir := t.TempDir()
	cp := func(name string) string {
		b, err := os.ReadFile(testdata + name)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	en, de, v := cp("sample.en.tok"), cp("sample.de.tok"), cp("m_common.vocab")
	return &TextData{TrainSrc: en, TrainTgt: de, EvalSrc: en, EvalTgt: de, Vocab: v, CacheDir: filepath.Join(dir, "cache")}
}

// bigText writes n generated pairs of the sample vocabulary's pieces (5-60
// a side) and returns them as a TextData without evaluation files.
func bigText(t *testing.T, n int) *TextData {
	t.Helper()
	dir := t.TempDir()
	v, err := data.LoadVocab(testdata + "m_common.vocab")
	if err != nil {
		t.Fatal(err)
	}
	r := mrand.New(mrand.NewPCG(1, 2))
	var s, g bytes.Buffer
	line := func(b *bytes.Buffer) {
		k := 5 + r.IntN(56)
		for i := 0; i < k; i++ {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(v.Piece(int32(4 + r.IntN(v.Size()-4))))
		}
		b.WriteByte('\n')
	}
	for i := 0; i < n; i++ {
		line(&s)
		line(&g)
	}
	td := &TextData{TrainSrc: filepath.Join(dir, "big.en.tok"), TrainTgt: filepath.Join(dir, "big.de.tok"), Vocab: testdata + "m_common.vocab", CacheDir: filepath.Join(dir, "cache")}
	os.WriteFile(td.TrainSrc, s.Bytes(), 0o644)
	os.WriteFile(td.TrainTgt, g.Bytes(), 0o644)
	return td
}

// entries lists a cache directory: its entries, and everything else
// (staging directories) but the lock.
func entries(t *testing.T, dir string) (ents, other []string) {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, de := range des {
		switch {
		case de.Name() == cacheLock:
		case de.IsDir() && !strings.HasPrefix(de.Name(), "."):
			ents = append(ents, de.Name())
		default:
			other = append(other, de.Name())
		}
	}
	return ents, other
}

// The second Open of unchanged files uses the first one's entry: it says
// so, prepares nothing (the counter), and the entry is the same
// directory, untouched (inode, modification time, source.json).
func TestTextCacheReused(t *testing.T) {
	td := sampleText(t)
	n0 := preparations.Load()
	c1, err := td.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c1.Reused || preparations.Load() != n0+1 || c1.Pairs != 8 {
		t.Fatalf("first Open: reused %v, %d preparations, %d pairs", c1.Reused, preparations.Load()-n0, c1.Pairs)
	}
	if want := fmt.Sprintf("data: prepared sample.en.tok + sample.de.tok (8 pairs) into %s in ", c1.Dir); !strings.HasPrefix(c1.Line, want) || !strings.HasSuffix(c1.Line, " s") {
		t.Errorf("line %q, want %q...", c1.Line, want)
	}
	if filepath.Dir(c1.Dir) != td.CacheDir || len(filepath.Base(c1.Dir)) != 16 {
		t.Errorf("entry %s, want a 16-digit name in %s", c1.Dir, td.CacheDir)
	}
	st1, _ := os.Stat(c1.Dir)
	meta1, _ := os.ReadFile(filepath.Join(c1.Dir, cacheMeta))
	c2, err := td.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := "data: using the prepared " + c1.Dir + " (sources unchanged)"; c2.Line != want || !c2.Reused || c2.Dir != c1.Dir || c2.Pairs != 8 {
		t.Errorf("second Open: %q (reused %v, %s, %d pairs), want %q", c2.Line, c2.Reused, c2.Dir, c2.Pairs, want)
	}
	if n := preparations.Load() - n0; n != 1 {
		t.Errorf("%d preparations for two Opens of the same files", n)
	}
	st2, _ := os.Stat(c1.Dir)
	meta2, _ := os.ReadFile(filepath.Join(c1.Dir, cacheMeta))
	if !os.SameFile(st1, st2) || !st1.ModTime().Equal(st2.ModTime()) || !bytes.Equal(meta1, meta2) {
		t.Errorf("the entry was replaced or touched by a run that should have used it")
	}
	if ents, other := entries(t, td.CacheDir); len(ents) != 1 || len(other) != 0 {
		t.Errorf("cache holds %v and %v", ents, other)
	}
	// Another path to the same bytes (a copy elsewhere, keeping the time)
	// is the same entry: the key is the files' identity, not their path.
	cp := *td
	cp.TrainSrc = filepath.Join(t.TempDir(), "copy.en")
	b, _ := os.ReadFile(td.TrainSrc)
	os.WriteFile(cp.TrainSrc, b, 0o644)
	fi, _ := os.Stat(td.TrainSrc)
	os.Chtimes(cp.TrainSrc, fi.ModTime(), fi.ModTime())
	if c3, err := cp.Open(context.Background()); err != nil || !c3.Reused || c3.Dir != c1.Dir {
		t.Errorf("a copy with the same size, time and bytes: %v, %+v", err, c3)
	}
}

// A changed source makes a new entry, and the entry of the earlier
// version of the same files goes; a file only touched is changed too. An
// entry of other files stays.
func TestTextCacheChanged(t *testing.T) {
	td := sampleText(t)
	c1, err := td.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// another corpus in the same cache
	other := sampleText(t)
	other.CacheDir = td.CacheDir
	other.EvalSrc, other.EvalTgt = "", ""
	co, err := other.Open(context.Background())
	if err != nil || co.Reused {
		t.Fatalf("other corpus: %v, %+v", err, co)
	}
	n0 := preparations.Load()
	for _, p := range []string{td.TrainSrc, td.TrainTgt} {
		f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
		f.WriteString("▁one ▁more ▁line\n")
		f.Close()
	}
	c2, err := td.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c2.Reused || c2.Dir == c1.Dir || c2.Pairs != 9 || preparations.Load() != n0+1 || !strings.HasPrefix(c2.Line, "data: prepared ") {
		t.Fatalf("after a change: %+v, %d preparations", c2, preparations.Load()-n0)
	}
	if _, err := os.Stat(c1.Dir); !os.IsNotExist(err) {
		t.Errorf("the stale entry %s is still there (%v)", c1.Dir, err)
	}
	// the same bytes, a new time: prepared again
	later := time.Now().Add(time.Hour)
	os.Chtimes(td.TrainTgt, later, later)
	c3, err := td.Open(context.Background())
	if err != nil || c3.Reused || c3.Dir == c2.Dir {
		t.Fatalf("after a touch: %v, %+v", err, c3)
	}
	ents, rest := entries(t, td.CacheDir)
	if len(ents) != 2 || len(rest) != 0 {
		t.Errorf("cache holds %v and %v, want the newest entry and the other corpus's", ents, rest)
	}
	if _, err := os.Stat(co.Dir); err != nil {
		t.Errorf("the other corpus's entry went: %v", err)
	}
}

// The trainer reads the cache's entry as --data: the same pairs, and,
// although the entry keeps every pair, the statistics of the pairs that
// --max-length lets in, as for a directory prepared with that limit.
func TestTextCacheCorpus(t *testing.T) {
	td := sampleText(t)
	o := optionsFor(t, "--preset", "tiny", "--max-length", "10", "--batch-tokens", "256")
	o.Text = td
	c, err := loadCorpus(context.Background(), o, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := t.TempDir()
	if _, err := data.Prepare(context.Background(), data.PrepareConfig{Out: dir, Src: td.TrainSrc, Tgt: td.TrainTgt, Vocab: td.Vocab, ValidSrc: td.EvalSrc, ValidTgt: td.EvalTgt, MaxLen: 10}); err != nil {
		t.Fatal(err)
	}
	o2 := o
	o2.Text, o2.Data = nil, dir
	want, err := loadCorpus(context.Background(), o2, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	g, w := c.Stats, want.Stats
	if g.Lines != 5 || g.Dropped != 3 || g.Lines != w.Lines || g.Dropped != w.Dropped || g.SrcTokens != w.SrcTokens || g.TgtTokens != w.TgtTokens {
		t.Errorf("cache: %d lines, %d dropped, %d+%d tokens; prepared with --max-length 10: %d, %d, %d+%d",
			g.Lines, g.Dropped, g.SrcTokens, g.TgtTokens, w.Lines, w.Dropped, w.SrcTokens, w.TgtTokens)
	}
	if len(c.Valid) != len(want.Valid) || c.VocabHash != want.VocabHash {
		t.Errorf("%d validation pairs, want %d", len(c.Valid), len(want.Valid))
	}
	if !strings.HasPrefix(c.Name, "sample.en.tok + sample.de.tok (5 pairs, from the cache "+td.CacheDir) {
		t.Errorf("name %q", c.Name)
	}
	a, b := rowsOf(next(t, c, 12)), rowsOf(next(t, want, 12))
	if len(a) == 0 || strings.Join(a, "|") != strings.Join(b, "|") {
		t.Errorf("the cache's batches differ from the prepared directory's:\n%v\n%v", a, b)
	}
	if cachedOf(c) == nil {
		t.Error("no cache entry recorded with the corpus")
	}
	c.Close()
}

func next(t *testing.T, c *corpus, steps int) (out []*transformer.Batch) {
	t.Helper()
	for i := 0; i < steps; i++ {
		bs, err := c.Train.Next()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, bs...)
	}
	return out
}

// helper starts this test binary as a helper process on td with extra
// environment variables.
func helper(t *testing.T, td *TextData, env ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	j, _ := json.Marshal(td)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "GORUN_CACHE_TEST_TEXT="+string(j)), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, &out
}

// Processes that start at once on one cache prepare once and all use the
// one entry; so do goroutines of one process.
func TestTextCacheConcurrent(t *testing.T) {
	td := bigText(t, 20000)
	start := filepath.Join(t.TempDir(), "go")
	const procs = 4
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for i := 0; i < procs; i++ {
		c, o := helper(t, td, "GORUN_CACHE_TEST_GO="+start)
		cmds, outs = append(cmds, c), append(outs, o)
	}
	os.WriteFile(start, nil, 0o644)
	prepared, dirs := 0, map[string]bool{}
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("process %d: %v\n%s", i, err, outs[i])
		}
		line := strings.TrimSpace(outs[i].String())
		t.Logf("process %d: %s", i, line)
		if strings.HasPrefix(line, "data: prepared ") {
			prepared++
		} else if !strings.HasPrefix(line, "data: using ") {
			t.Errorf("process %d: %q", i, line)
		}
		dirs[line[strings.Index(line, td.CacheDir):][:len(td.CacheDir)+17]] = true
	}
	if prepared != 1 || len(dirs) != 1 {
		t.Errorf("%d of %d processes prepared, into %v; want 1 into one entry", prepared, procs, dirs)
	}
	ents, other := entries(t, td.CacheDir)
	if len(ents) != 1 || len(other) != 0 {
		t.Errorf("cache holds %v and %v", ents, other)
	}

	// goroutines, on a fresh cache
	td.CacheDir = filepath.Join(t.TempDir(), "cache")
	n0 := preparations.Load()
	var wg sync.WaitGroup
	res := make([]*Cached, 8)
	errs := make([]error, len(res))
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = td.Open(context.Background())
		}()
	}
	wg.Wait()
	fresh := 0
	for i, c := range res {
		if errs[i] != nil {
			t.Fatalf("goroutine %d: %v", i, errs[i])
		}
		if !c.Reused {
			fresh++
		}
		if c.Dir != res[0].Dir || c.Pairs != 20000 {
			t.Errorf("goroutine %d: %s, %d pairs", i, c.Dir, c.Pairs)
		}
	}
	if n := preparations.Load() - n0; n != 1 || fresh != 1 {
		t.Errorf("%d preparations (%d not reused) by %d goroutines, want 1", n, fresh, len(res))
	}
}

// A preparer killed (SIGKILL) with its entry written but not published,
// holding the lock, while another process waits for it: the waiting
// process then takes the lock, removes the staging directory, prepares
// and succeeds; nothing half was ever published.
func TestTextCacheKilledPreparer(t *testing.T) {
	td := bigText(t, 2000)
	marker := filepath.Join(t.TempDir(), "prepared")
	a, aout := helper(t, td, "GORUN_CACHE_TEST_BLOCK="+marker)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the preparer never got to its entry:\n%s", aout)
		}
	}
	ents, staging := entries(t, td.CacheDir)
	if len(ents) != 0 || len(staging) != 1 || !strings.HasPrefix(staging[0], cacheStaging) {
		t.Fatalf("while preparing: entries %v, other %v; want one staging directory and no entry", ents, staging)
	}
	b, bout := helper(t, td) // waits for the lock
	a.Process.Signal(syscall.SIGKILL)
	a.Wait()
	if err := b.Wait(); err != nil {
		t.Fatalf("the process waiting for the killed one: %v\n%s", err, bout)
	}
	if line := bout.String(); !strings.HasPrefix(line, "data: prepared big.en.tok + big.de.tok (2,000 pairs) into ") {
		t.Errorf("the waiting process says %q", line)
	}
	ents, staging = entries(t, td.CacheDir)
	if len(ents) != 1 || len(staging) != 0 {
		t.Errorf("after: entries %v, other %v; want one entry and no staging directory", ents, staging)
	}
	if c, err := td.Open(context.Background()); err != nil || !c.Reused {
		t.Errorf("then: %v, %+v", err, c)
	}
}

// Bad input is one line naming the file (and line), and leaves nothing in
// the cache: no entry, no staging directory.
func TestTextCacheBadInput(t *testing.T) {
	dir := t.TempDir()
	w := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	two := w("two", "▁a ▁b\n▁c\n")
	three := w("three", "▁a\n▁b\n▁c\n")
	empty := w("empty", "")
	badUTF := w("bad", "▁a\n▁b \xff\n")
	badVocab := w("bad.vocab", "<pad>\t0\n</s>\t0\n<s>\t0\n<unk>\t0\n▁a\t-0\n▁a\t-1\n")
	vocab := testdata + "m_common.vocab"
	missing := filepath.Join(dir, "missing.tok")
	for _, c := range []struct {
		name string
		td   TextData
		want string
	}{
		{"missing", TextData{TrainSrc: missing, TrainTgt: two, Vocab: vocab}, "data: " + missing + " (the training source): no such file or directory"},
		{"missing eval", TextData{TrainSrc: two, TrainTgt: two, EvalSrc: two, EvalTgt: missing, Vocab: vocab}, "data: " + missing + " (the evaluation target): no such file or directory"},
		{"vocab unreadable", TextData{TrainSrc: two, TrainTgt: two, Vocab: dir}, "data: " + dir + " (the vocabulary): a directory, not a file"},
		{"vocab malformed", TextData{TrainSrc: two, TrainTgt: two, Vocab: badVocab}, "data: " + badVocab + ":6: duplicate piece \"▁a\" (first on line 5)"},
		{"line counts", TextData{TrainSrc: two, TrainTgt: three, Vocab: vocab}, "data: " + two + " has 2 lines but " + three + " has 3: the files are not parallel"},
		{"eval line counts", TextData{TrainSrc: two, TrainTgt: two, EvalSrc: three, EvalTgt: two, Vocab: vocab}, "data: " + three + " has 3 lines but " + two + " has 2: the files are not parallel"},
		{"empty", TextData{TrainSrc: two, TrainTgt: empty, Vocab: vocab}, "data: " + empty + " (the training target): empty file"},
		{"empty vocab", TextData{TrainSrc: two, TrainTgt: two, Vocab: empty}, "data: " + empty + " (the vocabulary): empty file"},
		{"utf-8", TextData{TrainSrc: badUTF, TrainTgt: two, Vocab: vocab}, "data: " + badUTF + ":2: invalid UTF-8"},
		{"no vocab", TextData{TrainSrc: two, TrainTgt: two}, "data: no vocabulary file given"},
		{"eval half", TextData{TrainSrc: two, TrainTgt: two, EvalSrc: two, Vocab: vocab}, "data: the evaluation source and target files go together"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.td.CacheDir = filepath.Join(t.TempDir(), "cache")
			o := optionsFor(t, "--preset", "tiny")
			o.Text = &c.td
			_, err := loadCorpus(context.Background(), o, 0, 1)
			if err == nil || !strings.HasPrefix(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %v\nwant    %s", err, c.want)
			}
			if ents, other := entries(t, c.td.CacheDir); len(ents) != 0 || len(other) != 0 {
				t.Errorf("the cache holds %v and %v after bad input", ents, other)
			}
		})
	}
}

// Ranks on two hosts with the same files (copies: other paths, other
// times, each host its own cache) train; with files that differ they are
// refused, every rank naming the file, the hosts and their ranks.
func TestTextCacheHostsDiffer(t *testing.T) {
	base := sampleText(t)
	copyTo := func(td *TextData, edit func(string) string) *TextData {
		dir := t.TempDir()
		out := *td
		out.CacheDir = filepath.Join(dir, "cache")
		for _, p := range []*string{&out.TrainSrc, &out.TrainTgt, &out.EvalSrc, &out.EvalTgt, &out.Vocab} {
			b, err := os.ReadFile(*p)
			if err != nil {
				t.Fatal(err)
			}
			s := string(b)
			if edit != nil && *p == td.TrainTgt {
				s = edit(s)
			}
			q := filepath.Join(dir, filepath.Base(*p))
			os.WriteFile(q, []byte(s), 0o644)
			*p = q
		}
		return &out
	}
	hosts := []string{"host-a", "host-a", "host-b", "host-b"}
	args := []string{"--preset", "tiny", "--max-length", "24", "--batch-tokens", "256", "--max-steps", "1", "--log-every", "1",
		"--eval-every", "0", "--eval-sentences", "0", "--checkpoint-every", "0", "--quiet", "--threads", "1", "--link-gbps", "10"}
	t.Run("same", func(t *testing.T) {
		texts := []*TextData{copyTo(base, nil), copyTo(base, nil)}
		outs, errs := runHosts(t, hosts, func(r int) Options {
			o := optionsFor(t, append(args, "--run-dir", filepath.Join(t.TempDir(), "run"))...)
			o.Text = texts[r/2]
			return o
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v\n%s", r, err, outs[r])
			}
		}
		t.Logf("rank 0:\n%s", outs[0])
		if !strings.Contains(outs[0], "data: prepared sample.en.tok + sample.de.tok (8 pairs) into "+texts[0].CacheDir) &&
			!strings.Contains(outs[0], "data: using "+texts[0].CacheDir) {
			t.Errorf("rank 0 does not say where its corpus is:\n%s", outs[0])
		}
		for r := 1; r < len(outs); r++ {
			if strings.Contains(outs[r], "data: ") {
				t.Errorf("rank %d printed its cache line:\n%s", r, outs[r])
			}
		}
	})
	for _, c := range []struct {
		name string
		edit func(string) string
		want string
	}{
		{"size", func(s string) string { return strings.Replace(s, "\n", " ▁mehr\n", 1) }, "the data files differ between hosts: the training target (sample.de.tok here) is 452 bytes on host-a (ranks 0, 1) and 460 bytes on host-b (ranks 2, 3); give every host the same files"},
		{"contents", func(s string) string { return strings.Replace(s, "▁Die", "▁die", 1) }, "the data files differ between hosts: the training target (sample.de.tok here) is 452 bytes (SHA-256 "},
	} {
		t.Run(c.name, func(t *testing.T) {
			texts := []*TextData{copyTo(base, nil), copyTo(base, c.edit)}
			outs, errs := runHosts(t, hosts, func(r int) Options {
				o := optionsFor(t, append(args, "--run-dir", filepath.Join(t.TempDir(), "run"))...)
				o.Text = texts[r/2]
				return o
			})
			t.Logf("rank 0: %v", errs[0])
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "on host-a (ranks 0, 1) and ") ||
					!strings.Contains(err.Error(), " on host-b (ranks 2, 3); give every host the same files") {
					t.Errorf("rank %d: %v\nwant %s\n%s", r, err, c.want, outs[r])
				}
			}
		})
	}
}

// runHosts runs len(hosts) ranks of one job in this process, rank r
// named as on hosts[r] (what GORUN_HOST gives a rank), each with its own
// options, and returns each rank's output and error; the error is the
// line the rank printed (run prints its error on stderr).
func runHosts(t *testing.T, hosts []string, opts func(r int) Options) ([]string, []error) {
	t.Helper()
	n := len(hosts)
	secret := make([]byte, 32)
	rand.Read(secret)
	rdv := net.JoinHostPort("127.0.0.1", testenv.FreeUDPPort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bufs := make([]bytes.Buffer, n)
	errs := make([]error, n)
	opt := make([]Options, n)
	for r := range opt {
		opt[r] = opts(r)
	}
	stderr, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = stderr
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := rank.Identity{Rank: r, Size: n, LocalRank: r, LocalSize: n, Rendezvous: rdv, JobID: "cache-test",
				Secret: secret, Launcher: "torchrun", ServeRendezvous: r == 0, Host: hosts[r]}
			errs[r] = run(ctx, opt[r], &bufs[r], id, openDefault)
		}()
	}
	wg.Wait()
	os.Stderr = old
	stderr.Close()
	printed, _ := os.ReadFile(stderr.Name())
	outs := make([]string, n)
	for r := range bufs {
		outs[r] = bufs[r].String()
		if errs[r] == ErrReported {
			errs[r] = fmt.Errorf("(not printed)")
			for _, l := range strings.Split(string(printed), "\n") {
				if p := fmt.Sprintf("nmt-train: rank %d: ", r); strings.HasPrefix(l, p) {
					errs[r] = errors.New(strings.TrimPrefix(l, p))
				}
			}
		}
	}
	return outs, errs
}

// The key's content part (what hosts compare) is the sizes and the first
// and last MiB's hashes: a copy elsewhere with a new time has the same
// content and another key (its own cache entry, as on another host); a
// change in the last MiB of a large file changes both. A change in the
// middle of a large file that keeps its size and time is not seen (the
// price of not reading gigabytes at every start).
func TestTextCacheIdentity(t *testing.T) {
	dir := t.TempDir()
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = byte('a' + i%26)
	}
	td := &TextData{TrainSrc: filepath.Join(dir, "a"), TrainTgt: filepath.Join(dir, "a"), Vocab: testdata + "m_common.vocab"}
	os.WriteFile(td.TrainSrc, big, 0o644)
	e1, err := td.identify()
	if err != nil {
		t.Fatal(err)
	}
	variant := func(name string, edit func([]byte), keepTime bool) *cacheEntry {
		b := append([]byte(nil), big...)
		edit(b)
		p := filepath.Join(dir, name)
		os.WriteFile(p, b, 0o644)
		when := time.Now().Add(time.Hour)
		if keepTime {
			fi, _ := os.Stat(td.TrainSrc)
			when = fi.ModTime()
		}
		os.Chtimes(p, when, when)
		v := *td
		v.TrainSrc, v.TrainTgt = p, p
		e, err := v.identify()
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	cp := variant("copy", func([]byte) {}, false)
	if contentOf(cp.Sources) != contentOf(e1.Sources) || cp.Key == e1.Key {
		t.Errorf("a copy with a new time: content %v, key %v; want the same content and another key",
			contentOf(cp.Sources) == contentOf(e1.Sources), cp.Key == e1.Key)
	}
	tail := variant("tail", func(b []byte) { b[len(b)-2] = 'Z' }, true)
	if contentOf(tail.Sources) == contentOf(e1.Sources) || tail.Key == e1.Key {
		t.Error("a change in the last MiB is not seen")
	}
	head := variant("head", func(b []byte) { b[5] = 'Z' }, true)
	if contentOf(head.Sources) == contentOf(e1.Sources) || head.Key == e1.Key {
		t.Error("a change in the first MiB is not seen")
	}
	middle := variant("middle", func(b []byte) { b[len(b)/2] = 'Z' }, true)
	if middle.Key != e1.Key {
		t.Error("a change in the middle is seen: update the doc comment and docs/data.md")
	}
}

// An entry that lost a file (a user cleaning up by hand) is not used: it
// is prepared again in its place.
func TestTextCacheDamagedEntry(t *testing.T) {
	td := sampleText(t)
	c1, err := td.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(c1.Dir, TrainFile))
	c2, err := td.Open(context.Background())
	if err != nil || c2.Reused || c2.Dir != c1.Dir {
		t.Fatalf("%v, %+v", err, c2)
	}
	if _, err := data.OpenCorpus(filepath.Join(c2.Dir, TrainFile)); err != nil {
		t.Fatal(err)
	}
	if ents, other := entries(t, td.CacheDir); len(ents) != 1 || len(other) != 0 {
		t.Errorf("cache holds %v and %v", ents, other)
	}
}

// A preparer killed (SIGKILL) in the middle of data.Prepare, its corpus
// half written in the staging directory: the next Open removes it,
// prepares and succeeds.
func TestTextCacheKilledMidPrepare(t *testing.T) {
	td := bigText(t, 200000) // about 2 s to prepare on the project's VM
	a, aout := helper(t, td)
	// kill it once it has written ids of the training corpus
	writing := func() bool {
		ids, _ := filepath.Glob(filepath.Join(td.CacheDir, cacheStaging+"*", ".prepare.tmp*", TrainFile+".src.tmp"))
		if len(ids) == 0 {
			return false
		}
		fi, err := os.Stat(ids[0])
		return err == nil && fi.Size() > 0
	}
	for deadline := time.Now().Add(2 * time.Minute); !writing(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) || a.ProcessState != nil {
			t.Fatalf("the preparer never wrote train.bin's ids:\n%s", aout)
		}
	}
	a.Process.Signal(syscall.SIGKILL)
	a.Wait()
	ents, staging := entries(t, td.CacheDir)
	if len(ents) != 0 {
		t.Skipf("the preparer published %v before it was killed: nothing to test", ents)
	}
	if len(staging) != 1 {
		t.Fatalf("after the kill: %v, want one staging directory", staging)
	}
	var files []string
	filepath.WalkDir(filepath.Join(td.CacheDir, staging[0]), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, strings.TrimPrefix(p, td.CacheDir))
		}
		return nil
	})
	t.Logf("killed with %v in the cache", files)
	c, err := td.Open(context.Background())
	if err != nil || c.Reused || c.Pairs != 200000 {
		t.Fatalf("after the kill: %v, %+v", err, c)
	}
	if ents, staging := entries(t, td.CacheDir); len(ents) != 1 || len(staging) != 0 {
		t.Errorf("then: entries %v, other %v", ents, staging)
	}
}
