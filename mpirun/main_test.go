package mpirun

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
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
	cfg := AgentConfig{StdinRank: -1}
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
	code, err := Run(Config{Hosts: hosts, LaunchAgent: agent, RemoteGorun: self, Reaper: self,
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
	code, err = Run(Config{Hosts: hosts, LaunchAgent: agent, RemoteGorun: self, Reaper: self, Grace: time.Second,
		Program: "/bin/sh", Args: []string{"-c", `if [ $GORUN_RANK = 2 ]; then exit 4; fi; sleep 60`},
		StdinRank: -1, Stdout: &o, Stderr: &e})
	if err != nil || code != 4 || !regexp.MustCompile(`^gorun: rank 2 \(host 127\.0\.0\.2, pid \d+\) exited with status 4\n$`).MatchString(e.String()) {
		t.Fatalf("status %d, %v, stderr %q", code, err, e.String())
	}
}
