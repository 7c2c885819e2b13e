// Package slurm runs gorun's jobs under a real Slurm, as users write them:
// sbatch scripts whose ranks are srun's tasks, gorun inside an allocation,
// preemption with a stop checkpoint and a job that continues by itself,
// a node lost mid-job, and bad input. The cluster is test/slurm/up.sh's:
// slurmctld on the launcher side, one slurmd per test host (network
// namespaces of test/hosts/up.sh, each with its own host name), munge with
// a key made for the run (docs/launcher.md, "Slurm").
//
// The tests need root and Debian's slurm-wlm and munge; without them every
// test is skipped with one line saying why. TestMain brings a cluster of
// its own up (names, subnet and slurmctld port distinct from `make
// slurm-up`'s and from another `go test` at the same time) and always
// takes it down: a watchdog process holds the set's lock and runs
// test/slurm/down.sh once this test binary is gone.
package slurm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

const nodes = 2

// cluster is the Slurm cluster and binaries the tests share.
type cluster struct {
	root  string   // repository root
	work  string   // the users' directory: bin/ (built here), configs/ (the repository's)
	bin   string   // work/bin
	state string   // GORUN_SLURM_STATE
	env   []string // the environment of up.sh, down.sh and of Slurm's commands
	name  string   // namespaces name1, name2, ...
	net   string   // three octets
	slot  int
}

var (
	theCluster *cluster
	skipReason string
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	if reason := preconditions(); reason != "" {
		skipReason = reason
		return m.Run()
	}
	c, teardown, err := setUp()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/slurm: setting up the cluster failed:", err)
		if teardown != nil {
			teardown()
		}
		return 1
	}
	theCluster = c
	code := m.Run()
	teardown()
	if left := c.leftovers(); left != "" {
		fmt.Fprintln(os.Stderr, "test/slurm: left behind after down.sh:", left)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// preconditions returns why the tests cannot run here, or "".
func preconditions() string {
	if runtime.GOOS != "linux" {
		return "Slurm tests need Linux network namespaces"
	}
	if os.Geteuid() != 0 {
		return "Slurm tests need root (network namespaces, slurmctld, slurmd, munged); CI runs them as root"
	}
	for _, tool := range []string{"slurmctld", "slurmd", "slurmstepd", "sbatch", "srun", "salloc", "scontrol", "scancel"} {
		if _, ok := testenv.LookPath(tool); !ok {
			return fmt.Sprintf("Slurm tests need %s (apt-get install slurm-wlm munge)", tool)
		}
	}
	for _, tool := range []string{"munged", "munge", "unmunge"} {
		if _, ok := testenv.LookPath(tool); !ok {
			return fmt.Sprintf("Slurm tests need %s (apt-get install munge)", tool)
		}
	}
	for _, tool := range []string{"ip", "tc", "ssh", "ssh-keygen", "unshare", "nsenter", "setsid", "bash"} {
		if _, ok := testenv.LookPath(tool); !ok {
			return fmt.Sprintf("Slurm tests need %s (apt-get install iproute2 openssh-client util-linux)", tool)
		}
	}
	if _, ok := testenv.LookPath("sshd"); !ok {
		return "Slurm tests need sshd for the test hosts (apt-get install openssh-server)"
	}
	if why := testenv.NetnsRefused(); why != "" {
		return "Slurm tests need to create network namespaces, which fails here (" + why + ")"
	}
	return ""
}

// need skips t when the cluster could not be made here.
func need(t *testing.T) *cluster {
	t.Helper()
	if theCluster == nil {
		t.Skip(skipReason)
	}
	return theCluster
}

// setNames is the environment naming cluster set slot (its test hosts,
// state and slurmctld port), for up.sh and down.sh.
func setNames(slot int) (state, name, net string, env []string) {
	state = fmt.Sprintf("/tmp/gorun-slurm-%d", slot)
	name = fmt.Sprintf("gorun-sl%dh", slot)
	net = fmt.Sprintf("198.18.%d", 60+slot)
	env = []string{
		"GORUN_SLURM_STATE=" + state,
		fmt.Sprintf("GORUN_SLURM_PORT=%d", 6900+2*slot),
		"GORUN_HOSTS_NAME=" + name,
		fmt.Sprintf("GORUN_HOSTS_VETH=grsl%dh", slot),
		fmt.Sprintf("GORUN_HOSTS_BRIDGE=gorunbrsl%d", slot),
		"GORUN_HOSTS_NET=" + net,
		"GORUN_HOSTS_STATE=" + state + "/hosts",
		"SLURM_CONF=" + state + "/slurm.conf",
	}
	return
}

// baseEnv is this process's environment without an enclosing job's
// Slurm, gorun or test-host variables.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "SLURM_") || strings.HasPrefix(k, "GORUN_") || strings.HasPrefix(k, "SBATCH_") ||
			strings.HasPrefix(k, "SALLOC_") || strings.HasPrefix(k, "SRUN_") || k == "HOSTS" || k == "CPUS" || k == "NODE_MUNGE_KEY" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func setUp() (*cluster, func(), error) {
	root, err := filepath.Abs("../..")
	if err != nil {
		return nil, nil, err
	}
	lock, slot, err := testenv.LockSlot("slurm")
	if err != nil {
		return nil, nil, err
	}
	c := &cluster{root: root, slot: slot}
	var names []string
	c.state, c.name, c.net, names = setNames(slot)
	c.env = append(baseEnv(), names...)
	if c.work, err = os.MkdirTemp("", "gorun-slurm-work-"); err != nil {
		return nil, nil, err
	}
	teardown, err := testenv.Watchdog(filepath.Join(root, "test/slurm/down.sh"), c.env, lock, 90*time.Second, c.work)
	if err != nil {
		return nil, nil, err
	}
	// The users' directory: bin/ built here, the repository's configs/
	// and examples/ (the namespaces share the filesystem: every node sees it).
	c.bin = filepath.Join(c.work, "bin")
	for _, d := range []string{"configs", "examples"} {
		if err := os.Symlink(filepath.Join(root, d), filepath.Join(c.work, d)); err != nil {
			return nil, teardown, err
		}
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	build := exec.Command(goTool, "build", "-o", c.bin+"/", "./cmd/gorun", "./cmd/nmt-train", "./examples/ring")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, teardown, fmt.Errorf("go build: %w\n%s", err, out)
	}
	up := exec.Command(filepath.Join(root, "test/slurm/up.sh"))
	up.Env = append(c.env, fmt.Sprintf("HOSTS=%d", nodes))
	if out, err := testenv.RunTimeout(up, 90*time.Second); err != nil {
		return nil, teardown, fmt.Errorf("test/slurm/up.sh: %w\n%s", err, out)
	}
	return c, teardown, nil
}

// leftovers lists what down.sh left: namespaces, the state directory,
// daemons of this set.
func (c *cluster) leftovers() string {
	var left []string
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, c.name) {
				left = append(left, "namespace "+f)
			}
		}
	}
	if _, err := os.Stat(c.state); err == nil {
		left = append(left, c.state)
	}
	for _, p := range pidsWith(c.state) {
		left = append(left, p)
	}
	return strings.Join(left, ", ")
}

