package slurm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// trainArgs are nmt-train train flags after the example's configs/demo.yaml:
// the tiny preset on a small synthetic corpus, one thread per rank (4 ranks
// share this machine's cores), a few steps.
func trainArgs(maxSteps, checkpointEvery int, more ...string) []string {
	return append([]string{"--synthetic-lines", "2000", "--batch-tokens", "1024", "--max-steps", strconv.Itoa(maxSteps),
		"--log-every", "2", "--eval-every", "0", "--checkpoint-every", strconv.Itoa(checkpointEvery), "--threads", "1"}, more...)
}

const example = "examples/slurm/train.sbatch"

// sbatch examples/slurm/train.sbatch: 2 nodes x 2 tasks of srun train
// across the test hosts (rank 0 serving the rendezvous on h1) and leave the
// run directory with its report.
func TestSbatchTrain(t *testing.T) {
	c := need(t)
	run := filepath.Join(t.TempDir(), "run")
	id, out := c.sbatch(t, []string{"--export=ALL,RUN_DIR=" + run}, example, trainArgs(6, 0)...)
	state, code := c.waitJob(t, id, out, 3*time.Minute)
	text := readFile(t, out)
	if state != "COMPLETED" || code != "0:0" {
		t.Fatalf("job %s: %s, exit code %s; output:\n%s", id, state, code, text)
	}
	for _, want := range []string{"4 rank(s) on h1, h2", "step 6/6 |"} {
		if !strings.Contains(text, want) {
			t.Errorf("the job's output lacks %q:\n%s", want, text)
		}
	}
	for _, f := range []string{"report.md", "metrics.jsonl", "run.json", "latest"} {
		if _, err := os.Stat(filepath.Join(run, f)); err != nil {
			t.Errorf("the run directory lacks %s: %v", f, err)
		}
	}
}

// Inside an allocation gorun takes its hosts and slots from Slurm, says so
// in one line, and starts the ranks of the other node with srun; an
// explicit -H wins. Both in a batch script and under salloc.
func TestGorunInAllocation(t *testing.T) {
	c := need(t)
	run := filepath.Join(t.TempDir(), "run")
	script := writeScript(t, `#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
set -e
bin/gorun -np 4 bin/nmt-train train --config configs/demo.yaml --run-dir "$RUN_DIR" `+strings.Join(trainArgs(4, 0), " ")+`
echo "--- -H wins"
bin/gorun -H h1:2 bin/ring
`)
	id, out := c.sbatch(t, []string{"--export=ALL,RUN_DIR=" + run}, script)
	state, code := c.waitJob(t, id, out, 3*time.Minute)
	text := readFile(t, out)
	if state != "COMPLETED" || code != "0:0" {
		t.Fatalf("job %s: %s, exit code %s; output:\n%s", id, state, code, text)
	}
	train, ring, _ := strings.Cut(text, "--- -H wins")
	want := fmt.Sprintf("gorun: hosts from Slurm job %s: h1:2,h2:2 (4 slots) from SLURM_JOB_NODELIST=h[1-2], SLURM_TASKS_PER_NODE=2(x2); ranks on other nodes started with srun (no -hostfile or -H given)", id)
	if n := strings.Count(train, "gorun: hosts from Slurm"); n != 1 || !strings.Contains(train, want+"\n") {
		t.Errorf("want the line %q once, got %d such lines:\n%s", want, n, train)
	}
	for _, want := range []string{"4 rank(s) on h1, h2", "step 4/4 |"} {
		if !strings.Contains(train, want) {
			t.Errorf("gorun -np 4 nmt-train: the output lacks %q:\n%s", want, train)
		}
	}
	if strings.Contains(ring, "hosts from Slurm") || !strings.Contains(ring, "ring") {
		t.Errorf("gorun -H h1:2 in the allocation: want ring's lines and no hosts from Slurm:\n%s", ring)
	}

	// salloc on a login node (h1): the command runs there, gorun inside.
	res, err := c.onNode(t, 2*time.Minute, 1, "salloc", "--nodes=2", "--ntasks-per-node=1", "bin/gorun", "bin/ring")
	if err != nil {
		t.Fatalf("salloc -N 2 gorun ring: %v\n%s", err, res)
	}
	if !regexp.MustCompile(`gorun: hosts from Slurm job \d+: h1:1,h2:1 \(2 slots\)`).MatchString(res) {
		t.Errorf("salloc: gorun's line about the allocation is missing:\n%s", res)
	}
}

