// Package multihost runs gorun the way it is used: on several hosts with
// their own addresses, started over real ssh, across a link that can be
// slowed, lose packets or be cut. The hosts are network namespaces made by
// test/hosts/up.sh (an sshd in each, a veth to a bridge, tbf/nftables
// shaping); see docs/multihost.md.
//
// The tests need root and working `ip netns`; without them every test is
// skipped with one line saying why. TestMain brings a set of hosts of its
// own up (names and subnet distinct from `make hosts-up`'s, and from a
// second `go test` running at the same time) and always takes it down, on
// success, failure, panic, timeout or interrupt: a watchdog process holds
// the set's lock and runs test/hosts/down.sh once this test binary is gone.
package multihost

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// The link every test starts from: the lab's 1 Gbit/s network.
const (
	baseLink     = "rate 1gbit"
	linkRateBps  = 1e9 // bits/s of baseLink
	hostsPerTest = 2
)

// env is the set of test hosts and binaries shared by the tests.
type env struct {
	root                   string // repository root
	bin                    string // directory of the built binaries
	gorun, ring            string
	archeck, intruder      string
	perf                   string // bin/allreduce-perf
	train                  string // bin/nmt-train
	state                  string // GORUN_HOSTS_STATE
	hostfile, sshConfig    string
	name, veth, bridge, nt string // GORUN_HOSTS_NAME, _VETH, _BRIDGE, _NET
	ips                    []string
	netem, nft             bool
}

var (
	hosts      *env
	skipReason string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if reason := preconditions(); reason != "" {
		skipReason = reason
		return m.Run()
	}
	e, teardown, err := setUp()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/multihost: setting up the test hosts failed:", err)
		if teardown != nil {
			teardown()
		}
		return 1
	}
	hosts = e
	code := m.Run()
	teardown()
	if left := leftovers(e); left != "" {
		fmt.Fprintln(os.Stderr, "test/multihost: left behind after down.sh:", left)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// preconditions returns why the tests cannot run here, or "".
func preconditions() string {
	if runtime.GOOS != "linux" {
		return "multi-host tests need Linux network namespaces"
	}
	if os.Geteuid() != 0 {
		return "multi-host tests need root (network namespaces, sshd); CI runs them as root"
	}
	for _, tool := range []string{"ip", "tc", "ssh", "ssh-keygen", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("multi-host tests need %s (apt-get install iproute2 openssh-client)", tool)
		}
	}
	if _, ok := testenv.LookPath("sshd"); !ok {
		return "multi-host tests need sshd (apt-get install openssh-server)"
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil {
		return fmt.Sprintf("multi-host tests need `ip netns`, which fails here: %v: %s", err, strings.TrimSpace(string(out)))
	}
	// Root without CAP_SYS_ADMIN/CAP_NET_ADMIN (an unprivileged container)
	// lists namespaces but cannot make one.
	if why := testenv.NetnsRefused(); why != "" {
		return "multi-host tests need to create network namespaces, which fails here (" + why + ")"
	}
	return ""
}

// need skips t when the hosts could not be made here.
func need(t *testing.T) *env {
	t.Helper()
	if hosts == nil {
		t.Skip(skipReason)
	}
	return hosts
}

func setUp() (*env, func(), error) {
	root, err := filepath.Abs("../..")
	if err != nil {
		return nil, nil, err
	}
	if _, err := os.Stat(filepath.Join(root, "test/hosts/up.sh")); err != nil {
		return nil, nil, fmt.Errorf("test/hosts/up.sh not found from %s", root)
	}
	// A set of hosts of our own: the first free slot 1..8.
	lock, slot, err := testenv.LockSlot("multihost")
	if err != nil {
		return nil, nil, err
	}
	e := &env{
		root:   root,
		state:  fmt.Sprintf("/tmp/gorun-multihost-%d", slot),
		name:   fmt.Sprintf("gorun-mt%dh", slot),
		veth:   fmt.Sprintf("grmt%dh", slot),
		bridge: fmt.Sprintf("gorunbrmt%d", slot),
		nt:     fmt.Sprintf("198.18.%d", 80+slot),
	}
	e.hostfile = filepath.Join(e.state, "hostfile")
	e.sshConfig = filepath.Join(e.state, "ssh_config")
	for i := 1; i <= hostsPerTest; i++ {
		e.ips = append(e.ips, fmt.Sprintf("%s.%d", e.nt, 10+i))
	}
	_, e.nft = testenv.LookPath("nft")

	if e.bin, err = os.MkdirTemp("", "gorun-multihost-bin-"); err != nil {
		return nil, nil, err
	}
	// The watchdog runs down.sh (and removes the binaries) when this
	// process ends, however it ends.
	teardown, err := testenv.Watchdog(filepath.Join(root, "test/hosts/down.sh"), e.hostEnv(), lock, 60*time.Second, e.bin)
	if err != nil {
		return nil, nil, err
	}

	// Build the binaries (the ranks run them from the shared filesystem:
	// namespaces share everything but the network).
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	build := exec.Command(goTool, "build", "-o", e.bin+"/", "./cmd/gorun", "./examples/ring", "./cmd/allreduce-perf", "./cmd/nmt-train", "./test/multihost/archeck", "./test/multihost/intruder")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, teardown, fmt.Errorf("go build: %v\n%s", err, out)
	}
	e.gorun = filepath.Join(e.bin, "gorun")
	e.ring = filepath.Join(e.bin, "ring")
	e.archeck = filepath.Join(e.bin, "archeck")
	e.intruder = filepath.Join(e.bin, "intruder")
	e.perf = filepath.Join(e.bin, "allreduce-perf")
	e.train = filepath.Join(e.bin, "nmt-train")

	up := exec.Command(filepath.Join(root, "test/hosts/up.sh"))
	up.Env = append(e.hostEnv(), fmt.Sprintf("HOSTS=%d", hostsPerTest), "LINK="+baseLink)
	out, err := testenv.RunTimeout(up, 60*time.Second)
	if err != nil {
		return nil, teardown, fmt.Errorf("test/hosts/up.sh: %v\n%s", err, out)
	}
	e.netem = haveNetem(e.veth + "probe")
	return e, teardown, nil
}

