package multihost

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// torchPython returns a Python interpreter that imports torch with its
// distributed package (Debian's python3-torch installs into
// /usr/bin/python3's dist-packages; python3 on PATH may be another
// Python), or "" and why there is none.
func torchPython() (string, string) {
	var cands []string
	if p := os.Getenv("GORUN_TEST_PYTHON"); p != "" {
		cands = append(cands, p)
	}
	cands = append(cands, "/usr/bin/python3")
	if p, err := exec.LookPath("python3"); err == nil {
		cands = append(cands, p)
	}
	var tried []string
	seen := map[string]bool{}
	for _, py := range cands {
		if seen[py] {
			continue
		}
		seen[py] = true
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		out, err := exec.CommandContext(ctx, py, "-c", "import torch, torch.distributed as d; assert d.is_available() and d.is_gloo_available(); print(torch.__version__)").CombinedOutput()
		cancel()
		if err == nil {
			return py, ""
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		tried = append(tried, fmt.Sprintf("%s: %s", py, lines[len(lines)-1]))
	}
	return "", "PyTorch with gloo is not importable by " + strings.Join(tried, "; ") + " (apt-get install python3-torch, or GORUN_TEST_PYTHON=an interpreter that has it)"
}

// TestDDPUnderGorun runs a PyTorch DistributedDataParallel script written
// for torchrun (examples/ddp/train.py: gloo, env://, a small model, a few
// steps), unchanged, as 4 ranks of gorun on the two test hosts, gorun
// starting them from the launcher's side: rank 0 is on a remote host, so
// the agent there picks MASTER_PORT and MASTER_ADDR and gorun passes them
// to the ranks on the other host. GLOO_SOCKET_IFNAME=eth0 is the test
// hosts' interface, for gloo's own connections. Every rank must see its
// RANK, LOCAL_RANK and the same master, the losses (each rank's own
// batches) must differ and the gradients after DDP's allreduce must be the
// same on every rank at every step.
func TestDDPUnderGorun(t *testing.T) {
	e := need(t)
	py, why := torchPython()
	if py == "" {
		t.Skip(why)
	}
	script := filepath.Join(e.root, "examples/ddp/train.py")
	outDir := t.TempDir()
	const steps = 3
	out, code := e.run(t, 150*time.Second, "-np", "4", "--iface", e.nt+".0/24", "-x", "GLOO_SOCKET_IFNAME=eth0",
		py, script, "--steps", strconv.Itoa(steps), "--out", outDir)
	if code != 0 {
		t.Fatalf("gorun: exit status %d:\n%s", code, out)
	}
	// who each rank is, and where its master is
	id := regexp.MustCompile(`(?m)^\[(\d)\] rank (\d) of (\d+): local rank (\d+), host \S+, MASTER_ADDR=(\S+) MASTER_PORT=(\d+)$`)
	ids := id.FindAllStringSubmatch(out, -1)
	if len(ids) != 4 {
		t.Fatalf("want 4 ranks' lines, got %d:\n%s", len(ids), out)
	}
	master := ids[0][5] + ":" + ids[0][6]
	for _, m := range ids {
		tag, _ := strconv.Atoi(m[1])
		if m[2] != m[1] || m[3] != "4" || m[4] != strconv.Itoa(tag%2) || m[5]+":"+m[6] != master {
			t.Errorf("rank %s (gorun's tag) says: torch rank %s of %s, local rank %s, master %s:%s; want rank %d of 4, local rank %d, master %s",
				m[1], m[2], m[3], m[4], m[5], m[6], tag, tag%2, master)
		}
	}
	if ids[0][5] != e.ips[0] {
		t.Errorf("MASTER_ADDR %s, want rank 0's host %s", ids[0][5], e.ips[0])
	}
	// the steps: one gradient checksum per step on every rank
	st := regexp.MustCompile(`(?m)^\[(\d)\] rank \d step (\d+) loss (\S+) grad_norm \S+ grad_sha256 ([0-9a-f]{16})$`)
	sums := map[string]map[string]bool{}
	losses := map[string]bool{}
	n := 0
	for _, m := range st.FindAllStringSubmatch(out, -1) {
		if sums[m[2]] == nil {
			sums[m[2]] = map[string]bool{}
		}
		sums[m[2]][m[4]] = true
		if m[2] == "0" {
			losses[m[3]] = true
		}
		n++
	}
	if n != 4*steps {
		t.Fatalf("want %d step lines (4 ranks x %d steps), got %d:\n%s", 4*steps, steps, n, out)
	}
	for s := 0; s < steps; s++ {
		if got := sums[strconv.Itoa(s)]; len(got) != 1 {
			t.Errorf("step %d: the ranks' gradients differ after DDP's allreduce (checksums %v)", s, got)
		}
	}
	if len(losses) < 2 {
		t.Errorf("step 0: every rank had the same loss (%v): the ranks did not train on batches of their own", losses)
	}
	for r := 0; r < 4; r++ {
		if _, err := os.Stat(filepath.Join(outDir, fmt.Sprintf("rank.%d.json", r))); err != nil {
			t.Errorf("rank %d wrote no result: %v", r, err)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, " done: ") || strings.HasPrefix(l, "gorun:") {
			t.Log(l)
		}
	}
	e.noneLeft(t, 10*time.Second)
}
