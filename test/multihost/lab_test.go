package multihost

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// The lab on two VMs, as the README's checklist runs it: the lab's own
// mpirun line with gorun in mpirun's place and nmt-train in run.py's
// (only --ssh-args added, for the test hosts' ssh), started on the first
// host, with an OpenSeq2Seq config naming the lab's files (the committed
// configs/lab-base.py at a test's sizes). 4 ranks on 2 hosts train with
// evaluation and checkpoint into the config's logdir, relative to where
// the job starts; the interface is eth0's; --mode=eval and --mode=infer
// then run the same way.
func TestLabOnTwoHosts(t *testing.T) {
	e := need(t)
	root := testenv.LabFiles(t, "", 1500)
	cfg := testenv.LabConfig(t, e.root, root)
	work := t.TempDir()
	lab := func(mode ...string) (string, int) {
		t.Helper()
		args := append([]string{"netns", "exec", e.ns(1), e.gorun,
			"--allow-run-as-root", "-n", "4", "-H", e.ips[0] + ":2," + e.ips[1] + ":2", "-bind-to", "none", "-map-by", "slot",
			"--mca", "btl_tcp_if_include", "eth0", "-x", "NCCL_SOCKET_IFNAME=eth0", "-x", "NCCL_DEBUG=INFO", "-x", "LD_LIBRARY_PATH",
			"--port-range", "29500-29519", "--ssh-args", "-F " + e.sshConfig,
			e.train, "--config_file=" + cfg, "--use_horovod=True"}, mode...)
		c := exec.Command("ip", args...)
		c.Dir = work
		c.Env = testenv.CleanEnv()
		t.Logf("(in %s) ip %s", work, strings.Join(args, " "))
		out, err := testenv.RunTimeout(c, 240*time.Second)
		return out, exitCode(err)
	}
	out, code := lab("--mode=train_eval")
	// the corpus cache is the default one (~/.cache/gorun/corpus): this
	// run's entry goes with the test
	for _, m := range regexp.MustCompile(`data: (?:prepared .* into|using) (\S+?),? `).FindAllStringSubmatch(out, -1) {
		if strings.Contains(m[1], "/gorun/corpus/") {
			t.Cleanup(func() { os.RemoveAll(m[1]) })
		}
	}
	if code != 0 {
		t.Fatalf("the lab's command: exit status %d:\n%s", code, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "gorun:") || strings.Contains(l, "] data:") || strings.Contains(l, "rank(s) on") || strings.Contains(l, "eval at step") {
			t.Log(l)
		}
	}
	for _, want := range []string{
		"the ranks bind and advertise eth0",
		"4 rank(s) on " + e.ips[0] + ", " + e.ips[1],
		"step 40/40", "eval at step 20 |", "eval at step 40 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the lab's command printed no %q:\n%s", want, out)
		}
	}
	logdir := filepath.Join(work, "runs/lab-base")
	for _, f := range []string{"latest", "ckpt-30", "ckpt-40", "metrics.jsonl", "report.md", "run.json"} {
		if _, err := os.Stat(filepath.Join(logdir, f)); err != nil {
			t.Errorf("the config's logdir lacks %s: %v", f, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(logdir, "metrics.jsonl")); err != nil || strings.Count(string(b), `"kind":"eval"`) != 2 {
		t.Errorf("metrics.jsonl: want 2 eval records (steps 20 and 40): %v\n%s", err, b)
	}

	if out, code = lab("--mode=eval"); code != 0 || !strings.Contains(out, "eval at step 40 |") {
		t.Errorf("--mode=eval: exit status %d, want 0 and the eval of step 40:\n%s", code, out)
	}
	translations := filepath.Join(work, "wmt14.out.tok")
	if out, code = lab("--mode=infer", "--infer_output_file="+translations); code != 0 {
		t.Fatalf("--mode=infer: exit status %d:\n%s", code, out)
	}
	f, err := os.Open(translations)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for sc := bufio.NewScanner(f); sc.Scan(); n++ {
	}
	if n != 25 {
		t.Errorf("--mode=infer wrote %d lines, want one for each of the 25 source lines", n)
	}
	e.noneLeft(t, 10*time.Second)
}