// haveNetem reports whether this kernel can make a netem qdisc (tried on a
// dummy link of that name).
func haveNetem(dev string) bool {
	if exec.Command("ip", "link", "add", dev, "type", "dummy").Run() != nil {
		return false
	}
	defer exec.Command("ip", "link", "del", dev).Run()
	return exec.Command("tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "1ms").Run() == nil
}

// hostEnv is the environment of the test/hosts scripts for this set.
func (e *env) hostEnv() []string {
	return append(os.Environ(),
		"GORUN_HOSTS_NAME="+e.name,
		"GORUN_HOSTS_VETH="+e.veth,
		"GORUN_HOSTS_BRIDGE="+e.bridge,
		"GORUN_HOSTS_NET="+e.nt,
		"GORUN_HOSTS_STATE="+e.state,
	)
}

func (e *env) ns(i int) string { return fmt.Sprintf("%s%d", e.name, i) }

// link reshapes every host's link (test/hosts/link.sh) and returns the
// script's output.
func (e *env) link(t *testing.T, link string) string {
	t.Helper()
	c := exec.Command(filepath.Join(e.root, "test/hosts/link.sh"))
	c.Env = append(e.hostEnv(), "LINK="+link)
	out, err := testenv.RunTimeout(c, 30*time.Second)
	if err != nil {
		t.Fatalf("LINK=%q test/hosts/link.sh: %v\n%s", link, err, out)
	}
	return out
}

// cut takes host i's link down ("down") or up ("up").
func (e *env) cut(t *testing.T, i int, dir string) {
	t.Helper()
	c := exec.Command(filepath.Join(e.root, "test/hosts/link.sh"), dir, strconv.Itoa(i))
	c.Env = e.hostEnv()
	if out, err := testenv.RunTimeout(c, 30*time.Second); err != nil {
		t.Fatalf("test/hosts/link.sh %s %d: %v\n%s", dir, i, err, out)
	}
}

// job is a gorun run in progress.
type job struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	out   bytes.Buffer
	lines chan string
	done  chan struct{}
	err   error
	start time.Time
	end   time.Time
}

// start runs gorun with the hostfile and ssh config of the test hosts
// (gorun -hostfile H --ssh-args "-F C" ARGS...), its stdout and stderr
// merged.
func (e *env) start(t *testing.T, args ...string) *job {
	t.Helper()
	full := append([]string{"-hostfile", e.hostfile, "--ssh-args", "-F " + e.sshConfig}, args...)
	c := exec.Command(e.gorun, full...)
	c.Dir = e.root
	c.Env = os.Environ()
	// gorun goes when the test binary goes (its ranks go with gorun).
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	c.Stdout, c.Stderr = pw, pw
	j := &job{cmd: c, lines: make(chan string, 1024), done: make(chan struct{})}
	t.Logf("gorun %s", strings.Join(full, " "))
	j.start = time.Now()
	if err := c.Start(); err != nil {
		t.Fatalf("starting gorun: %v", err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			j.mu.Lock()
			j.out.WriteString(sc.Text() + "\n")
			j.mu.Unlock()
			select {
			case j.lines <- sc.Text():
			default:
			}
		}
		close(j.lines)
	}()
	go func() {
		j.err = c.Wait()
		j.end = time.Now()
		pw.Close()
		close(j.done)
	}()
	t.Cleanup(func() {
		select {
		case <-j.done:
		default:
			c.Process.Kill()
			<-j.done
		}
	})
	return j
}