// Preemption as clusters do it: TERM to the batch script (what
// --signal=B:TERM@60 sends before the time limit) stops every rank after
// its step with a checkpoint; the script requeues the job, which continues
// from latest by itself. TERM to the job's steps (scancel --signal=TERM)
// stops it the same way.
func TestPreemptionContinues(t *testing.T) {
	c := need(t)
	run := filepath.Join(t.TempDir(), "run")
	id, out := c.sbatch(t, []string{"--export=ALL,RUN_DIR=" + run}, example, trainArgs(999, 0)...)
	waitOutput(t, out, 3*time.Minute, "step 4/999 |")
	if res, err := c.cmd(t, 20*time.Second, "scancel", "--batch", "--signal=TERM", id); err != nil {
		t.Fatalf("scancel --batch --signal=TERM %s: %v\n%s", id, err, res)
	}
	stop := waitOutput(t, out, 2*time.Minute, "nmt-train: stopped by terminated after step")
	first := stepOf(t, stop)
	waitOutput(t, out, time.Minute, "train.sbatch: requeueing job "+id)
	// Slurm holds a requeued job until the credentials of its last run
	// have expired (Reason=BeginTime; AuthInfo's cred_expire, 120 s by
	// default and 20 s on the test cluster): started sooner, the job
	// fails at once ("Job credential revoked"). Then it starts again by
	// itself and continues from the checkpoint.
	resumed := fmt.Sprintf("has a checkpoint (ckpt-%d): continuing it", first)
	if !outputWithin(out, 90*time.Second, resumed) {
		res, _ := c.cmd(t, 20*time.Second, "scontrol", "-o", "show", "job", id)
		t.Fatalf("job %s did not start again within 90 s of its requeue:\n%s\n%s\noutput:\n%s", id, strings.TrimSpace(res), c.logsAbout(id), readFile(t, out))
	}
	waitOutput(t, out, time.Minute, fmt.Sprintf("nmt-train: resumed from step %d", first))
	waitOutput(t, out, time.Minute, fmt.Sprintf("step %d/999 |", (first/2+1)*2)) // logged every 2 steps
	if res, err := c.cmd(t, 20*time.Second, "scancel", "--signal=TERM", id); err != nil {
		t.Fatalf("scancel --signal=TERM %s: %v\n%s", id, err, res)
	}
	state, code := c.waitJob(t, id, out, 2*time.Minute)
	text := readFile(t, out)
	stops := regexp.MustCompile(`nmt-train: stopped by terminated after step (\d+)`).FindAllStringSubmatch(text, -1)
	if len(stops) != 2 {
		t.Fatalf("want 2 stops with a checkpoint, got %d; output:\n%s", len(stops), text)
	}
	second, _ := strconv.Atoi(stops[1][1])
	if second <= first {
		t.Errorf("the continued job stopped at step %d, not after the first stop's %d", second, first)
	}
	if code != "143:0" || state != "FAILED" {
		t.Errorf("the job ended %s with exit code %s, want FAILED 143:0 (srun's status of a stopped nmt-train)", state, code)
	}
	if latest := strings.TrimSpace(readFile(t, filepath.Join(run, "latest"))); latest != fmt.Sprintf("ckpt-%d", second) {
		t.Errorf("latest is %q, want ckpt-%d", latest, second)
	}
	if n := strings.Count(text, "train.sbatch: requeueing job"); n != 1 {
		t.Errorf("the job requeued itself %d times, want once (TERM to the steps alone does not requeue)", n)
	}
}

