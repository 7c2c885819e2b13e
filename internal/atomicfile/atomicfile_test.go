package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// withUmask runs f under the umask mask and restores the old one.
func withUmask(mask int, f func()) {
	old := syscall.Umask(mask)
	defer syscall.Umask(old)
	f()
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// TestWriteFile: the bytes arrive, a new file gets 0644 less the umask, a
// replaced one keeps its mode, and no temporary file is left.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	for _, c := range []struct {
		umask int
		want  os.FileMode
	}{{0o022, 0o644}, {0o077, 0o600}, {0o002, 0o644}} {
		os.Remove(p)
		withUmask(c.umask, func() {
			if err := WriteFile(p, ".state.json.tmp*", []byte("one")); err != nil {
				t.Fatal(err)
			}
		})
		if got := mode(t, p); got != c.want {
			t.Errorf("umask %#o: new file mode %#o, want %#o", c.umask, got, c.want)
		}
	}
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	withUmask(0o077, func() {
		if err := WriteFile(p, ".state.json.tmp*", []byte("two")); err != nil {
			t.Fatal(err)
		}
	})
	if b, _ := os.ReadFile(p); string(b) != "two" {
		t.Errorf("content %q after the replacement", b)
	}
	if got := mode(t, p); got != 0o640 {
		t.Errorf("replaced file mode %#o, want the old 0640", got)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %d entries, want only state.json", len(ents))
	}
}

// TestWriteFileFails: a path that cannot be replaced (a directory) leaves
// it as it was and no temporary file behind.
func TestWriteFileFails(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "latest")
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, ".latest.tmp*", []byte("ckpt-1\n")); err == nil {
		t.Fatal("replacing a directory with a file succeeded")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || !ents[0].IsDir() {
		t.Errorf("after the failure the directory holds %v", ents)
	}
	if _, err := os.Stat(filepath.Join(p, "keep")); err != nil {
		t.Errorf("the directory's file is gone: %v", err)
	}
	if err := WriteFile(filepath.Join(dir, "nope", "x"), "x.tmp*", nil); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("a missing directory: %v", err)
	}
}

// TestMkdirTemp: new directories named by the pattern, 0755 less the
// umask, never the same one twice.
func TestMkdirTemp(t *testing.T) {
	dir := t.TempDir()
	seen := map[string]bool{}
	for i := 0; i < 20; i++ {
		var name string
		var err error
		withUmask(0o022, func() { name, err = MkdirTemp(dir, ".ckpt-5.tmp*") })
		if err != nil {
			t.Fatal(err)
		}
		if seen[name] || filepath.Dir(name) != dir || !strings.HasPrefix(filepath.Base(name), ".ckpt-5.tmp") {
			t.Fatalf("MkdirTemp gave %s", name)
		}
		seen[name] = true
		if got := mode(t, name); got != 0o755 {
			t.Fatalf("mode %#o, want 0755", got)
		}
	}
	if got := randomName("a*b"); !strings.HasPrefix(got, "a") || !strings.HasSuffix(got, "b") || len(got) < 3 {
		t.Errorf("randomName(a*b) = %q", got)
	}
}
