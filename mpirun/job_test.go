package mpirun

import (
	"bytes"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

func sortedLines(s string) []string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) == 1 && ls[0] == "" {
		return nil
	}
	sort.Strings(ls)
	return ls
}

// runSh runs sh -c script as the ranks of a job in this process.
func runSh(t *testing.T, cfg Config, script string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e testenv.Buffer
	cfg.Program, cfg.Args = "/bin/sh", []string{"-c", script}
	cfg.Stdout, cfg.Stderr = &o, &e
	if cfg.Environ == nil {
		cfg.Environ = os.Environ() // gorun's environment: this test's
	}
	code, err := Run(cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return code, o.String(), e.String()
}

func TestRunEnvAndTags(t *testing.T) {
	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	os.Unsetenv("CUDA_VISIBLE_DEVICES")
	t.Setenv("GORUN_TEST_INHERIT", "inherited")
	code, out, errs := runSh(t, Config{NP: 3, Export: []string{"FOO=a b", "GORUN_TEST_INHERIT"}, StdinRank: -1},
		`echo "$GORUN_RANK/$GORUN_SIZE local $GORUN_LOCAL_RANK/$GORUN_LOCAL_SIZE node $GORUN_NODE_RANK host $GORUN_HOST cuda $CUDA_VISIBLE_DEVICES foo $FOO inh $GORUN_TEST_INHERIT secret ${#GORUN_SECRET}"; echo "err $GORUN_RANK" >&2`)
	if code != 0 {
		t.Fatalf("status %d\n%s%s", code, out, errs)
	}
	want := []string{
		"[0] 0/3 local 0/3 node 0 host localhost cuda 0 foo a b inh inherited secret 64",
		"[1] 1/3 local 1/3 node 0 host localhost cuda 1 foo a b inh inherited secret 64",
		"[2] 2/3 local 2/3 node 0 host localhost cuda 2 foo a b inh inherited secret 64",
	}
	if got := sortedLines(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("stdout:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := sortedLines(errs); strings.Join(got, ",") != "[0] err 0,[1] err 1,[2] err 2" {
		t.Fatalf("stderr: %q", errs)
	}
	// The user's CUDA_VISIBLE_DEVICES wins, from the environment or -x;
	// the mpirun tag style.
	t.Setenv("CUDA_VISIBLE_DEVICES", "5")
	_, out, errs = runSh(t, Config{NP: 2, Tag: TagMPI, StdinRank: -1}, `echo "cuda $CUDA_VISIBLE_DEVICES"; echo e >&2`)
	if got := strings.Join(sortedLines(out), ","); got != "[1,0]<stdout>:cuda 5,[1,1]<stdout>:cuda 5" {
		t.Fatalf("stdout %q", got)
	}
	if got := strings.Join(sortedLines(errs), ","); got != "[1,0]<stderr>:e,[1,1]<stderr>:e" {
		t.Fatalf("stderr %q", got)
	}
	_, out, _ = runSh(t, Config{NP: 1, Tag: TagNone, Export: []string{"CUDA_VISIBLE_DEVICES=2,3"}, StdinRank: -1}, `echo "cuda $CUDA_VISIBLE_DEVICES"`)
	if out != "cuda 2,3\n" {
		t.Fatalf("stdout %q", out)
	}
}

// TestRunEnvironIsInput: gorun's environment is Config.Environ, not the
// process's: the ranks start with it (of a name given twice, the last),
// -x NAME takes its value from it, its CUDA_VISIBLE_DEVICES is the user's;
// a variable only in the process's environment reaches no rank, and a nil
// Environ is an empty environment.
func TestRunEnvironIsInput(t *testing.T) {
	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	os.Unsetenv("CUDA_VISIBLE_DEVICES")
	t.Setenv("MPIRUN_TEST_PROCESS_ONLY", "process")
	environ := []string{"PATH=" + os.Getenv("PATH"), "MPIRUN_TEST_ENVIRON=first", "MPIRUN_TEST_X=x", "CUDA_VISIBLE_DEVICES=4", "MPIRUN_TEST_ENVIRON=given"}
	code, out, errs := runSh(t, Config{NP: 2, Environ: environ, Export: []string{"MPIRUN_TEST_X", "MPIRUN_TEST_PROCESS_ONLY"}, Tag: TagNone, StdinRank: -1},
		`echo "$GORUN_RANK ${MPIRUN_TEST_ENVIRON-unset} ${MPIRUN_TEST_PROCESS_ONLY-unset} ${MPIRUN_TEST_X-unset} cuda=${CUDA_VISIBLE_DEVICES-unset}"`)
	wantErr := "gorun: warning: -x MPIRUN_TEST_PROCESS_ONLY: MPIRUN_TEST_PROCESS_ONLY is not set in gorun's environment, so the ranks do not get it (mpirun warns and goes on too)\n"
	if got := strings.Join(sortedLines(out), ","); code != 0 || got != "0 given unset x cuda=4,1 given unset x cuda=4" || errs != wantErr {
		t.Errorf("status %d, stdout %q, stderr %q; want 0 given unset x cuda=4,1 given unset x cuda=4 and %q", code, got, errs, wantErr)
	}

	var o, e testenv.Buffer
	code, err := Run(Config{NP: 1, Program: "/bin/sh", Args: []string{"-c", `echo "$GORUN_RANK ${MPIRUN_TEST_PROCESS_ONLY-unset}"`},
		Tag: TagNone, StdinRank: -1, Stdout: &o, Stderr: &e})
	if err != nil || code != 0 || o.String() != "0 unset\n" || e.String() != "" {
		t.Errorf("nil Environ: status %d, %v, stdout %q, stderr %q; want the rank without the process's variables", code, err, o.String(), e.String())
	}
}

func TestLookupEnv(t *testing.T) {
	env := []string{"A=1", "B=", "A=2", "NOEQ", "C=x=y"}
	for _, c := range []struct {
		name, v string
		ok      bool
	}{{"A", "2", true}, {"B", "", true}, {"C", "x=y", true}, {"NOEQ", "", false}, {"D", "", false}} {
		if v, ok := LookupEnv(env, c.name); v != c.v || ok != c.ok || getenv(env, c.name) != c.v {
			t.Errorf("LookupEnv(%s) = %q, %v; want %q, %v", c.name, v, ok, c.v, c.ok)
		}
	}
	if v, ok := LookupEnv(nil, "A"); v != "" || ok {
		t.Errorf("LookupEnv(nil) = %q, %v", v, ok)
	}
}

func TestRunStdinGoesToRankZero(t *testing.T) {
	var o, e testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), NP: 2, Program: "/bin/sh", Args: []string{"-c", `n=$(wc -c); echo "rank $GORUN_RANK read $n bytes"`},
		Stdin: strings.NewReader("hello\nworld\n"), Stdout: &o, Stderr: &e})
	if err != nil || code != 0 {
		t.Fatalf("%d %v %s", code, err, e.String())
	}
	if got := strings.Join(sortedLines(o.String()), ","); got != "[0] rank 0 read 12 bytes,[1] rank 1 read 0 bytes" {
		t.Fatalf("stdout %q", got)
	}
}

