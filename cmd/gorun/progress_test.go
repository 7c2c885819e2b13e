package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/gorun/gorun/internal/testenv"
)

// gorun on a terminal with a rank on a "remote" host (the real remote
// agent, through --launch-agent): the remote rank is told, its progress
// is drawn on gorun's bottom line (the test sees it drawn before the rank
// goes on), and its own line then replaces it; the screen at the end holds
// whole lines only. Not on a terminal, the same job's ranks are not told.
func TestProgressLineRemote(t *testing.T) {
	dir := t.TempDir()
	script := `echo "rank $GORUN_RANK progress line '$GORUN_PROGRESS_LINE'"
		if [ $GORUN_RANK = 1 ]; then
			printf '\rremote 1/2'
			while [ ! -e ` + dir + `/seen ]; do sleep 0.01; done
			printf '\rremote done\n'
		fi`
	args := []string{"-H", "localhost:1,127.0.0.2:1", "--launch-agent", agentSh, "/bin/sh", "-c", script}
	cmd := exec.Command(gorunBin, args...)
	cmd.Env = testEnv()
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	timer := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	var raw bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := ptmx.Read(buf)
		raw.Write(buf[:n])
		if strings.Contains(raw.String(), "\x1b[K[1] remote 1/2") {
			os.WriteFile(filepath.Join(dir, "seen"), nil, 0o644)
		}
		if err != nil { // EIO once gorun and its ranks are gone
			break
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v\n%q", err, raw.String())
	}
	out := raw.String()
	if !strings.Contains(out, "[1] remote 1/2\r\x1b[K[1] remote done\r\n") {
		t.Errorf("the remote rank's progress was not replaced by its line:\n%q", out)
	}
	screen := testenv.Screen(out)
	want := map[string]bool{"[0] rank 0 progress line '1'": true, "[1] rank 1 progress line '1'": true, "[1] remote done": true}
	for _, l := range screen {
		if !want[l] {
			t.Errorf("unexpected line on the screen: %q", l)
		}
		delete(want, l)
	}
	if len(want) > 0 {
		t.Errorf("lines missing from the screen: %v\nraw: %q", want, out)
	}

	os.WriteFile(filepath.Join(dir, "seen"), nil, 0o644)
	r := gorun(t, "", args...)
	if r.code != 0 || !strings.Contains(r.stdout, "[0] rank 0 progress line ''\n") || !strings.Contains(r.stdout, "[1] rank 1 progress line ''\n") {
		t.Errorf("not on a terminal: status %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}