// wait waits up to d for the job and returns its output and exit status
// (-1: still running after d, then killed).
func (j *job) wait(t *testing.T, d time.Duration) (string, int) {
	t.Helper()
	select {
	case <-j.done:
	case <-time.After(d):
		j.cmd.Process.Kill()
		<-j.done
		t.Errorf("gorun still running after %v: killed it; output:\n%s", d, j.output())
		return j.output(), -1
	}
	for range j.lines { // the reader has seen everything once lines closes
	}
	return j.output(), exitCode(j.err)
}

func (j *job) output() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.out.String()
}

// waitLine waits up to d for a line containing s.
func (j *job) waitLine(t *testing.T, s string, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-j.lines:
			if !ok {
				t.Fatalf("gorun ended before printing %q; output:\n%s", s, j.output())
			}
			if strings.Contains(l, s) {
				return
			}
		case <-timer.C:
			t.Fatalf("no line with %q after %v; output:\n%s", s, d, j.output())
		}
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return -1
}

// run is start + wait.
func (e *env) run(t *testing.T, d time.Duration, args ...string) (string, int) {
	t.Helper()
	return e.start(t, args...).wait(t, d)
}

// proc is a process found inside a test host.
type proc struct {
	pid  int
	exe  string
	args string
}

func (p proc) String() string { return fmt.Sprintf("pid %d %s", p.pid, p.args) }

// procs lists the processes inside host i's namespace.
func (e *env) procs(i int) []proc {
	out, err := exec.Command("ip", "netns", "pids", e.ns(i)).Output()
	if err != nil {
		return nil
	}
	var ps []proc
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue // gone meanwhile
		}
		ps = append(ps, proc{pid: pid, exe: exe, args: strings.TrimSpace(strings.ReplaceAll(string(cl), "\x00", " "))})
	}
	return ps
}

// jobProcs lists what is left of a job in host i: our binaries (ranks, the
// remote agent) and ssh sessions (everything but the sshd listener).
func (e *env) jobProcs(i int) []proc {
	var left []proc
	for _, p := range e.procs(i) {
		if strings.HasPrefix(p.exe, e.bin+"/") || strings.HasPrefix(p.args, "sshd:") && !strings.Contains(p.args, "[listener]") {
			left = append(left, p)
		}
	}
	return left
}

// launcherProcs lists the ssh clients and agents of our gorun left in the
// launcher's namespace.
func (e *env) launcherProcs() []string {
	var left []string
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.ReplaceAll(string(cl), "\x00", " ")
		if strings.Contains(args, e.sshConfig) || strings.HasPrefix(args, e.gorun+" ") {
			left = append(left, fmt.Sprintf("pid %d %s", pid, args))
		}
	}
	return left
}

// noneLeft waits up to d for every host to hold no process of a job and
// the launcher no ssh client of one; it reports what is left.
func (e *env) noneLeft(t *testing.T, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var left []string
		for i := 1; i <= hostsPerTest; i++ {
			for _, p := range e.jobProcs(i) {
				left = append(left, fmt.Sprintf("h%d: %v", i, p))
			}
		}
		for _, p := range e.launcherProcs() {
			left = append(left, "launcher: "+p)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("processes of the job left %v after it ended:\n  %s", d, strings.Join(left, "\n  "))
			for i := 1; i <= hostsPerTest; i++ { // do not let them spoil the next test
				for _, p := range e.jobProcs(i) {
					syscall.Kill(p.pid, syscall.SIGKILL)
				}
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leftovers reports namespaces, links or state that down.sh did not remove.
func leftovers(e *env) string {
	var left []string
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], e.name) {
			left = append(left, "namespace "+f[0])
		}
	}
	if exec.Command("ip", "link", "show", e.bridge).Run() == nil {
		left = append(left, "bridge "+e.bridge)
	}
	if _, err := os.Stat(e.state); err == nil {
		left = append(left, "directory "+e.state)
	}
	return strings.Join(left, ", ")
}

// field returns the value after "name " in an archeck result line.
func field(line, name string) string {
	f := strings.Fields(line)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == name {
			return f[i+1]
		}
	}
	return ""
}

// archeckResult finds archeck's result line in gorun's output.
func archeckResult(t *testing.T, out string) (line string, busbw, avg float64) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "[0] archeck: np ") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no archeck result line in gorun's output:\n%s", out)
	}
	var err error
	if busbw, err = strconv.ParseFloat(field(line, "busbw_best_GBps"), 64); err != nil {
		t.Fatalf("archeck line without busbw_best_GBps: %q", line)
	}
	if avg, err = strconv.ParseFloat(field(line, "avg_s"), 64); err != nil {
		t.Fatalf("archeck line without avg_s: %q", line)
	}
	return line, busbw, avg
}

func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