func TestRunFirstFailureStopsJob(t *testing.T) {
	start := time.Now()
	// Rank 1 fails; the others would sleep for a minute; rank 2 ignores
	// SIGTERM and must be killed after the grace period.
	code, out, errs := runSh(t, Config{NP: 3, Grace: 500 * time.Millisecond, StdinRank: -1}, `
		case $GORUN_RANK in
		1) sleep 0.3; echo failing; exit 3;;
		2) trap "" TERM; echo ignoring; sleep 60;;
		*) sleep 60;;
		esac`)
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("job took %s", d)
	}
	if code != 3 {
		t.Fatalf("status %d, want 3\n%s%s", code, out, errs)
	}
	lines := strings.Split(strings.TrimSuffix(errs, "\n"), "\n")
	if len(lines) != 2 || !regexp.MustCompile(`^gorun: rank 1 \(host localhost, pid \d+\) exited with status 3$`).MatchString(lines[0]) ||
		lines[1] != "gorun: rank 2 killed with SIGKILL: still running 500ms after the stop began (--grace)" {
		t.Fatalf("stderr %q, want one line naming rank 1, then one about rank 2's kill", errs)
	}

	code, _, errs = runSh(t, Config{NP: 2, StdinRank: -1}, `if [ $GORUN_RANK = 1 ]; then kill -SEGV $$; fi; sleep 60`)
	if code != 128+11 || !strings.Contains(errs, "rank 1 (host localhost, pid ") || !strings.Contains(errs, "killed by signal 11 (segmentation fault)") {
		t.Fatalf("status %d, stderr %q", code, errs)
	}
	// A rank that exits 0 early is normal.
	code, _, errs = runSh(t, Config{NP: 2, StdinRank: -1}, `if [ $GORUN_RANK = 1 ]; then sleep 0.5; fi`)
	if code != 0 || errs != "" {
		t.Fatalf("status %d, stderr %q", code, errs)
	}
}

