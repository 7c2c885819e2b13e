package mpirun

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSignalNoticesReachRanks: every rank, local or remote, has its signal
// notices on fd 3 (GORUN_SIGNAL_NOTICES=3), and a stop signal gorun
// forwards is announced there before it arrives: the rank's trap reads the
// byte (the signal's number) when the signal comes.
func TestSignalNoticesReachRanks(t *testing.T) {
	agent := sshLikeAgent(t)
	self, _ := os.Executable()
	sigs, o, e, done := runAsync(t, Config{Hosts: []Host{{Name: "localhost", Slots: 1}, {Name: "127.0.0.2", Slots: 2}},
		LaunchAgent: agent, RemoteGorun: self, Reaper: self, Tag: TagNone, Program: "/bin/sh", Args: []string{"-c", `
		trap 'n=$(head -c 1 <&3 | od -An -tu1 | tr -d " "); echo "rank $GORUN_RANK got TERM, notice ${n:-none} on fd ${GORUN_SIGNAL_NOTICES:-none}"; exit 0' TERM
		echo ready; while :; do sleep 0.05; done`}})
	waitFor(t, func() bool { return strings.Count(o.String(), "ready") == 3 })
	sigs <- syscall.SIGTERM
	code := <-done
	done <- code
	got := strings.Join(sortedLines(strings.ReplaceAll(o.String(), "ready\n", "")), "\n")
	want := "rank 0 got TERM, notice 15 on fd 3\nrank 1 got TERM, notice 15 on fd 3\nrank 2 got TERM, notice 15 on fd 3"
	if code != 128+15 || got != want {
		t.Fatalf("status %d (want 143), stdout:\n%s\nwant:\n%s\nstderr: %s", code, got, want, e.String())
	}
}

// TestStopSignalsCount: the rule a rank applies (nmt-train's second signal
// exits at once) on a real pipe: the first signal never counts as a
// second; a signal with its notice never does; two signals without one do.
func TestStopSignalsCount(t *testing.T) {
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	notice := func() { syscall.Write(p[1], []byte{byte(syscall.SIGTERM)}) }

	for _, c := range []struct {
		name  string
		steps string // d: a direct signal, g: gorun's (its notice, then the signal), n: a notice whose signal has not arrived yet
		want  string // what Again says at each signal
	}{
		{"one direct", "d", "-"},
		{"two direct (the user's second kill -TERM)", "dd", "-x"},
		{"gorun's, then a direct one (TERM to every process)", "gd", "--"},
		{"a direct one, then gorun's", "dg", "--"},
		{"gorun's notice already there at the direct one", "ndd", "--"}, // the second d is gorun's signal arriving
		{"gorun's twice (its second signal kills, not forwards; still no second)", "gg", "--"},
		{"TERM to everyone, then a direct second", "dgd", "--x"},
	} {
		c := c
		s := CountStopSignals(OpenSignalNotices(strconv.Itoa(p[0])))
		if s.notices.fd != p[0] {
			t.Fatalf("notices not opened from %s=%d", EnvSignalNotices, p[0])
		}
		var got []byte
		for _, step := range c.steps {
			switch step {
			case 'n':
				notice()
				continue
			case 'g':
				notice()
			}
			if s.Again() {
				got = append(got, 'x')
			} else {
				got = append(got, '-')
			}
		}
		if string(got) != c.want {
			t.Errorf("%s (%s): Again said %s, want %s", c.name, c.steps, got, c.want)
		}
		s.notices.Forwarded() // drain for the next case
	}

	if s := CountStopSignals(OpenSignalNotices("")); s.notices.fd != -1 || s.Again() || !s.Again() {
		t.Errorf("without notices: the second signal must count")
	}
	if s := CountStopSignals(nil); s.Again() || !s.Again() {
		t.Errorf("without notices (nil): the second signal must count")
	}
	// OpenSignalNotices opens the descriptor the variable's value names.
	if s := CountStopSignals(OpenSignalNotices(strconv.Itoa(p[0]))); s.notices.fd != p[0] {
		t.Errorf("notices not opened from %s=%d", EnvSignalNotices, p[0])
	}
	// An inherited variable naming a descriptor that is not a pipe is not used.
	f, err := os.CreateTemp(t.TempDir(), "x")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if s := OpenSignalNotices(strconv.Itoa(int(f.Fd()))); s.fd != -1 {
		t.Errorf("a regular file taken for the notices")
	}
}

// TestRunKilledStatus: a job stopped by a signal to gorun whose ranks do
// not stop in time: after --grace, gorun kills them, says so in one line
// and exits 137, not the clean stop's 128+N; a second signal does the same
// at once.
func TestRunKilledStatus(t *testing.T) {
	script := `trap 'echo "got TERM"' TERM; trap 'echo "got INT"' INT; echo ready; while :; do sleep 0.05; done`
	sigs, o, e, done := runAsync(t, Config{NP: 2, Grace: 300 * time.Millisecond, Program: "/bin/sh", Args: []string{"-c", script}})
	waitFor(t, func() bool { return strings.Count(o.String(), "ready") == 2 })
	sigs <- syscall.SIGTERM
	code := <-done
	done <- code
	gorunLines := regexp.MustCompile(`(?m)^gorun: .*$`).FindAllString(e.String(), -1)
	want := []string{
		"gorun: terminated: stopping the job: forwarded to every rank, which are killed if still running after --grace 300ms; a second signal kills them at once",
		"gorun: ranks 0, 1 killed with SIGKILL: still running 300ms after the stop began (--grace)",
	}
	if code != ExitKilled || fmt.Sprint(gorunLines) != fmt.Sprint(want) || strings.Count(o.String(), "got TERM") != 2 {
		t.Errorf("grace ran out: status %d (want 137), gorun's lines %q, want %q\nstdout %q", code, gorunLines, want, o.String())
	}
}
