package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	binDir   string
	gorunBin string
	ringBin  string
	agentSh  string // stand-in launch agent: runs the remote command here
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gorun-test")
	if err != nil {
		panic(err)
	}
	binDir = dir
	gorunBin = filepath.Join(dir, "gorun")
	ringBin = filepath.Join(dir, "ring")
	for _, b := range [][2]string{{gorunBin, "."}, {ringBin, "../../examples/ring"}} {
		cmd := exec.Command("go", "build", "-o", b[0], b[1])
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", b[1], err, out)
			os.Exit(1)
		}
	}
	// The agent logs its arguments (one file per call) and ignores the
	// host, as a cluster's own launch agent would reach it.
	agentSh = filepath.Join(dir, "agent.sh")
	os.WriteFile(agentSh, []byte("#!/bin/sh\nprintf '%s\\n' \"$1\" \"$2\" > \""+dir+"/agent-call.$$\"\nexec /bin/sh -c \"$2\"\n"), 0o755)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
}

// gorun runs the gorun binary to completion (with a safety limit).
func gorun(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return gorunEnv(t, testEnv(), stdin, args...)
}

// gorunEnv is gorun with the environment env.
func gorunEnv(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	cmd := exec.Command(gorunBin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	err := cmd.Wait()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return result{code, o.String(), e.String()}
}

// testEnv is the test's environment without any rank variables.
func testEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GORUN_") && !strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") {
			env = append(env, kv)
		}
	}
	return env
}

func checkNoPanic(t *testing.T, r result) {
	t.Helper()
	if strings.Contains(r.stderr, "panic") || strings.Contains(r.stderr, "goroutine ") {
		t.Fatalf("Go panic trace:\n%s", r.stderr)
	}
}

func TestRing(t *testing.T) {
	for _, np := range []int{1, 4, 8} {
		t.Run(fmt.Sprint(np), func(t *testing.T) {
			r := gorun(t, "", "-np", fmt.Sprint(np), ringBin, "-timeout", "40s")
			if r.code != 0 {
				t.Fatalf("status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
			}
			tagged := regexp.MustCompile(`^\[(\d+)\] `)
			seen := map[int]bool{}
			for _, l := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
				m := tagged.FindStringSubmatch(l)
				if m == nil {
					t.Fatalf("untagged line %q", l)
				}
				rk, _ := strconv.Atoi(m[1])
				if strings.Contains(l, "barrier passed") {
					if !strings.Contains(l, fmt.Sprintf("rank %d of %d ", rk, np)) {
						t.Errorf("line tagged [%d] from another rank: %q", rk, l)
					}
					seen[rk] = true
				}
			}
			if len(seen) != np {
				t.Fatalf("%d of %d ranks passed the barrier:\n%s", len(seen), np, r.stdout)
			}
			if !strings.Contains(r.stdout, fmt.Sprintf("[0] ring: token of 8 bytes went 3 times around %d ranks", np)) {
				t.Errorf("no token line:\n%s", r.stdout)
			}
		})
	}
}