func TestRunSignalsAndTimeout(t *testing.T) {
	sigs := make(chan os.Signal, 1)
	var o, e testenv.Buffer
	done := make(chan int)
	go func() {
		code, _ := Run(Config{Environ: os.Environ(), NP: 2, Program: "/bin/sh", Args: []string{"-c", `trap 'echo "got INT"; exit 9' INT; echo ready; while :; do sleep 0.05; done`},
			Stdout: &o, Stderr: &e, Signals: sigs, StdinRank: -1})
		done <- code
	}()
	waitFor(t, func() bool { return strings.Count(o.String(), "ready") == 2 })
	sigs <- syscall.SIGINT
	select {
	case code := <-done:
		if code != 128+int(syscall.SIGINT) {
			t.Fatalf("status %d", code)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("job did not stop after SIGINT")
	}
	if got := strings.Join(sortedLines(o.String()), ","); got != "[0] got INT,[0] ready,[1] got INT,[1] ready" {
		t.Fatalf("stdout %q", got)
	}

	code, _, errs := runSh(t, Config{NP: 2, Timeout: 300 * time.Millisecond, StdinRank: -1}, `sleep 60`)
	if code != ExitTimeout || !strings.Contains(errs, "gorun: job timed out after 300ms (--timeout); stopping 2 ranks") {
		t.Fatalf("status %d, stderr %q", code, errs)
	}
}

func TestRunOutputDir(t *testing.T) {
	dir := t.TempDir()
	code, out, _ := runSh(t, Config{NP: 2, OutputDir: dir, StdinRank: -1}, `echo "out $GORUN_RANK"; printf "err $GORUN_RANK" >&2`)
	if code != 0 || !strings.Contains(out, "[1] out 1") {
		t.Fatalf("status %d, out %q", code, out)
	}
	for r := 0; r < 2; r++ {
		for stream, want := range map[string]string{"stdout": fmt.Sprintf("out %d\n", r), "stderr": fmt.Sprintf("err %d", r)} {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank.%d", r), stream))
			if err != nil || string(b) != want {
				t.Errorf("rank.%d/%s = %q, %v; want %q", r, stream, b, err, want)
			}
		}
	}
}

func TestRunBadInput(t *testing.T) {
	dir := t.TempDir()
	noexec := filepath.Join(dir, "noexec")
	os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644)
	cases := []struct {
		cfg  Config
		want string
	}{
		{Config{NP: 1}, "no program to run"},
		{Config{NP: 1, Program: filepath.Join(dir, "missing")}, "missing: no such file"},
		{Config{NP: 1, Program: noexec}, "noexec is not executable"},
		{Config{NP: 1, Program: dir}, "is a directory"},
		{Config{NP: 1, Program: "no-such-program-gorun"}, `program "no-such-program-gorun" not found in PATH`},
		{Config{NP: 3, Hosts: []Host{{Name: "localhost", Slots: 2}}, Program: "/bin/true"}, "-np 3 is more than the 2 slots of localhost:2"},
		{Config{NP: 1, Program: "/bin/true", Export: []string{"GORUN_RANK=3"}}, "gorun sets GORUN_RANK itself"},
		{Config{NP: 1, Program: "/bin/true", Export: []string{"1BAD=3"}}, "not a valid environment variable name"},
		{Config{NP: 1, Program: "/bin/true", MapBy: "socket"}, `--map-by "socket"`},
		{Config{NP: 1, Program: "/bin/true", Iface: "nosuchif0"}, `--iface "nosuchif0"`},
		{Config{NP: 1, Program: "/bin/true", RendezvousAddr: "0.0.0.0:1"}, "want an IP address the ranks can reach"},
		{Config{NP: 1, Program: "/bin/true", Hosts: []Host{{Name: "h1.invalid", Slots: 1}}, LaunchAgent: "'unterminated"}, "--launch-agent"},
		{Config{NP: 1, Program: "/bin/true", StdinRank: 4}, "--stdin 4"},
		{Config{NP: 2, Program: "/bin/true", StdinRank: 2}, "--stdin 2: the job has ranks 0..1"},
		{Config{NP: 1, Program: "/bin/true", Export: []string{"A=1", "A=2"}}, "-x A given twice"},
		{Config{NP: 1, Program: "/bin/true", Timeout: -time.Second}, "--timeout -1s is negative"},
		{Config{NP: 1, Program: "/bin/true", Hosts: []Host{{Name: "h1.invalid", Slots: 1}}, SSHPort: 65536}, "--ssh-port 65536: not a port"},
		{Config{NP: 1, Program: "/bin/true", Hosts: []Host{{Name: "a.invalid", Slots: 1}, {Name: "b.invalid", Slots: 1}}, PerNode: 1}, "-np 1 with -N 1 on 2 host(s): want -np 2"},
	}
	for _, c := range cases {
		var o, e testenv.Buffer
		c.cfg.Stdout, c.cfg.Stderr = &o, &e
		code, err := Run(c.cfg)
		if err == nil || code != ExitUsage || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: status %d, error %v; want status %d and %q", c.cfg, code, err, ExitUsage, c.want)
		}
		if o.String() != "" || e.String() != "" {
			t.Errorf("%+v: output %q %q", c.cfg, o.String(), e.String())
		}
	}
}

