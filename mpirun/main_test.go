package mpirun

import (
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// The test binary doubles as gorun's remote agent and reaper (so that they
// run under the race detector too): the launch agent of these tests sets
// MPIRUN_TEST_AS_GORUN=1 and runs this binary as gorun.
func TestMain(m *testing.M) {
	if os.Getenv("MPIRUN_TEST_AS_GORUN") == "1" {
		os.Exit(asGorun(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// asGorun parses the hidden flags that gorun's CLI gives the agent and the
// reaper (cmd/gorun tests the real CLI).
func asGorun(args []string) int {
	cfg := AgentConfig{StdinRank: -1, Environ: os.Environ()}
	agent, reaper := false, false
	for len(args) > 0 {
		a := args[0]
		args = args[1:]
		switch a {
		case "--" + AgentFlag:
			agent = true
		case "--" + ReaperFlag:
			reaper = true
		case "--cuda-local":
			cfg.CUDALocal = true
		case "--grace", "--ranks", "--agent-stdin":
			v := args[0]
			args = args[1:]
			switch a {
			case "--grace":
				cfg.Grace, _ = time.ParseDuration(v)
			case "--ranks":
				cfg.Ranks, _ = ParseAgentRanks(v)
			default:
				cfg.StdinRank, _ = strconv.Atoi(v)
			}
		case "--":
			cfg.Prog, cfg.Args = args[0], args[1:]
			args = nil
		default:
			fmt.Fprintln(os.Stderr, "test gorun: unknown argument", a)
			return 2
		}
	}
	switch {
	case agent:
		return RunAgent(cfg, os.Stdin, os.Stdout, os.Stderr)
	case reaper:
		return RunReaper(cfg.Grace, os.Stdin)
	}
	return 2
}

// A job with a "remote" host (127.0.0.2, which no interface holds) through
// a launch agent, in this process: output, environment, stdin, a failure
// reported by the remote agent.
func TestRunRemoteInProcess(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent.sh")
	os.WriteFile(agent, []byte("#!/bin/sh\nexec env MPIRUN_TEST_AS_GORUN=1 /bin/sh -c \"$2\"\n"), 0o755)
	self, _ := os.Executable()
	hosts := []Host{{Name: "localhost", Slots: 1}, {Name: "127.0.0.2", Slots: 2}}
	os.Unsetenv("CUDA_VISIBLE_DEVICES")
	var o, e testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), Hosts: hosts, LaunchAgent: agent, RemoteGorun: self, Reaper: self,
		Program: "/bin/sh", Args: []string{"-c", `echo "$GORUN_RANK/$GORUN_SIZE $GORUN_LOCAL_RANK/$GORUN_LOCAL_SIZE $GORUN_NODE_RANK $GORUN_HOST $CUDA_VISIBLE_DEVICES ${#GORUN_SECRET} $(cat)"; printf "no newline $GORUN_RANK" >&2`},
		Export: []string{"A=1"}, Stdin: strings.NewReader("in"), StdinRank: 2, Stdout: &o, Stderr: &e})
	if err != nil || code != 0 {
		t.Fatalf("status %d, %v\n%s%s", code, err, o.String(), e.String())
	}
	want := "[0] 0/3 0/1 0 localhost 0 64 ,[1] 1/3 0/2 1 127.0.0.2 0 64 ,[2] 2/3 1/2 1 127.0.0.2 1 64 in"
	if got := strings.Join(sortedLines(o.String()), ","); got != want {
		t.Errorf("stdout\n%q\nwant\n%q", got, want)
	}
	if got := strings.Join(sortedLines(e.String()), ","); got != "[0] no newline 0,[1] no newline 1,[2] no newline 2" {
		t.Errorf("stderr %q", got)
	}

	o, e = testenv.Buffer{}, testenv.Buffer{}
	code, err = Run(Config{Environ: os.Environ(), Hosts: hosts, LaunchAgent: agent, RemoteGorun: self, Reaper: self, Grace: time.Second,
		Program: "/bin/sh", Args: []string{"-c", `if [ $GORUN_RANK = 2 ]; then exit 4; fi; sleep 60`},
		StdinRank: -1, Stdout: &o, Stderr: &e})
	if err != nil || code != 4 || !regexp.MustCompile(`^gorun: rank 2 \(host 127\.0\.0\.2, pid \d+\) exited with status 4\n$`).MatchString(e.String()) {
		t.Fatalf("status %d, %v, stderr %q", code, err, e.String())
	}
}

// sshLikeAgent writes a launch agent that runs the remote command with an
// empty environment, as ssh does (only PATH, and the switch that makes this
// test binary gorun's remote agent): what a remote rank sees is then only
// what gorun put on the remote command line.
func sshLikeAgent(t *testing.T) string {
	t.Helper()
	agent := filepath.Join(t.TempDir(), "agent.sh")
	if err := os.WriteFile(agent, []byte("#!/bin/sh\nexec env -i PATH=/usr/bin:/bin MPIRUN_TEST_AS_GORUN=1 /bin/sh -c \"$2\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return agent
}

// TestRunRemoteEnvLikeSSH: remote ranks get the mesh's tuning variables
// from gorun's environment (-x winning over them), the user's
// CUDA_VISIBLE_DEVICES, and GORUN_IFACE when --iface names an interface
// (not when it is an address of this machine); -x GORUN_IFACE wins over
// --iface; other variables of gorun's environment stay here.
func TestRunRemoteEnvLikeSSH(t *testing.T) {
	agent := sshLikeAgent(t)
	self, _ := os.Executable()
	for k, v := range map[string]string{"GORUN_TRANSPORT": "tcp", "GORUN_CONNS_PER_PEER": "3", "GORUN_TIMEOUT": "77s",
		"GORUN_TCP_CIPHER": "chacha", "GORUN_QUIC_GRO": "on", "CUDA_VISIBLE_DEVICES": "5", "MPIRUN_TEST_LOCAL": "here"} {
		t.Setenv(k, v)
	}
	hosts := []Host{{Name: "localhost", Slots: 1}, {Name: "127.0.0.2", Slots: 2}}
	run := func(iface string, export ...string) []string {
		t.Helper()
		var o, e testenv.Buffer
		code, err := Run(Config{Environ: os.Environ(), Hosts: hosts, LaunchAgent: agent, RemoteGorun: self, Reaper: self, Iface: iface, Export: export,
			Program: "/bin/sh", Args: []string{"-c", `echo "$GORUN_RANK t=$GORUN_TRANSPORT c=$GORUN_CONNS_PER_PEER to=$GORUN_TIMEOUT ci=$GORUN_TCP_CIPHER g=$GORUN_QUIC_GRO cuda=${CUDA_VISIBLE_DEVICES-unset} if=${GORUN_IFACE-unset} l=${MPIRUN_TEST_LOCAL-unset}"`},
			Tag: TagNone, StdinRank: -1, Stdout: &o, Stderr: &e})
		if err != nil || code != 0 {
			t.Fatalf("--iface %s -x %q: status %d, %v\n%s%s", iface, export, code, err, o.String(), e.String())
		}
		return sortedLines(o.String())
	}
	check := func(what string, got []string, want ...string) {
		t.Helper()
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: the ranks saw\n%s\nwant\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	check("--iface lo -x GORUN_TIMEOUT=99s", run("lo", "GORUN_TIMEOUT=99s"),
		"0 t=tcp c=3 to=99s ci=chacha g=on cuda=5 if=lo l=here",
		"1 t=tcp c=3 to=99s ci=chacha g=on cuda=5 if=lo l=unset",
		"2 t=tcp c=3 to=99s ci=chacha g=on cuda=5 if=lo l=unset")
	check("--iface 127.0.0.1 (an address: this machine only)", run("127.0.0.1"),
		"0 t=tcp c=3 to=77s ci=chacha g=on cuda=5 if=127.0.0.1 l=here",
		"1 t=tcp c=3 to=77s ci=chacha g=on cuda=5 if=unset l=unset",
		"2 t=tcp c=3 to=77s ci=chacha g=on cuda=5 if=unset l=unset")
	check("--iface lo -x GORUN_IFACE=myif -x CUDA_VISIBLE_DEVICES=7", run("lo", "GORUN_IFACE=myif", "CUDA_VISIBLE_DEVICES=7"),
		"0 t=tcp c=3 to=77s ci=chacha g=on cuda=7 if=myif l=here",
		"1 t=tcp c=3 to=77s ci=chacha g=on cuda=7 if=myif l=unset",
		"2 t=tcp c=3 to=77s ci=chacha g=on cuda=7 if=myif l=unset")
}

// TestRunRemoteRestartAndSignal: no rank of the first start has
// GORUN_RESTART_CAUSE (a rank that has it exits 7); after a remote rank's
// failure, every rank of the restarted job, remote ones included, sees
// GORUN_RESTART=1 and the failure's line in GORUN_RESTART_CAUSE; a remote rank that dies of a
// signal is reported as such, with status 128+N.
func TestRunRemoteRestartAndSignal(t *testing.T) {
	agent := sshLikeAgent(t)
	self, _ := os.Executable()
	hosts := []Host{{Name: "localhost", Slots: 1}, {Name: "127.0.0.2", Slots: 2}}
	var o, e testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), Hosts: hosts, LaunchAgent: agent, RemoteGorun: self, Reaper: self, MaxRestarts: 1,
		Program: "/bin/sh", Args: []string{"-c", `if [ $GORUN_RESTART = 0 ]; then
				if [ "${GORUN_RESTART_CAUSE+set}" = set ]; then exit 7; fi
				if [ $GORUN_RANK = 2 ]; then exit 6; fi
				exec sleep 60
			fi
			echo "$GORUN_RANK restart $GORUN_RESTART after: ${GORUN_RESTART_CAUSE-unset}"`},
		Tag: TagNone, StdinRank: -1, Stdout: &o, Stderr: &e})
	if err != nil || code != 0 {
		t.Fatalf("status %d, %v\n%s%s", code, err, o.String(), e.String())
	}
	got := sortedLines(o.String())
	if len(got) != 3 {
		t.Fatalf("stdout %q, want one line per rank of the restart", o.String())
	}
	for r, l := range got {
		re := regexp.MustCompile(fmt.Sprintf(`^%d restart 1 after: rank 2 \(host 127\.0\.0\.2, pid \d+\) exited with status 6$`, r))
		if !re.MatchString(l) {
			t.Errorf("rank %d saw %q, want GORUN_RESTART=1 and the cause", r, l)
		}
	}

	o, e = testenv.Buffer{}, testenv.Buffer{}
	code, err = Run(Config{Environ: os.Environ(), Hosts: hosts, LaunchAgent: agent, RemoteGorun: self, Reaper: self, Grace: time.Second,
		Program: "/bin/sh", Args: []string{"-c", `if [ $GORUN_RANK = 1 ]; then kill -SEGV $$; fi; exec sleep 60`},
		StdinRank: -1, Stdout: &o, Stderr: &e})
	if err != nil || code != 128+11 || !regexp.MustCompile(`^gorun: rank 1 \(host 127\.0\.0\.2, pid \d+\) killed by signal 11 \(segmentation fault\)\n$`).MatchString(e.String()) {
		t.Fatalf("a remote rank killed by SIGSEGV: status %d (want 139), %v, stderr %q", code, err, e.String())
	}
}

// TestRunGraceEndsInSIGKILL: after a failure, the other ranks, local and
// remote, get SIGTERM once and, if they ignore it, SIGKILL after --grace
// (not another SIGTERM), which gorun says in a line of its own; gorun's
// status stays the failed rank's.
func TestRunGraceEndsInSIGKILL(t *testing.T) {
	agent := sshLikeAgent(t)
	self, _ := os.Executable()
	dir := t.TempDir()
	var o, e testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), Hosts: []Host{{Name: "localhost", Slots: 1}, {Name: "127.0.0.2", Slots: 2}},
		LaunchAgent: agent, RemoteGorun: self, Reaper: self, Grace: 2 * time.Second,
		Program: "/bin/sh", Args: []string{"-c", `if [ $GORUN_RANK = 2 ]; then
				for i in $(seq 400); do [ -e ` + dir + `/ready.0 ] && [ -e ` + dir + `/ready.1 ] && break; sleep 0.05; done
				exit 3
			fi
			trap 'echo "got TERM"' TERM
			touch ` + dir + `/ready.$GORUN_RANK
			while :; do sleep 0.05; done`},
		StdinRank: -1, Stdout: &o, Stderr: &e})
	if err != nil || code != 3 {
		t.Fatalf("status %d (want 3), %v\n%s%s", code, err, o.String(), e.String())
	}
	for r := 0; r < 2; r++ {
		if n := strings.Count(o.String(), fmt.Sprintf("[%d] got TERM\n", r)); n != 1 {
			t.Errorf("rank %d got SIGTERM %d times, want once and then SIGKILL after --grace\nstdout:\n%s", r, n, o.String())
		}
	}
	// (the ranks' shells may say "Terminated" of their sleep)
	if m := regexp.MustCompile(`(?m)^gorun: .*$`).FindAllString(e.String(), -1); len(m) != 2 || !regexp.MustCompile(`^gorun: rank 2 \(host 127\.0\.0\.2, pid \d+\) exited with status 3$`).MatchString(m[0]) ||
		m[1] != "gorun: ranks 0, 1 killed with SIGKILL: still running 2s after the stop began (--grace)" {
		t.Errorf("stderr %q, want gorun's line naming rank 2, then its line about the kill", e.String())
	}
}

