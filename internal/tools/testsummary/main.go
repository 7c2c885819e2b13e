// Command testsummary reads `go test -json` on stdin and prints what a plain
// `go test` prints (each package's ok/FAIL line, and the output of tests
// that failed), then one line per skipped test with its reason, so that a
// skip cannot pass for a pass in `make test`'s output. It exits 1 when a
// test or a package failed (or the input had no package result at all).
//
//	go test -json ./... | go run ./internal/tools/testsummary
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

type skip struct{ pkg, test, why string }

func main() {
	os.Exit(run(os.Stdin, os.Stdout))
}

func run(in io.Reader, out io.Writer) int {
	var (
		outputs = map[string][]string{} // package/test -> its output lines
		skips   []skip
		failed  bool
		results int
	)
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintf(out, "%s\n", line) // not an event: the go command's own words
			continue
		}
		key := e.Package + "\x00" + e.Test
		switch e.Action {
		case "output":
			outputs[key] = append(outputs[key], e.Output)
		case "skip":
			if e.Test != "" {
				skips = append(skips, skip{e.Package, e.Test, reason(outputs[key])})
			} else {
				flush(out, outputs[key], func(l string) bool { return strings.HasPrefix(l, "?") || strings.HasPrefix(l, "ok") })
				results++
			}
			delete(outputs, key)
		case "pass":
			if e.Test == "" {
				flush(out, outputs[key], func(l string) bool { return strings.HasPrefix(l, "ok") })
				results++
			}
			delete(outputs, key)
		case "fail":
			failed = true
			if e.Test == "" {
				results++
				flush(out, outputs[key], func(string) bool { return true })
			} else {
				flush(out, outputs[key], func(l string) bool { return !strings.HasPrefix(l, "=== ") })
			}
			delete(outputs, key)
		}
	}
	if len(skips) > 0 {
		sort.Slice(skips, func(i, j int) bool {
			if skips[i].pkg != skips[j].pkg {
				return skips[i].pkg < skips[j].pkg
			}
			return skips[i].test < skips[j].test
		})
		fmt.Fprintf(out, "SKIPPED: %d test(s) did not run:\n", len(skips))
		for _, s := range skips {
			fmt.Fprintf(out, "  %s %s: %s\n", s.pkg, s.test, s.why)
		}
	}
	if failed || results == 0 {
		return 1
	}
	return 0
}

// flush prints the lines of output that keep selects.
func flush(out io.Writer, lines []string, keep func(string) bool) {
	for _, l := range lines {
		if keep(l) {
			fmt.Fprint(out, l)
		}
	}
}

// reason is a skipped test's message: its output without the framing lines.
func reason(lines []string) string {
	var r []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		r = append(r, t)
	}
	if len(r) == 0 {
		return "(no reason given)"
	}
	return strings.Join(r, " ")
}