func TestDryRunRemote(t *testing.T) {
	var o testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), Hosts: []Host{{Name: "localhost", Slots: 1}, {Name: "node7.invalid", Slots: 2}},
		Program: "./prog", Args: []string{"--it's", "x y"}, Export: []string{"A=1"}, SSHPort: 2222, SSHArgs: "-F 'my cfg'",
		RemoteGorun: "/opt/gorun", Dir: "/tmp", DryRun: true, Stdout: &o, StdinRank: -1})
	if err == nil || !strings.Contains(err.Error(), "program ./prog: no such file") {
		t.Fatalf("a local rank with a missing program: %d %v", code, err)
	}
	// All ranks remote: the program is not checked here.
	code, err = Run(Config{Environ: os.Environ(), Hosts: []Host{{Name: "node7.invalid", Slots: 2}}, MapBy: MapByNode,
		Program: "./prog", Args: []string{"--it's", "x y"}, Export: []string{"A=1"}, SSHPort: 2222, SSHArgs: "-F 'my cfg'",
		RemoteGorun: "/opt/gorun", Dir: "/tmp", DryRun: true, Stdout: &o, StdinRank: -1})
	if err != nil || code != 0 {
		t.Fatalf("%d %v", code, err)
	}
	out := o.String()
	for _, want := range []string{
		"gorun: dry run: 2 ranks on 1 host, job ",
		"RANK  HOST           LOCAL RANK  LOCAL SIZE  NODE RANK  START\n0     node7.invalid  0           2           0          ssh\n1     node7.invalid  1           2           0          ssh\n",
		`[node7.invalid: ranks 0, 1] ssh -F 'my cfg' -o BatchMode=yes -o ConnectTimeout=10 -p 2222 node7.invalid 'cd /tmp && exec env A=1 GORUN_SIZE=2 GORUN_LOCAL_SIZE=2 GORUN_NODE_RANK=0 `,
		` GORUN_HOST=node7.invalid GORUN_RESTART=0 /opt/gorun --internal-remote-agent --grace 30s --ranks 0.0,1.1 --cuda-local -- /tmp/prog '\''--it'\''\'\'''\''s'\'' '\''x y'\'''   # job secret on stdin`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "[node7.invalid") && strings.Contains(l, "GORUN_SECRET") {
			t.Errorf("secret variable in the ssh command: %s", l)
		}
	}
	if regexp.MustCompile(`[0-9a-f]{64}`).MatchString(out) || strings.Count(out, "'GORUN_SECRET=<redacted>'") != 2 {
		t.Errorf("secret shown, or per-rank lines missing:\n%s", out)
	}
}