// TestAgentProtocol drives the remote agent as gorun does over ssh: the
// secret on the first line of its stdin, "i"/"e" for the stdin rank,
// "s RANK N" for one rank; frames come back on its stdout; the end of its
// stdin stops the ranks that are left. Without a well-formed secret it
// starts nothing.
func TestAgentProtocol(t *testing.T) {
	t.Setenv("MPIRUN_TEST_AS_GORUN", "1") // the agent's own reaper is this binary
	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	os.Unsetenv("CUDA_VISIBLE_DEVICES")
	gpus := t.TempDir()
	for _, n := range []string{"nvidia0", "nvidia1"} {
		os.WriteFile(filepath.Join(gpus, n), nil, 0o600)
	}
	old := devDir
	devDir = gpus
	defer func() { devDir = old }()

	for in, want := range map[string]string{"": "no job secret on stdin", "not-hex\n": "malformed job secret", "abcd\n": "malformed job secret"} {
		var o, e testenv.Buffer
		if code := RunAgent(AgentConfig{Ranks: []AgentRank{{0, 0}}, StdinRank: -1, Prog: "/bin/true", Environ: os.Environ()}, strings.NewReader(in), &o, &e); code != 127 || o.String() != "" || !strings.Contains(e.String(), want) {
			t.Errorf("stdin %q: status %d, frames %q, stderr %q; want 127, no frames, %q", in, code, o.String(), e.String(), want)
		}
	}

	ctlR, ctlW := io.Pipe()
	var out, errs testenv.Buffer
	done := make(chan int, 1)
	cfg := AgentConfig{Grace: 10 * time.Second, Ranks: []AgentRank{{5, 0}, {9, 3}}, StdinRank: 5, CUDALocal: true, Prog: "/bin/sh",
		Args:    []string{"-c", `trap 'echo usr1; exit 7' USR1; echo "r=$GORUN_RANK l=$GORUN_LOCAL_RANK cuda=$CUDA_VISIBLE_DEVICES s=${#GORUN_SECRET} in=$(cat)"; while :; do sleep 0.05; done`},
		Environ: os.Environ()}
	go func() { done <- RunAgent(cfg, ctlR, &out, &errs) }()
	t.Cleanup(func() { // on a failure, leave nothing running
		ctlW.Close()
		for _, ev := range agentFrames(t, out.String()).events {
			if f := strings.Fields(ev); f[0] == "started" {
				pid, _ := strconv.Atoi(f[2])
				syscall.Kill(-pid, syscall.SIGKILL)
			}
		}
	})
	send := func(l string) {
		if _, err := io.WriteString(ctlW, l+"\n"); err != nil {
			t.Fatalf("agent's stdin: %v", err)
		}
	}
	send(strings.Repeat("ab", 32))
	send("i 5 " + base64.StdEncoding.EncodeToString([]byte("hel")))
	send("i 5 " + base64.StdEncoding.EncodeToString([]byte("lo")))
	for _, junk := range []string{"", "s", "s x 9", "s 9", "s 9 99", "s 9 0", "i 9 aGk=", "bogus 1 2"} {
		send(junk) // ignored
	}
	send("e 5")
	waitFor(t, func() bool {
		f := agentFrames(t, out.String())
		return strings.Contains(f.stdout[5], "in=") && strings.Contains(f.stdout[9], "in=")
	})
	send(fmt.Sprintf("s 9 %d", int(syscall.SIGUSR1)))
	waitFor(t, func() bool { return slices.Contains(agentFrames(t, out.String()).events, "exit 9 7") })
	ctlW.Close() // gorun (or its ssh) is gone
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("agent status %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the agent did not stop its ranks when its stdin ended\nframes:\n%s", out.String())
	}
	f := agentFrames(t, out.String())
	if want := map[int]string{5: "r=5 l=0 cuda=0 s=64 in=hello\n", 9: "r=9 l=3 cuda=1 s=64 in=\nusr1\n"}; f.stdout[5] != want[5] || f.stdout[9] != want[9] {
		t.Errorf("ranks' stdout %v, want %v", f.stdout, want)
	}
	var ev []string
	for _, e := range f.events {
		if fs := strings.Fields(e); fs[0] == "started" && len(fs) == 3 {
			e = fs[0] + " " + fs[1] // the pid varies
		}
		ev = append(ev, e)
	}
	sort.Strings(ev)
	if got, want := strings.Join(ev, ","), "exit 9 7,signal 5 15,started 5,started 9"; got != want || !strings.HasPrefix(out.String(), "hello ") {
		t.Errorf("frames %q, want hello first, then %s\n%s", got, want, out.String())
	}
	if errs.String() != "" {
		t.Errorf("agent stderr %q", errs.String())
	}
}

// framesSeen is what the agent's stdout holds so far: each rank's stdout
// bytes and the other frames (hello aside), in order.
type framesSeen struct {
	stdout map[int]string
	events []string
}

func agentFrames(t *testing.T, s string) framesSeen {
	f := framesSeen{stdout: map[int]string{}}
	for s != "" {
		line, rest, ok := strings.Cut(s, "\n")
		if !ok {
			break // a frame still being written
		}
		fs := strings.Fields(line)
		if len(fs) == 3 && (fs[0] == "o" || fs[0] == "e") {
			r, _ := strconv.Atoi(fs[1])
			n, _ := strconv.Atoi(fs[2])
			if len(rest) < n {
				break
			}
			if fs[0] == "o" {
				f.stdout[r] += rest[:n]
			}
			s = rest[n:]
			continue
		}
		if len(fs) > 0 && fs[0] != "hello" {
			f.events = append(f.events, line)
		}
		s = rest
	}
	return f
}