func stepOf(t *testing.T, line string) int {
	t.Helper()
	m := regexp.MustCompile(`after step (\d+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no step in %q", line)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// Bad input: more ranks than the allocation's slots, a job whose ranks on
// one node lack the secret the others have, a node whose munge key
// differs. Each is one line naming the node or rank.
func TestBadInput(t *testing.T) {
	c := need(t)
	t.Run("more ranks than the allocation", func(t *testing.T) {
		script := writeScript(t, "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\nbin/gorun -np 6 bin/ring\n")
		id, out := c.sbatch(t, nil, script)
		state, code := c.waitJob(t, id, out, time.Minute)
		text := readFile(t, out)
		if state != "FAILED" || code != "2:0" {
			t.Errorf("job %s: %s, exit code %s, want FAILED 2:0", id, state, code)
		}
		want := "gorun: -np 6 is more than the 4 slots of h1:2, h2:2"
		if strings.Count(text, "\n")-strings.Count(text, "gorun: hosts from Slurm") != 1 || !strings.Contains(text, want) {
			t.Errorf("want gorun's line about the allocation and one line %q..., got:\n%s", want, text)
		}
	})
	t.Run("no secret on one node", func(t *testing.T) {
		script := writeScript(t, `#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
export GORUN_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
srun bash -c 'if [ "$SLURM_NODEID" = 1 ]; then unset GORUN_SECRET; fi; exec bin/ring --timeout 20s'
`)
		id, out := c.sbatch(t, nil, script)
		state, _ := c.waitJob(t, id, out, 2*time.Minute)
		text := readFile(t, out)
		if state != "FAILED" {
			t.Errorf("job %s: %s, want FAILED", id, state)
		}
		// rank 1's own line: the rendezvous holds another secret; srun's
		// names its node.
		if !regexp.MustCompile(`(?m)^ring: rank 1: .*different job secret`).MatchString(text) ||
			!strings.Contains(text, "srun: error: h2: task 1: Exited with exit code 1") {
			t.Errorf("want rank 1's line about the other secret and srun's naming h2:\n%s", text)
		}
	})
	t.Run("munge key differs", func(t *testing.T) {
		lock, slot, err := testenv.LockSlot("slurm")
		if err != nil {
			t.Skip(err)
		}
		state, _, _, names := setNames(slot)
		env := append(baseEnv(), names...)
		stop, err := testenv.Watchdog(filepath.Join(c.root, "test/slurm/down.sh"), env, lock, 90*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		key := filepath.Join(t.TempDir(), "other.key")
		if err := os.WriteFile(key, []byte(strings.Repeat("another key, not the cluster's ", 40)), 0o400); err != nil {
			t.Fatal(err)
		}
		up := exec.Command(filepath.Join(c.root, "test/slurm/up.sh"))
		up.Env = append(env, "HOSTS=1", "NODE_MUNGE_KEY=1="+key)
		res, err := testenv.RunTimeout(up, 90*time.Second)
		if err == nil {
			t.Fatalf("up.sh with another munge key on node h1 succeeded:\n%s", res)
		}
		lines := strings.Split(strings.TrimSpace(res), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], "node h1") || !strings.Contains(lines[0], "munge key differs") {
			t.Errorf("want one line naming node h1 and its munge key, got:\n%s", res)
		}
		if _, err := os.Stat(state); err == nil {
			t.Errorf("up.sh left %s after failing", state)
		}
	})
}

// A node lost mid-job (its slurmd, slurmstepd and ranks killed): the job
// ends naming the node, the last checkpoint is whole, and a job submitted
// again on the node left continues from it. Last: the node stays down.
func TestNodeLost(t *testing.T) {
	c := need(t)
	run := filepath.Join(t.TempDir(), "run")
	id, out := c.sbatch(t, []string{"--no-requeue", "--export=ALL,RUN_DIR=" + run}, example,
		trainArgs(999, 2, "--timeout", "20s")...)
	waitOutput(t, out, 3*time.Minute, "step 4/999 |")
	killNode(t, c, 2)
	state, code := c.waitJob(t, id, out, 3*time.Minute)
	text := readFile(t, out)
	if state == "COMPLETED" {
		t.Fatalf("job %s completed after its node h2 was lost; output:\n%s", id, text)
	}
	// srun names the node. The ranks left name a rank on h2 when they see
	// the loss before Slurm cancels the step (a race: in some runs Slurm
	// kills them first), so their lines are logged, not required.
	ranks := regexp.MustCompile(`(?m)^nmt-train: rank \d+: .*rank \d+ \(h2\).*$`).FindAllString(text, -1)
	for _, l := range ranks {
		t.Logf("a rank names the node: %s", l)
	}
	if !strings.Contains(text, "srun: error: Node failure on h2") {
		t.Errorf("job %s (%s, exit code %s): want srun's Node failure on h2; output:\n%s", id, state, code, text)
	}
	if state != "NODE_FAIL" {
		t.Errorf("job %s ended %s, want NODE_FAIL", id, state)
	}
	latest := strings.TrimSpace(readFile(t, filepath.Join(run, "latest")))
	if !strings.HasPrefix(latest, "ckpt-") {
		t.Fatalf("no checkpoint in %s (latest %q)", run, latest)
	}
	step, _ := strconv.Atoi(strings.TrimPrefix(latest, "ckpt-"))
	// Again, on the node that is left: it continues from latest by itself.
	id2, out2 := c.sbatch(t, []string{"--no-requeue", "--nodes=1", "--nodelist=h1", "--export=ALL,RUN_DIR=" + run}, example,
		trainArgs(step+2, 0)...)
	state2, code2 := c.waitJob(t, id2, out2, 3*time.Minute)
	text2 := readFile(t, out2)
	if state2 != "COMPLETED" || code2 != "0:0" {
		t.Fatalf("job %s on h1: %s, exit code %s; output:\n%s", id2, state2, code2, text2)
	}
	for _, want := range []string{fmt.Sprintf("has a checkpoint (%s): continuing it", latest), fmt.Sprintf("step %d/%d |", step+2, step+2)} {
		if !strings.Contains(text2, want) {
			t.Errorf("the job submitted again lacks %q:\n%s", want, text2)
		}
	}
}

// killNode kills everything in node i's namespace (slurmd, slurmstepd, the
// ranks, sshd) with SIGKILL: the node is lost.
func killNode(t *testing.T, c *cluster, i int) {
	t.Helper()
	res, err := exec.Command("ip", "netns", "pids", fmt.Sprintf("%s%d", c.name, i)).Output()
	if err != nil {
		t.Fatalf("ip netns pids: %v", err)
	}
	n := 0
	for _, f := range strings.Fields(string(res)) {
		if pid, err := strconv.Atoi(f); err == nil && syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	t.Logf("node h%d lost: %d processes killed", i, n)
}

// logsAbout is what slurmctld's and the slurmds' logs say of job id (its
// last 40 lines), for a test that fails on a job Slurm did not start.
func (c *cluster) logsAbout(id string) string {
	files, _ := filepath.Glob(filepath.Join(c.state, "h*", "slurmd.log"))
	files = append([]string{filepath.Join(c.state, "slurmctld.log")}, files...)
	re := regexp.MustCompile(`(JobId=|job |\[|jobid )` + regexp.QuoteMeta(id) + `\b`)
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", f, err)
			continue
		}
		var lines []string
		for _, l := range strings.Split(string(data), "\n") {
			if re.MatchString(l) {
				lines = append(lines, l)
			}
		}
		fmt.Fprintf(&b, "%s, the lines about job %s:\n%s\n", filepath.Base(filepath.Dir(f))+"/"+filepath.Base(f), id, strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
	return b.String()
}