// pidsWith lists the processes whose command line contains s.
func pidsWith(s string) []string {
	var out []string
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
		if strings.Contains(args, s) && !strings.HasPrefix(args, "bash -c read -r _;") {
			out = append(out, fmt.Sprintf("pid %d %s", pid, args))
		}
	}
	return out
}

// cmd runs a Slurm command (or any) on the launcher side with the
// cluster's environment, in the users' directory.
func (c *cluster) cmd(t *testing.T, d time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	x := exec.Command(name, args...)
	x.Dir, x.Env = c.work, c.env
	return testenv.RunTimeout(x, d)
}

// onNode runs a command on node i as on a login node (test/slurm/shell.sh).
func (c *cluster) onNode(t *testing.T, d time.Duration, i int, args ...string) (string, error) {
	t.Helper()
	return c.cmd(t, d, filepath.Join(c.root, "test/slurm/shell.sh"), append([]string{strconv.Itoa(i)}, args...)...)
}

// sbatch submits script (a path) with options and script arguments split by
// "--" and returns the job id and its output file.
func (c *cluster) sbatch(t *testing.T, opts []string, script string, args ...string) (string, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "slurm-%j.out")
	full := append(append([]string{"--parsable", "--output", out}, opts...), script)
	full = append(full, args...)
	res, err := c.cmd(t, 30*time.Second, "sbatch", full...)
	if err != nil {
		t.Fatalf("sbatch %s: %v\n%s", strings.Join(full, " "), err, res)
	}
	id, _, _ := strings.Cut(strings.TrimSpace(res), ";")
	if _, err := strconv.Atoi(id); err != nil {
		t.Fatalf("sbatch %s: no job id in %q", strings.Join(full, " "), res)
	}
	t.Logf("sbatch %s: job %s", strings.Join(full, " "), id)
	t.Cleanup(func() {
		x := exec.Command("scancel", id)
		x.Env = c.env
		x.Run()
	})
	return id, strings.ReplaceAll(out, "%j", id)
}

// jobField is a field of `scontrol show job ID` ("JobState").
func (c *cluster) jobField(t *testing.T, id, field string) string {
	t.Helper()
	out, err := c.cmd(t, 20*time.Second, "scontrol", "-o", "show", "job", id)
	if err != nil {
		return ""
	}
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, field+"="); ok {
			return v
		}
	}
	return ""
}

var finalStates = map[string]bool{"COMPLETED": true, "FAILED": true, "CANCELLED": true, "NODE_FAIL": true, "TIMEOUT": true,
	"OUT_OF_MEMORY": true, "BOOT_FAIL": true, "DEADLINE": true, "PREEMPTED": true}

// waitJob waits up to d for job id to end and returns its state and exit
// code ("0:0"); the job's output file is in the failure message.
func (c *cluster) waitJob(t *testing.T, id, output string, d time.Duration) (string, string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		state := c.jobField(t, id, "JobState")
		if finalStates[state] {
			return state, c.jobField(t, id, "ExitCode")
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(output)
			t.Fatalf("job %s still %s after %v; its output:\n%s", id, state, d, b)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitOutput waits up to d for a line of the job's output that contains
// each of subs, and returns it.
func waitOutput(t *testing.T, output string, d time.Duration, subs ...string) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		b, _ := os.ReadFile(output)
		for _, l := range strings.Split(string(b), "\n") {
			all := true
			for _, s := range subs {
				all = all && strings.Contains(l, s)
			}
			if all {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line with %q in the job's output after %v:\n%s", subs, d, b)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// outputWithin reports whether a line of the job's output holds sub
// within d.
func outputWithin(output string, d time.Duration, sub string) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(300 * time.Millisecond) {
		if b, _ := os.ReadFile(output); strings.Contains(string(b), sub) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

// writeScript writes a batch script into the test's directory.
func writeScript(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "job.sbatch")
	if err := os.WriteFile(p, []byte(text), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}