func TestFlagsAndProgramArgs(t *testing.T) {
	// Both dash styles; everything after the program is the program's.
	for _, np := range [][]string{{"-np", "2"}, {"--np", "2"}, {"--np=2"}, {"-n", "2"}} {
		args := append(np, "/bin/sh", "-c", `echo "$GORUN_SIZE:$*"`, "sh", "-x", "1", "--np", "3", "--")
		r := gorun(t, "", args...)
		if r.code != 0 || r.stdout != "[0] 2:-x 1 --np 3 --\n[1] 2:-x 1 --np 3 --\n" && r.stdout != "[1] 2:-x 1 --np 3 --\n[0] 2:-x 1 --np 3 --\n" {
			t.Errorf("%q: status %d stdout %q stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
	r := gorun(t, "", "-np", "1", "--", "/bin/echo", "-np")
	if r.code != 0 || r.stdout != "[0] -np\n" {
		t.Errorf("after --: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = gorun(t, "", "-np", "2", "hostname")
	host, _ := os.Hostname()
	if r.code != 0 || !strings.Contains(r.stdout, "[0] "+host+"\n") || !strings.Contains(r.stdout, "[1] "+host+"\n") {
		t.Errorf("hostname: %d %q %q", r.code, r.stdout, r.stderr)
	}
	// --tag-output, -x, CUDA_VISIBLE_DEVICES, -H with the default -np.
	r = gorun(t, "", "-H", "localhost:2", "--tag-output", "-x", "FOO=bar baz", "/bin/sh", "-c", `echo "$FOO|$CUDA_VISIBLE_DEVICES|$GORUN_SIZE"`)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	sort.Strings(lines)
	if r.code != 0 || strings.Join(lines, ",") != "[1,0]<stdout>:bar baz|0|2,[1,1]<stdout>:bar baz|1|2" {
		t.Errorf("tag-output: %d %q %q", r.code, r.stdout, r.stderr)
	}
	// stdin reaches rank 0 only.
	r = gorun(t, "line one\nline two\n", "-np", "2", "/bin/sh", "-c", `echo "$GORUN_RANK got $(wc -l) lines"`)
	lines = strings.Split(strings.TrimSpace(r.stdout), "\n")
	sort.Strings(lines)
	if r.code != 0 || strings.Join(lines, ",") != "[0] 0 got 2 lines,[1] 1 got 0 lines" {
		t.Errorf("stdin: %d %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestOutputDirAndDryRun(t *testing.T) {
	dir := t.TempDir()
	r := gorun(t, "", "-np", "2", "--output-dir", dir, "/bin/sh", "-c", `echo "to out $GORUN_RANK"; echo "to err $GORUN_RANK" >&2`)
	if r.code != 0 {
		t.Fatalf("%d %q", r.code, r.stderr)
	}
	for rk := 0; rk < 2; rk++ {
		for _, s := range []string{"stdout", "stderr"} {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank.%d", rk), s))
			want := fmt.Sprintf("to %s %d\n", s[3:], rk)
			if err != nil || string(b) != want {
				t.Errorf("rank.%d/%s: %q %v, want %q", rk, s, b, err, want)
			}
		}
	}
	if !strings.Contains(r.stderr, "[1] to err 1\n") {
		t.Errorf("stderr not tagged: %q", r.stderr)
	}

	marker := filepath.Join(dir, "started")
	r = gorun(t, "", "--dry-run", "-H", "localhost:2,127.0.0.2:1", "--launch-agent", agentSh, "/bin/sh", "-c", "touch "+marker)
	if r.code != 0 {
		t.Fatalf("dry run: %d %q", r.code, r.stderr)
	}
	for _, want := range []string{
		"gorun: dry run: 3 ranks on 2 hosts, job ",
		"RANK  HOST       LOCAL RANK  LOCAL SIZE  NODE RANK  START\n",
		"0     localhost  0           2           0          exec\n",
		"1     localhost  1           2           0          exec\n",
		"2     127.0.0.2  0           1           1          launch-agent\n",
		"[0] cd ", "GORUN_RANK=0 ", "'GORUN_SECRET=<redacted>' /bin/sh -c 'touch ",
		"[127.0.0.2: rank 2] " + agentSh + " 127.0.0.2 'cd ", "--internal-remote-agent --grace 30s --ranks 2.0 --cuda-local -- /bin/sh -c", "# job secret on stdin",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dry run lacks %q:\n%s", want, r.stdout)
		}
	}
	if !strings.Contains(r.stdout, "[2] the agent on 127.0.0.2 adds to the host's environment and runs: env GORUN_RANK=2 GORUN_LOCAL_RANK=0 CUDA_VISIBLE_DEVICES=0 'GORUN_SECRET=<redacted>' /bin/sh -c 'touch ") {
		t.Errorf("no per-rank line for the remote rank:\n%s", r.stdout)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("--dry-run started the program")
	}
	// --map-by node and --oversubscribe reach the placement.
	r = gorun(t, "", "--dry-run", "-np", "5", "--oversubscribe", "--map-by", "node", "-H", "localhost:2,127.0.0.2:1", "/bin/true")
	var table []string
	for _, l := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(l); len(f) == 6 && f[0] != "RANK" {
			table = append(table, f[1]+"/"+f[2])
		}
	}
	if r.code != 0 || strings.Join(table, " ") != "localhost/0 127.0.0.2/0 localhost/1 localhost/2 127.0.0.2/1" {
		t.Errorf("map-by node, oversubscribed: %q\n%s%s", table, r.stdout, r.stderr)
	}
	if regexp.MustCompile(`[0-9a-f]{64}`).MatchString(r.stdout) {
		t.Errorf("dry run shows something like a secret:\n%s", r.stdout)
	}
}

// job is a gorun started in the background, with its output collected.
type job struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stdout bytes.Buffer
	stderr bytes.Buffer
	done   chan struct{}
	code   int
}

func startJob(t *testing.T, args ...string) *job {
	t.Helper()
	j := &job{cmd: exec.Command(gorunBin, args...), done: make(chan struct{})}
	j.start(t)
	return j
}

// start starts j's command with the test's environment and collects its
// output.
func (j *job) start(t *testing.T) {
	t.Helper()
	j.cmd.Env = testEnv()
	so, _ := j.cmd.StdoutPipe()
	se, _ := j.cmd.StderrPipe()
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, p := range []struct {
		r io.Reader
		b *bytes.Buffer
	}{{so, &j.stdout}, {se, &j.stderr}} {
		wg.Add(1)
		go func(r io.Reader, b *bytes.Buffer) {
			defer wg.Done()
			sc := bufio.NewScanner(r)
			for sc.Scan() {
				j.mu.Lock()
				b.WriteString(sc.Text() + "\n")
				j.mu.Unlock()
			}
		}(p.r, p.b)
	}
	go func() {
		wg.Wait()
		err := j.cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			j.code = ee.ExitCode()
		}
		close(j.done)
	}()
	t.Cleanup(func() {
		select {
		case <-j.done:
		default:
			j.cmd.Process.Kill()
			<-j.done
		}
	})
}

func (j *job) out() (string, string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.stdout.String(), j.stderr.String()
}

func (j *job) waitOutput(t *testing.T, substr string, count int) {
	t.Helper()
	deadline := time.Now().Add(40 * time.Second)
	for {
		o, e := j.out()
		if strings.Count(o, substr) >= count {
			return
		}
		select {
		case <-j.done:
			t.Fatalf("gorun exited (%d) before printing %q %d times\nstdout:\n%s\nstderr:\n%s", j.code, substr, count, o, e)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q after 40s\nstdout:\n%s\nstderr:\n%s", substr, o, e)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (j *job) wait(t *testing.T, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-j.done:
		return time.Since(start)
	case <-time.After(limit):
		o, e := j.out()
		t.Fatalf("gorun still running after %s\nstdout:\n%s\nstderr:\n%s", limit, o, e)
	}
	return 0
}

// procInfo is one process of this machine, from /proc.
type procInfo struct {
	pid, ppid, pgrp int
	env             map[string]string
	cmdline         []byte
}

func readProcs() []procInfo {
	ents, _ := os.ReadDir("/proc")
	var ps []procInfo
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces.
		rest := string(stat[bytes.LastIndexByte(stat, ')')+2:])
		f := strings.Fields(rest)
		if len(f) < 3 || f[0] == "Z" {
			continue
		}
		p := procInfo{pid: pid, env: map[string]string{}}
		p.ppid, _ = strconv.Atoi(f[1])
		p.pgrp, _ = strconv.Atoi(f[2])
		p.cmdline, _ = os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		for _, kv := range bytes.Split(env, []byte{0}) {
			if k, v, ok := strings.Cut(string(kv), "="); ok {
				p.env[k] = v
			}
		}
		ps = append(ps, p)
	}
	return ps
}

// jobProcs are the processes whose environment carries the job id, with
// the job's secret (which every rank has in its environment).
func jobProcs(jobID string) (ranks map[int]procInfo, secret string) {
	ranks = map[int]procInfo{}
	cand := map[int]procInfo{}
	for _, p := range readProcs() {
		if p.env["GORUN_JOB_ID"] == jobID && p.env["GORUN_SECRET"] != "" {
			cand[p.pid] = p
			secret = p.env["GORUN_SECRET"]
		}
	}
	for _, p := range cand {
		if _, child := cand[p.ppid]; !child { // the rank's program, not what it started
			r, _ := strconv.Atoi(p.env["GORUN_RANK"])
			ranks[r] = p
		}
	}
	return ranks, secret
}

// jobIDOf finds the job id of the gorun with this pid from its children.
func jobIDOf(t *testing.T, gorunPid int, want int) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range readProcs() {
			if id := p.env["GORUN_JOB_ID"]; id != "" && isDescendant(p.pid, gorunPid) {
				if r, _ := jobProcs(id); len(r) >= want {
					return id
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the ranks of gorun %d did not show up in /proc", gorunPid)
	return ""
}

func isDescendant(pid, ancestor int) bool {
	for i := 0; i < 20 && pid > 1; i++ {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
		pid, _ = strconv.Atoi(f[1])
		if pid == ancestor {
			return true
		}
	}
	return false
}

// checkSecretHidden asserts that no process's command line holds the secret.
func checkSecretHidden(t *testing.T, secret string) {
	t.Helper()
	if len(secret) < 32 {
		t.Fatalf("no secret found in the ranks' environment (%q)", secret)
	}
	for _, p := range readProcs() {
		if bytes.Contains(p.cmdline, []byte(secret)) {
			t.Errorf("secret in the command line of pid %d: %q", p.pid, bytes.ReplaceAll(p.cmdline, []byte{0}, []byte{' '}))
		}
	}
}

// checkGone asserts that none of the pids, nor anything in their process
// groups, is alive.
func checkGone(t *testing.T, pids []int) { t.Helper(); checkGoneGroups(t, pids, pids) }

// checkGoneGroups asserts that none of the pids, nor anything in the
// process groups, is alive.
func checkGoneGroups(t *testing.T, pids, groups []int) {
	t.Helper()
	set, gset := map[int]bool{}, map[int]bool{}
	for _, p := range pids {
		set[p] = true
	}
	for _, g := range groups {
		gset[g] = true
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		var alive []string
		for _, p := range readProcs() {
			if set[p.pid] || gset[p.pgrp] {
				alive = append(alive, fmt.Sprintf("%d(%q)", p.pid, bytes.ReplaceAll(p.cmdline, []byte{0}, []byte{' '})))
			}
		}
		if len(alive) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of the job survive: %s", strings.Join(alive, ", "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestKillOneRank(t *testing.T) {
	j := startJob(t, "-np", "4", "--grace", "3s", ringBin, "-hold", "60s", "-timeout", "40s")
	j.waitOutput(t, "ring: token", 1) // every rank connected, now holding
	id := jobIDOf(t, j.cmd.Process.Pid, 4)
	ranks, secret := jobProcs(id)
	if len(ranks) != 4 {
		t.Fatalf("found %d ranks in /proc", len(ranks))
	}
	checkSecretHidden(t, secret)
	var pids []int
	for _, p := range ranks {
		pids = append(pids, p.pid)
	}
	victim := ranks[2].pid
	syscall.Kill(victim, syscall.SIGKILL)
	d := j.wait(t, 10*time.Second)
	_, e := j.out()
	if j.code == 0 {
		t.Fatal("gorun exited 0 after a rank was killed")
	}
	want := fmt.Sprintf("gorun: rank 2 (host localhost, pid %d) killed by signal 9 (killed)\n", victim)
	if !strings.Contains(e, want) || strings.Count(e, "gorun: ") != 1 {
		t.Fatalf("stderr %q, want one line %q", e, want)
	}
	if j.code != 128+9 {
		t.Errorf("status %d, want %d", j.code, 128+9)
	}
	t.Logf("gorun exited %s after the kill", d)
	checkGone(t, pids)
}

func TestSignalReachesRanks(t *testing.T) {
	// Rank 0 here, ranks 1 and 2 "remote" through the launch agent.
	script := `trap 'echo "rank $GORUN_RANK got TERM"; exit 0' TERM; echo ready; while :; do sleep 0.1; done`
	j := startJob(t, "-H", "localhost:1,127.0.0.2:2", "--launch-agent", agentSh, "/bin/sh", "-c", script)
	j.waitOutput(t, "ready", 3)
	id := jobIDOf(t, j.cmd.Process.Pid, 3)
	ranks, _ := jobProcs(id)
	j.cmd.Process.Signal(syscall.SIGTERM)
	j.wait(t, 10*time.Second)
	o, e := j.out()
	for r := 0; r < 3; r++ {
		if !strings.Contains(o, fmt.Sprintf("[%d] rank %d got TERM\n", r, r)) {
			t.Errorf("rank %d did not get SIGTERM:\n%s%s", r, o, e)
		}
	}
	if j.code != 128+15 {
		t.Errorf("status %d, want 143", j.code)
	}
	var pids []int
	for _, p := range ranks {
		pids = append(pids, p.pid)
	}
	checkGone(t, pids)
}

// gorun killed with SIGKILL leaves no process of the job behind: the
// job's reaper stops every rank's process group, local or remote (and the
// parent-death signal stops each rank's main process, the remote agent
// what it started when its stdin closes).
func TestGorunKilled(t *testing.T) {
	script := `sleep 60 & echo ready; wait`
	j := startJob(t, "-H", "localhost:2,127.0.0.2:2", "--launch-agent", agentSh, "/bin/sh", "-c", script)
	j.waitOutput(t, "ready", 4)
	id := jobIDOf(t, j.cmd.Process.Pid, 4)
	ranks, _ := jobProcs(id)
	if len(ranks) != 4 {
		t.Fatalf("found %d ranks", len(ranks))
	}
	t.Cleanup(func() {
		for _, p := range ranks {
			syscall.Kill(-p.pid, syscall.SIGKILL)
		}
	})
	j.cmd.Process.Kill()
	j.wait(t, 5*time.Second)
	var pids []int
	for _, p := range ranks {
		pids = append(pids, p.pid)
	}
	checkGone(t, pids)
}

// A "remote" host through --launch-agent: 127.0.0.2 is a loopback address
// that no interface holds, so gorun takes it for another machine and
// starts its ranks through the agent and gorun's remote agent.
func TestLaunchAgent(t *testing.T) {
	calls, _ := filepath.Glob(filepath.Join(binDir, "agent-call.*"))
	for _, c := range calls {
		os.Remove(c)
	}
	j := startJob(t, "-H", "localhost:1,127.0.0.2:2", "--launch-agent", agentSh, "-x", "FOO=remote ok",
		ringBin, "-hold", "3s", "-timeout", "40s")
	j.waitOutput(t, "ring: token", 1)
	id := jobIDOf(t, j.cmd.Process.Pid, 3)
	_, secret := jobProcs(id)
	checkSecretHidden(t, secret)
	j.wait(t, 30*time.Second)
	o, e := j.out()
	if j.code != 0 {
		t.Fatalf("status %d\n%s%s", j.code, o, e)
	}
	for _, want := range []string{
		"[0] rank 0 of 3 (local 0, host localhost, launcher gorun): barrier passed\n",
		"[1] rank 1 of 3 (local 0, host 127.0.0.2, launcher gorun): barrier passed\n",
		"[2] rank 2 of 3 (local 1, host 127.0.0.2, launcher gorun): barrier passed\n",
	} {
		if !strings.Contains(o, want) {
			t.Errorf("missing %q in\n%s", want, o)
		}
	}
	calls, _ = filepath.Glob(filepath.Join(binDir, "agent-call.*"))
	if len(calls) != 1 {
		t.Fatalf("launch agent called %d times, want once for the host", len(calls))
	}
	b, _ := os.ReadFile(calls[0])
	host, cmd, _ := strings.Cut(string(b), "\n")
	if host != "127.0.0.2" || !strings.HasPrefix(cmd, "cd ") || !strings.Contains(cmd, "'FOO=remote ok'") || !strings.Contains(cmd, "--internal-remote-agent --grace 30s --ranks 1.0,2.1 ") {
		t.Errorf("agent called with host %q command %q", host, cmd)
	}
	if strings.Contains(cmd, secret) {
		t.Error("secret in the remote command")
	}
}

// Remote ranks get -x, CUDA_VISIBLE_DEVICES, stdin (when they are the stdin
// rank), and fail like local ones.
func TestLaunchAgentEnvStdinFailure(t *testing.T) {
	r := gorun(t, "from stdin\n", "-H", "localhost:1,127.0.0.2:2", "--launch-agent", agentSh, "--stdin", "2", "-x", "FOO=bar",
		"/bin/sh", "-c", `echo "$GORUN_RANK $GORUN_HOST $FOO $CUDA_VISIBLE_DEVICES $GORUN_LOCAL_RANK $(cat)"`)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	sort.Strings(lines)
	if r.code != 0 || strings.Join(lines, ",") != "[0] 0 localhost bar 0 0 ,[1] 1 127.0.0.2 bar 0 0 ,[2] 2 127.0.0.2 bar 1 1 from stdin" {
		t.Errorf("status %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	// A remote rank fails: gorun names it and stops the others, remote
	// and local; the remote agent kills what its rank started.
	script := `if [ $GORUN_RANK = 2 ]; then sleep 0.5; exit 5; fi; sleep 60 & echo $! > ` + binDir + `/child.$GORUN_RANK; wait`
	start := time.Now()
	r = gorun(t, "", "-H", "localhost:1,127.0.0.2:2", "--launch-agent", agentSh, "/bin/sh", "-c", script)
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("took %s", d)
	}
	if r.code != 5 || !regexp.MustCompile(`^gorun: rank 2 \(host 127\.0\.0\.2, pid \d+\) exited with status 5\n$`).MatchString(r.stderr) {
		t.Fatalf("status %d stderr %q", r.code, r.stderr)
	}
	var pids []int
	for _, rk := range []int{0, 1} {
		b, err := os.ReadFile(fmt.Sprintf("%s/child.%d", binDir, rk))
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		pids = append(pids, pid)
	}
	checkGone(t, pids)
}

// A remote host lost mid-run (here its agent killed with SIGKILL): gorun
// names a rank of that host, stops the others, exits 255, leaves nothing.
func TestHostLost(t *testing.T) {
	j := startJob(t, "-H", "localhost:1,127.0.0.2:2", "--launch-agent", agentSh, "/bin/sh", "-c", `echo ready; sleep 60`)
	j.waitOutput(t, "ready", 3)
	id := jobIDOf(t, j.cmd.Process.Pid, 3)
	ranks, _ := jobProcs(id)
	agent := 0
	for _, p := range readProcs() {
		if bytes.Contains(p.cmdline, []byte("--internal-remote-agent")) && isDescendant(p.pid, j.cmd.Process.Pid) {
			agent = p.pid
		}
	}
	if agent == 0 || len(ranks) != 3 {
		t.Fatalf("agent %d, %d ranks", agent, len(ranks))
	}
	syscall.Kill(agent, syscall.SIGKILL)
	j.wait(t, 10*time.Second)
	_, e := j.out()
	if j.code != 255 || !regexp.MustCompile(`^gorun: rank 1 \(host 127\.0\.0\.2, pid \d+\): lost: agent\.sh killed by signal 9 \(killed\)\n$`).MatchString(e) {
		t.Fatalf("status %d, stderr %q", j.code, e)
	}
	var pids []int
	for _, p := range ranks {
		pids = append(pids, p.pid)
	}
	checkGone(t, pids)
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	os.WriteFile(hosts, []byte("# test\nlocalhost slots=2\nnode2 slots=two\n"), 0o644)
	zero := filepath.Join(dir, "zero")
	os.WriteFile(zero, []byte("localhost slots=0\n"), 0o644)
	noexec := filepath.Join(dir, "data.txt")
	os.WriteFile(noexec, []byte("x"), 0o644)
	cases := []struct {
		args []string
		code int
		want string // parts separated by | must all appear, in one line
	}{
		{[]string{"-hostfile", hosts, "/bin/true"}, 2, "gorun: " + hosts + ":3: slots=\"two\""},
		{[]string{"-hostfile", zero, "/bin/true"}, 2, "gorun: " + zero + ":1: host localhost has slots=0"},
		{[]string{"-hostfile", filepath.Join(dir, "nope"), "/bin/true"}, 2, "nope: no such file"},
		{[]string{"-np", "3", "-H", "localhost:2", "/bin/true"}, 2, "gorun: -np 3 is more than the 2 slots of localhost:2; add --oversubscribe"},
		{[]string{"-np", "2", filepath.Join(dir, "missing")}, 2, "missing: no such file"},
		{[]string{"-np", "2", noexec}, 2, "data.txt is not executable"},
		{[]string{"-np", "2"}, 2, "gorun: no program to run"},
		{[]string{"-np", "0", "/bin/true"}, 2, "gorun: -np 0: need at least 1 rank"},
		{[]string{"-np", "x", "/bin/true"}, 2, "gorun: invalid value \"x\" for flag -np"},
		{[]string{"--no-such-flag", "/bin/true"}, 2, "gorun: flag provided but not defined: -no-such-flag"},
		{[]string{"-H", "a:2,", "/bin/true"}, 2, "empty host name"},
		{[]string{"-H", "localhost", "-hostfile", hosts, "/bin/true"}, 2, "not both"},
		{[]string{"-x", "GORUN_SECRET=1", "/bin/true"}, 2, "gorun sets GORUN_SECRET itself"},
		{[]string{"--stdin", "x", "/bin/true"}, 2, "--stdin \"x\""},
		{[]string{"--grace", "0s", "/bin/true"}, 2, "--grace 0s"},
		{[]string{"--stdin", "-1", "/bin/true"}, 2, "gorun: --stdin \"-1\": want a rank or none"},
		{[]string{"-np", "2", "--stdin", "2", "/bin/true"}, 2, "gorun: --stdin 2: the job has ranks 0..1"},
		{[]string{"--max-restarts", "-1", "/bin/true"}, 2, "gorun: --max-restarts -1 is negative"},
		{[]string{"--timeout", "-1s", "/bin/true"}, 2, "gorun: --timeout -1s is negative"},
		{[]string{"-x", "A=1", "-x", "A=2", "/bin/true"}, 2, "gorun: -x A given twice"},
		{[]string{"--tag", "json", "/bin/true"}, 2, "gorun: output tag style \"json\""},
		{[]string{"--map-by", "core", "/bin/true"}, 2, "gorun: --map-by \"core\": want slot, node or ppr:N:node"},
		{[]string{"--port-range", "29503-29500", "/bin/true"}, 2, "gorun: --port-range \"29503-29500\": 29503 is above 29500 (want LO-HI with LO <= HI)"},
		{[]string{"--port-range", "0-10", "/bin/true"}, 2, "gorun: --port-range \"0-10\": ports go from 1 to 65535"},
		{[]string{"--port-range", "29500", "/bin/true"}, 2, "gorun: --port-range \"29500\": want LO-HI, such as 29500-29531"},
		{[]string{"--mca", "btl_tcp_if_include", "nosuch0", "/bin/true"}, 2, "gorun: --mca btl_tcp_if_include nosuch0: no interface of this host matches nosuch0 (it has "},
		{[]string{"-H", "127.0.0.2", "-p", "65536", "/bin/true"}, 2, "gorun: --ssh-port 65536: not a port"},
		{[]string{"-H", "nosuchhost.invalid", "/bin/true"}, 255, "gorun: cannot start rank 0 on host nosuchhost.invalid: ssh: Could not resolve hostname nosuchhost.invalid"},
		{[]string{"-H", "127.0.0.2", "--launch-agent", "/nonexistent/agent", "/bin/true"}, 1, "gorun: cannot start /nonexistent/agent for rank 0 on host 127.0.0.2"},
		{[]string{"-H", "127.0.0.2", "--launch-agent", agentSh, "--remote-gorun", "/nonexistent/gorun", "/bin/true"}, 255, "gorun: cannot start rank 0 on host 127.0.0.2: env: |/nonexistent/gorun"},
		{[]string{"-H", "127.0.0.2", "--launch-agent", agentSh, "/no/such/prog"}, 255, "gorun: cannot start rank 0 on host 127.0.0.2: cannot start /no/such/prog on "},
		{[]string{"-H", "127.0.0.2", "--launch-agent", agentSh, "--wdir", "/no/such/dir", "/bin/true"}, 255, "gorun: cannot start rank 0 on host 127.0.0.2: |cd|/no/such/dir"},
	}
	for _, c := range cases {
		r := gorun(t, "", c.args...)
		checkNoPanic(t, r)
		ok := r.code == c.code && strings.Count(r.stderr, "\n") == 1
		for _, part := range strings.Split(c.want, "|") {
			ok = ok && strings.Contains(r.stderr, part)
		}
		if !ok {
			t.Errorf("gorun %q: status %d, stderr %q; want status %d and one line with %q", c.args, r.code, r.stderr, c.code, c.want)
		}
	}
}

func TestHelp(t *testing.T) {
	r := gorun(t, "", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "--oversubscribe") || strings.Contains(r.stdout, "internal-remote-agent") {
		t.Errorf("help: %d %q", r.code, r.stdout)
	}
}

// TestMPIHabits: the mpirun and torchrun flags people type out of habit
// work or say why they do nothing, and --version describes the binary.
func TestMPIHabits(t *testing.T) {
	for _, args := range [][]string{{"-N", "3"}, {"--npernode", "3"}, {"--nproc-per-node", "3"}, {"--nproc_per_node=3"}, {"-H", "localhost:1", "-N", "3"}} {
		r := gorun(t, "", append(args, "/bin/sh", "-c", `echo "$GORUN_SIZE"`)...)
		if r.code != 0 || strings.Count(r.stdout, "3\n") != 3 || r.stderr != "" {
			t.Errorf("%q: %d %q %q", args, r.code, r.stdout, r.stderr)
		}
	}
	if r := gorun(t, "", "-N", "0", "true"); r.code != 2 || r.stderr != "gorun: -N 0: need at least 1 rank per host\n" {
		t.Errorf("-N 0: %d %q", r.code, r.stderr)
	}
	r := gorun(t, "", "-N", "2", "-np", "3", "true")
	if r.code != 2 || r.stderr != "gorun: -np 3 with -N 2 on 1 host(s): want -np 2, or no -np\n" {
		t.Errorf("-N with -np: %d %q", r.code, r.stderr)
	}
	// accepted with a note: --mca (OpenMPI's own parameters), --bind-to core;
	// accepted silently: --allow-run-as-root, --bind-to none
	r = gorun(t, "", "--allow-run-as-root", "--mca", "btl", "tcp,self", "-np", "1", "--bind-to", "core", "/bin/echo", "--mca", "x", "y")
	want := "gorun: --mca btl tcp,self ignored: it sets an OpenMPI parameter, and gorun is not OpenMPI\n" +
		"gorun: --bind-to core: gorun does not bind ranks to cores (as --bind-to none); each rank sizes its own threads (nmt-train --threads)\n"
	if r.code != 0 || r.stdout != "[0] --mca x y\n" || r.stderr != want {
		t.Errorf("--mca/--bind-to: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = gorun(t, "", "--bind-to", "none", "--allow-run-as-root", "-np", "1", "true")
	if r.code != 0 || r.stderr != "" {
		t.Errorf("--bind-to none: %d %q", r.code, r.stderr)
	}
	r = gorun(t, "", "--version")
	if r.code != 0 || !regexp.MustCompile(`^gorun \S+ \(commit [^)]+\)\ngo1\.\S+ linux/\w+, \d+ CPUs\nCPU features: .+\nGPUs: .+\n$`).MatchString(r.stdout) {
		t.Errorf("--version: %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// TestFlagsReachTheJob: each flag that only changes the job's setup shows
// in the dry run or in what the job does.
func TestFlagsReachTheJob(t *testing.T) {
	// ssh's port, identity and arguments, the rendezvous address, and
	// several -H flags (one host each).
	r := gorun(t, "", "--dry-run", "-H", "localhost:1", "-H", "127.0.0.2:1", "-p", "2222", "-i", "/keys/id_test",
		"--ssh-args", "-F /etc/test_ssh_config", "--rendezvous-addr", "127.0.0.1:5555", "/bin/true")
	for _, want := range []string{
		"gorun: dry run: 2 ranks on 2 hosts, job ", ", rendezvous 127.0.0.1:5555\n",
		"0     localhost  0           1           0          exec\n",
		"1     127.0.0.2  0           1           1          ssh\n",
		"GORUN_RENDEZVOUS=127.0.0.1:5555 ",
		"[127.0.0.2: rank 1] ssh -F /etc/test_ssh_config -o BatchMode=yes -o ConnectTimeout=10 -p 2222 -i /keys/id_test 127.0.0.2 'cd ",
	} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("dry run (status %d) lacks %q:\n%s%s", r.code, want, r.stdout, r.stderr)
		}
	}
	// --iface NAME: the ranks are told.
	r = gorun(t, "", "--dry-run", "-np", "1", "--iface", "lo", "/bin/true")
	if r.code != 0 || !strings.Contains(r.stdout, " GORUN_IFACE=lo ") {
		t.Errorf("--iface lo: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// --tag none
	r = gorun(t, "", "-np", "1", "--tag", "none", "/bin/echo", "untagged")
	if r.code != 0 || r.stdout != "untagged\n" {
		t.Errorf("--tag none: %d %q %q", r.code, r.stdout, r.stderr)
	}
	// --timeout
	r = gorun(t, "", "-np", "2", "--timeout", "300ms", "/bin/sleep", "30")
	if r.code != 124 || r.stderr != "gorun: job timed out after 300ms (--timeout); stopping 2 ranks\n" {
		t.Errorf("--timeout: %d %q", r.code, r.stderr)
	}
	// --max-restarts
	r = gorun(t, "", "-np", "1", "--max-restarts", "1", "/bin/sh", "-c", `echo "start $GORUN_RESTART"; exit 3`)
	if r.code != 3 || r.stdout != "[0] start 0\n[0] start 1\n" || !strings.Contains(r.stderr, "gorun: restarting the job (restart 1 of 1, GORUN_RESTART=1) after: rank 0 (host localhost, pid ") {
		t.Errorf("--max-restarts 1: %d %q %q", r.code, r.stdout, r.stderr)
	}
	// -v: the job and each rank's command on stderr.
	r = gorun(t, "", "-v", "-np", "1", "/bin/true")
	if r.code != 0 || !regexp.MustCompile(`(?m)^gorun: job [0-9a-f]+: 1 rank on 1 host, rendezvous 127\.0\.0\.1:\d+\n`).MatchString(r.stderr) ||
		!regexp.MustCompile(`(?m)^gorun: \[0\] cd .* 'GORUN_SECRET=<redacted>' /bin/true$`).MatchString(r.stderr) {
		t.Errorf("-v: %d %q", r.code, r.stderr)
	}
	// --mca after a flag with a value, and twice: each dropped with its note.
	r = gorun(t, "", "-np", "1", "--mca", "btl", "tcp,self", "--mca", "pml", "ob1", "/bin/echo", "ok")
	want := "gorun: --mca btl tcp,self ignored: it sets an OpenMPI parameter, and gorun is not OpenMPI\n" +
		"gorun: --mca pml ob1 ignored: it sets an OpenMPI parameter, and gorun is not OpenMPI\n"
	if r.code != 0 || r.stdout != "[0] ok\n" || r.stderr != want {
		t.Errorf("-np 1 --mca ... --mca ...: %d %q %q", r.code, r.stdout, r.stderr)
	}
}
