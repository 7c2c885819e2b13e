package report

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

func (r *report) datasetSection() {
	d := r.ri.Dataset
	r.w("## How big was the training set?\n\n")
	size := fmt.Sprintf("**%.1f MB** on disk", d.MB)
	if d.InMemory {
		size = fmt.Sprintf("made in memory at start (no file; %.1f MB of text)", d.MB)
	}
	r.w("- `%s`: %s, **%s lines** (sentence pairs), %s source and %s target tokens; %s lines dropped (too long or empty).\n\n",
		orStr(d.Name, "corpus"), size, Commas(d.Lines), Commas(d.SrcTokens), Commas(d.TgtTokens), Commas(d.Dropped))
}

func describeCheckpoints(dir string) string {
	entries, _ := filepath.Glob(filepath.Join(dir, "ckpt-*"))
	sort.Strings(entries)
	if len(entries) == 0 {
		return "- No checkpoint was written in this run.\n"
	}
	var b strings.Builder
	latestB, _ := os.ReadFile(filepath.Join(dir, "latest"))
	latest := strings.TrimSpace(string(latestB))
	fmt.Fprintf(&b, "- %d checkpoint(s) kept; `latest` points to `%s`.\n", len(entries), latest)
	// the one latest names; without it the newest (by step: ckpt-12 sorts
	// before ckpt-6)
	last := filepath.Join(dir, latest)
	if st, err := os.Stat(last); latest == "" || err != nil || !st.IsDir() {
		step := func(p string) int {
			n, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(p), "ckpt-"))
			return n
		}
		last = slices.MaxFunc(entries, func(a, b string) int { return step(a) - step(b) })
	}
	files, _ := os.ReadDir(last)
	var total int64
	fmt.Fprintf(&b, "- `%s` holds:\n\n| file | bytes |\n|---|---|\n", filepath.Base(last))
	for _, f := range files {
		info, err := f.Info()
		if err != nil {
			continue
		}
		total += info.Size()
		fmt.Fprintf(&b, "| %s | %s |\n", f.Name(), Commas(info.Size()))
	}
	fmt.Fprintf(&b, "| **total** | **%s** (%.1f MB) |\n", Commas(total), float64(total)/1e6)
	return b.String()
}
