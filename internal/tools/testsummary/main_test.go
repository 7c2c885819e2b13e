package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSummary runs `go test -json` on a package made on the spot with a
// passing, a skipped and a failing test, and reads what testsummary makes
// of it.
func TestSummary(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/p\n\ngo 1.22\n")
	write("p_test.go", `package p

import "testing"

func TestPass(t *testing.T) { t.Log("quiet when it passes") }
func TestSkip(t *testing.T) { t.Skip("needs root for network namespaces") }
func TestSub(t *testing.T) {
	t.Run("a", func(t *testing.T) { t.Skip("no GPU") })
	t.Run("b", func(t *testing.T) {})
}
func TestFail(t *testing.T) { t.Fatal("wrong answer 41") }
`)
	cmd := exec.Command("go", "test", "-json", "-count=1", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	js, _ := cmd.Output() // fails: TestFail
	var out bytes.Buffer
	code := run(bytes.NewReader(js), &out)
	s := out.String()
	if code != 1 {
		t.Errorf("exit %d, want 1 (a test failed)", code)
	}
	for _, want := range []string{
		"wrong answer 41",
		"FAIL\texample.com/p",
		"SKIPPED: 2 test(s) did not run:",
		"  example.com/p TestSkip: p_test.go:6: needs root for network namespaces\n",
		"  example.com/p TestSub/a: p_test.go:8: no GPU\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "quiet when it passes") || strings.Contains(s, "=== RUN") {
		t.Errorf("output of passing tests shown:\n%s", s)
	}

	// all passing: exit 0, the package's ok line
	write("p_test.go", "package p\n\nimport \"testing\"\n\nfunc TestPass(t *testing.T) {}\n")
	cmd = exec.Command("go", "test", "-json", "-count=1", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	js, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run(bytes.NewReader(js), &out); code != 0 || !strings.HasPrefix(out.String(), "ok  \texample.com/p") {
		t.Errorf("exit %d, output %q", code, out.String())
	}
	// nothing at all (the go command failed before testing): a failure
	if code := run(strings.NewReader("go: no such package\n"), &out); code != 1 {
		t.Errorf("exit %d on no results, want 1", code)
	}
}