// The remote command survives two rounds of shell parsing (ssh runs it
// with the remote user's shell): check it with a real sh.
func TestShellQuote(t *testing.T) {
	words := []string{"plain", "", "a b", "it's", `"dq"`, "$HOME", "`x`", "a\\b", "new\nline", "*", "--x=1", "ü"}
	for _, w := range words {
		got, err := splitWords(shellQuote(w))
		if err != nil || len(got) != 1 || got[0] != w {
			t.Errorf("splitWords(shellQuote(%q)) = %q, %v", w, got, err)
		}
	}
	out, err := exec.Command("/bin/sh", "-c", "printf '%s|' "+shellJoin(words)).Output()
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != strings.Join(words, "|")+"|" {
		t.Fatalf("sh saw %q", out)
	}
	for _, c := range []struct {
		in   string
		want []string
	}{
		{`-F "my file" -o 'A=b c'  x\ y`, []string{"-F", "my file", "-o", "A=b c", "x y"}},
		{`"a\"b"`, []string{`a"b`}},
		{"", nil},
	} {
		got, err := splitWords(c.in)
		if err != nil || strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("splitWords(%q) = %q, %v", c.in, got, err)
		}
	}
	for _, bad := range []string{`'x`, `"x`, `x\`} {
		if _, err := splitWords(bad); err == nil {
			t.Errorf("splitWords(%q) accepted", bad)
		}
	}
}

func TestIsLocalHost(t *testing.T) {
	hn, _ := os.Hostname()
	for _, h := range []string{"localhost", "127.0.0.1", "::1", hn, strings.ToUpper(hn)} {
		if !IsLocalHost(h) {
			t.Errorf("%q is not local", h)
		}
	}
	for _, h := range []string{"127.0.0.2", "192.0.2.1", "node1.invalid", "10.255.255.254"} {
		if IsLocalHost(h) {
			t.Errorf("%q is local", h)
		}
	}
}

// Ranks writing long lines at once never mix inside a line; a line longer
// than LineCap is cut into tagged pieces; a last line without newline gets
// one.
func TestTaggerLines(t *testing.T) {
	var out testenv.Buffer
	s := &sink{w: &out}
	var wg sync.WaitGroup
	const lines = 300
	for r := 0; r < 3; r++ {
		pr, pw := io.Pipe()
		tg := &tagger{out: s, prefix: tagPrefix(TagRank, r, "stdout")}
		wg.Add(1)
		go func() { defer wg.Done(); tg.pump(pr) }()
		go func(r int) {
			rng := rand.New(rand.NewSource(int64(r)))
			var all []byte
			for i := 0; i < lines; i++ {
				all = append(all, bytes.Repeat([]byte{byte('a' + r)}, 1+rng.Intn(3000))...)
				all = append(all, '\n')
				if i == 10 { // a line of exactly LineCap bytes stays whole
					all = append(all, bytes.Repeat([]byte{byte('a' + r)}, LineCap)...)
					all = append(all, '\n')
				}
			}
			all = append(all, bytes.Repeat([]byte{'Z'}, LineCap+100)...) // no newline
			for len(all) > 0 {
				n := min(len(all), 1+rng.Intn(5000))
				pw.Write(all[:n])
				all = all[n:]
			}
			pw.Close()
		}(r)
	}
	wg.Wait()
	re := regexp.MustCompile(`^\[(\d)\] (a+|b+|c+|Z+)$`)
	count := map[string]int{}
	zs := map[string]int{}
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("mixed or untagged line: %.80q", l)
		}
		if m[2][0] == 'Z' {
			zs[m[1]] += len(m[2])
			continue
		}
		if int(m[2][0]-'a') != int(m[1][0]-'0') {
			t.Fatalf("rank %s wrote %c", m[1], m[2][0])
		}
		count[m[1]]++
	}
	for r := 0; r < 3; r++ {
		k := fmt.Sprint(r)
		if count[k] != lines+1 || zs[k] != LineCap+100 {
			t.Errorf("rank %d: %d lines, %d Z bytes", r, count[k], zs[k])
		}
	}
	if !strings.HasSuffix(out.String(), "\n") {
		t.Error("partial last line not ended")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRunIfaceAndRendezvousAddr(t *testing.T) {
	_, out, errs := runSh(t, Config{NP: 1, Iface: "lo", Tag: TagNone, StdinRank: -1}, `echo "$GORUN_IFACE $GORUN_RENDEZVOUS"`)
	if !regexp.MustCompile(`^lo 127\.0\.0\.1:\d+\n$`).MatchString(out) {
		t.Errorf("--iface lo: %q %q", out, errs)
	}
	_, out, errs = runSh(t, Config{NP: 1, RendezvousAddr: "127.0.0.1", Tag: TagNone, StdinRank: -1}, `echo "${GORUN_IFACE:-unset} $GORUN_RENDEZVOUS"`)
	if !regexp.MustCompile(`^unset 127\.0\.0\.1:[1-9]\d*\n$`).MatchString(out) {
		t.Errorf("--rendezvous-addr: %q %q", out, errs)
	}
}

// Two names of this machine are one host: local ranks count over both.
func TestRunLocalAliases(t *testing.T) {
	hn, _ := os.Hostname()
	_, out, errs := runSh(t, Config{Hosts: []Host{{Name: "localhost", Slots: 1}, {Name: "127.0.0.1", Slots: 1}, {Name: hn, Slots: 1}}, Tag: TagNone, StdinRank: -1},
		`echo "$GORUN_RANK $GORUN_LOCAL_RANK/$GORUN_LOCAL_SIZE $GORUN_NODE_RANK $GORUN_HOST"`)
	if got := strings.Join(sortedLines(out), ","); got != "0 0/3 0 localhost,1 1/3 0 localhost,2 2/3 0 localhost" {
		t.Errorf("got %q %q", got, errs)
	}
}

// TestRunMaxRestarts: a rank failure restarts the job, the ranks see the
// number of the start; a job that keeps failing ends after the last
// restart with the failure's status; without the flag nothing restarts.
func TestRunMaxRestarts(t *testing.T) {
	// Rank 1 fails on the first two starts (the file counts them), then
	// the job succeeds. It fails only once rank 0 has written its line of
	// that start (at most 10 s), else the restart could stop rank 0 before
	// it did.
	dir := t.TempDir()
	script := `echo "start $GORUN_RESTART$GORUN_RESTART_CAUSE" | sed 's/(host.*)//' >> ` + dir + `/rank$GORUN_RANK
		if [ $GORUN_RANK = 1 ] && [ $GORUN_RESTART -lt 2 ]; then
			for i in $(seq 100); do grep -q "^start $GORUN_RESTART" ` + dir + `/rank0 2>/dev/null && break; sleep 0.1; done
			exit 5
		fi
		if [ $GORUN_RANK = 0 ] && [ $GORUN_RESTART -lt 2 ]; then sleep 60; fi`
	code, _, errs := runSh(t, Config{NP: 2, MaxRestarts: 3, Grace: 500 * time.Millisecond, StdinRank: -1}, script)
	if code != 0 {
		t.Fatalf("status %d, stderr %q", code, errs)
	}
	for r := 0; r < 2; r++ {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank%d", r)))
		want := "start 0\nstart 1rank 1  exited with status 5\nstart 2rank 1  exited with status 5\n"
		if err != nil || string(b) != want {
			t.Fatalf("rank %d saw %q (%v), want %q: starts 0, 1, 2 and the causes", r, b, err, want)
		}
	}
	re := regexp.MustCompile(`(?m)^gorun: restarting the job \(restart (\d) of 3, GORUN_RESTART=\d\) after: rank 1 \(host localhost, pid \d+\) exited with status 5$`)
	if m := re.FindAllStringSubmatch(errs, -1); len(m) != 2 || m[0][1] != "1" || m[1][1] != "2" {
		t.Fatalf("stderr %q, want restarts 1 and 2 with their cause", errs)
	}

	// Out of restarts: the last failure's status.
	code, _, errs = runSh(t, Config{NP: 2, MaxRestarts: 1, StdinRank: -1}, `if [ $GORUN_RANK = 1 ]; then exit 7; fi; sleep 60`)
	if code != 7 || strings.Count(errs, "restarting the job") != 1 || len(regexp.MustCompile(`(?m)^gorun: rank 1 .* exited with status 7$`).FindAllString(errs, -1)) != 2 {
		t.Fatalf("status %d, stderr %q", code, errs)
	}
	// No flag: no restart, and the ranks see GORUN_RESTART=0.
	code, out, errs := runSh(t, Config{NP: 1, StdinRank: -1}, `echo "restart=$GORUN_RESTART"; exit 4`)
	if code != 4 || strings.Contains(errs, "restarting") || !strings.Contains(out, "restart=0") {
		t.Fatalf("status %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestPerNode: -N puts exactly N ranks on every host, whatever the slots,
// within max_slots.
func TestPerNode(t *testing.T) {
	hosts := []Host{{Name: "a.invalid", Slots: 1}, {Name: "b.invalid", Slots: 8}}
	p, err := prepare(Config{Environ: os.Environ(), Hosts: hosts, PerNode: 2, Program: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sp := range p.specs {
		got = append(got, fmt.Sprintf("%d@%s/%d", sp.slot.Rank, sp.slot.Host, sp.slot.LocalRank))
	}
	if s := strings.Join(got, " "); s != "0@a.invalid/0 1@a.invalid/1 2@b.invalid/0 3@b.invalid/1" {
		t.Fatalf("placement %s", s)
	}
	// --map-by node deals the ranks round-robin, still 2 on each host.
	p, err = prepare(Config{Environ: os.Environ(), Hosts: hosts, PerNode: 2, MapBy: MapByNode, Program: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, sp := range p.specs {
		got = append(got, fmt.Sprintf("%d@%s/%d", sp.slot.Rank, sp.slot.Host, sp.slot.LocalRank))
	}
	if s := strings.Join(got, " "); s != "0@a.invalid/0 1@b.invalid/0 2@a.invalid/1 3@b.invalid/1" {
		t.Fatalf("-N 2 --map-by node: placement %s", s)
	}
	// -N equal to max_slots fits.
	hosts[0].MaxSlots = 2
	if _, err := prepare(Config{Environ: os.Environ(), Hosts: hosts, PerNode: 2, Program: "/bin/true"}); err != nil {
		t.Fatalf("-N 2 on a host with max_slots=2: %v", err)
	}
	// Beyond it: an error naming the host's hostfile line.
	hosts, err = ParseHostfile("hosts", strings.NewReader("# cluster\na.invalid slots=1 max_slots=1\nb.invalid slots=8\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prepare(Config{Environ: os.Environ(), Hosts: hosts, PerNode: 2, Program: "/bin/true"}); err == nil || !strings.Contains(err.Error(), "-N 2: host a.invalid has max_slots=1 (hosts:2)") {
		t.Fatalf("max_slots: %v, want it to name hosts:2", err)
	}
	// -np other than N x hosts, smaller or larger, is refused.
	for _, np := range []int{1, 3, 5} {
		if _, err := prepare(Config{Environ: os.Environ(), Hosts: []Host{{Name: "a.invalid", Slots: 1}, {Name: "b.invalid", Slots: 1}}, PerNode: 2, NP: np, Program: "/bin/true"}); err == nil || !strings.Contains(err.Error(), "want -np 4") {
			t.Errorf("-np %d with -N 2 on 2 hosts: %v", np, err)
		}
	}
}

// TestLocalAliasesMergeMaxSlots: the names of this machine are one host
// whose slots and max_slots add up (no cap if one of them has none).
func TestLocalAliasesMergeMaxSlots(t *testing.T) {
	capped := []Host{{Name: "localhost", Slots: 1, MaxSlots: 2}, {Name: "127.0.0.1", Slots: 1, MaxSlots: 2}}
	p, err := prepare(Config{Environ: os.Environ(), Hosts: capped, NP: 4, Oversubscribe: true, Program: "/bin/true"})
	if err != nil {
		t.Fatalf("4 ranks on localhost max_slots=2 + 127.0.0.1 max_slots=2: %v", err)
	}
	for _, sp := range p.specs {
		if sp.slot.Host != "localhost" || sp.slot.LocalSize != 4 || sp.slot.NodeRank != 0 {
			t.Errorf("rank %d: %+v, want localhost with local size 4", sp.slot.Rank, sp.slot)
		}
	}
	if _, err := prepare(Config{Environ: os.Environ(), Hosts: capped, NP: 5, Oversubscribe: true, Program: "/bin/true"}); err == nil || !strings.Contains(err.Error(), "-np 5 is more than the 4 max_slots") {
		t.Errorf("5 ranks over max_slots 2+2: %v", err)
	}
	uncapped := []Host{{Name: "localhost", Slots: 1, MaxSlots: 2}, {Name: "127.0.0.1", Slots: 1}}
	if _, err := prepare(Config{Environ: os.Environ(), Hosts: uncapped, NP: 9, Oversubscribe: true, Program: "/bin/true"}); err != nil {
		t.Errorf("max_slots merged with a host without a cap: %v", err)
	}
}

// runAsync runs a job in the background; the job ends with the test
// (SIGKILL to every rank) if the test fails before it does.
func runAsync(t *testing.T, cfg Config) (sigs chan os.Signal, o, e *testenv.Buffer, done chan int) {
	t.Helper()
	sigs, o, e, done = make(chan os.Signal, 4), &testenv.Buffer{}, &testenv.Buffer{}, make(chan int, 1)
	cfg.Signals, cfg.Stdout, cfg.Stderr, cfg.StdinRank = sigs, o, e, -1
	if cfg.Environ == nil {
		cfg.Environ = os.Environ() // gorun's environment: this test's
	}
	go func() {
		code, err := Run(cfg)
		if err != nil {
			code = -1
		}
		done <- code
	}()
	t.Cleanup(func() {
		select {
		case code := <-done:
			done <- code
		default:
			sigs <- syscall.SIGKILL
			sigs <- syscall.SIGKILL
			<-done
		}
	})
	return sigs, o, e, done
}

// TestRunSecondSignalKills: the first SIGINT to gorun reaches every rank;
// a second one kills them at once (it is not forwarded, and gorun does not
// wait for --grace); gorun says so, and the status is 137 (ExitKilled),
// not the clean stop's 128+SIGINT.
func TestRunSecondSignalKills(t *testing.T) {
	sigs, o, e, done := runAsync(t, Config{NP: 2, Grace: 10 * time.Second, Program: "/bin/sh",
		Args: []string{"-c", `trap 'echo "got INT"' INT; echo ready; while :; do sleep 0.05; done`}})
	waitFor(t, func() bool { return strings.Count(o.String(), "ready") == 2 })
	sigs <- syscall.SIGINT
	waitFor(t, func() bool { return strings.Count(o.String(), "got INT") == 2 })
	sigs <- syscall.SIGINT
	code := <-done
	done <- code
	if code != ExitKilled {
		t.Errorf("status %d, want 137", code)
	}
	if want := "gorun: ranks 0, 1 killed with SIGKILL at a second signal (interrupt)\n"; !strings.HasSuffix(e.String(), want) {
		t.Errorf("stderr %q, want it to end with %q", e.String(), want)
	}
	if got := strings.Join(sortedLines(o.String()), ","); got != "[0] got INT,[0] ready,[1] got INT,[1] ready" {
		t.Errorf("stdout %q: the second SIGINT must kill the ranks, not reach them\nstderr %q", got, e.String())
	}
}

// TestRunNoRestartAfterTimeoutOrSignal: --max-restarts restarts after a
// rank's failure only: --timeout, or a signal to gorun (even one that
// comes while the job stops after a failure), ends the job.
func TestRunNoRestartAfterTimeoutOrSignal(t *testing.T) {
	code, _, errs := runSh(t, Config{NP: 2, MaxRestarts: 2, Timeout: 300 * time.Millisecond, StdinRank: -1},
		`if [ $GORUN_RESTART = 0 ]; then exec sleep 60; fi`)
	if code != ExitTimeout || strings.Contains(errs, "restarting") || !strings.Contains(errs, "gorun: job timed out after 300ms (--timeout)") {
		t.Errorf("--timeout with --max-restarts 2: status %d (want 124, no restart), stderr %q", code, errs)
	}

	// Rank 1 fails; rank 0 ignores SIGTERM, so the job is still stopping
	// when SIGINT comes.
	dir := t.TempDir()
	sigs, _, e, done := runAsync(t, Config{NP: 2, MaxRestarts: 2, Grace: 30 * time.Second, Program: "/bin/sh", Args: []string{"-c", `
		if [ $GORUN_RESTART != 0 ]; then exit 0; fi
		if [ $GORUN_RANK = 1 ]; then
			for i in $(seq 400); do [ -e ` + dir + `/ready ] && break; sleep 0.05; done
			exit 3
		fi
		trap '' TERM
		touch ` + dir + `/ready
		while :; do sleep 0.05; done`}})
	waitFor(t, func() bool { return strings.Contains(e.String(), "exited with status 3") })
	sigs <- syscall.SIGINT
	code = <-done
	done <- code
	if code != 3 || strings.Contains(e.String(), "restarting") {
		t.Errorf("SIGINT while stopping after a failure: status %d (want 3, the failure's, and no restart), stderr %q", code, e.String())
	}
}
