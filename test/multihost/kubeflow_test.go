package multihost

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// Kubeflow's MPIJob on the test hosts: gorun as the launcher with the
// environment mpi-operator gives the launcher pod (OMPI_MCA_* below) and
// the operator's hostfile ("HOST slots=N" lines, as test/hosts/up.sh writes
// them), nothing else on its command line but -np and the program: it
// reaches the two hosts over real ssh and 4 of gorun's ranks pass the
// ring. (The operator's ssh setup, keys in ~/.ssh, is here the test hosts'
// ssh_config, given through OMPI_MCA_plm_rsh_args as the operator gives
// its own ssh options.)
func TestMPIJobLauncherOverSSH(t *testing.T) {
	e := need(t)
	c := exec.Command(e.gorun, "--allow-run-as-root", "-np", "4", e.ring)
	c.Dir = e.root
	c.Env = append(os.Environ(),
		"K_MPI_JOB_ROLE=launcher",
		"OMPI_MCA_orte_keep_fqdn_hostnames=true",
		"OMPI_MCA_orte_default_hostfile="+e.hostfile,
		"OMPI_MCA_plm_rsh_args=-F "+e.sshConfig+" -o ConnectionAttempts=10",
		"OMPI_MCA_orte_set_default_slots=2",
	)
	out, err := testenv.RunTimeout(c, 60*time.Second)
	if code := exitCode(err); code != 0 {
		t.Fatalf("gorun as MPIJob's launcher: exit status %d:\n%s", code, out)
	}
	if !strings.Contains(out, "gorun: hosts from OMPI_MCA_orte_default_hostfile="+e.hostfile) {
		t.Errorf("gorun did not say where its hosts came from:\n%s", out)
	}
	re := regexp.MustCompile(`(?m)^\[(\d)\] rank (\d) of 4 \(local \d, host ([0-9.]+), launcher gorun\): barrier passed$`)
	ms := re.FindAllStringSubmatch(out, -1)
	if len(ms) != 4 {
		t.Fatalf("want 4 ranks past the barrier:\n%s", out)
	}
	for _, m := range ms {
		if r := int(m[2][0] - '0'); m[3] != e.ips[r/2] {
			t.Errorf("rank %d on %s, want %s (the hostfile's slots, in order)", r, m[3], e.ips[r/2])
		}
	}
	e.noneLeft(t, 10*time.Second)
}

// Kubeflow's PyTorchJob on the test hosts: one of gorun's ranks started
// directly on each host, as the operator starts one per pod, with the
// operator's MASTER_ADDR (the master's address), MASTER_PORT, WORLD_SIZE
// and RANK and what examples/kubeflow/pytorchjob.yaml adds (GORUN_SECRET;
// no LOCAL_RANK: each takes itself as alone on its host): rank 0 serves the
// rendezvous on MASTER_PORT, and the two pass the ring.
func TestPyTorchJobPodsOnHosts(t *testing.T) {
	e := need(t)
	secret := strings.Repeat("5e", 32)
	outs := make([]string, 2)
	codes := make([]int, 2)
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := exec.Command("ip", "netns", "exec", e.ns(i+1), "env", "-i", "PATH=/usr/bin:/bin",
				"PYTHONUNBUFFERED=0", "MASTER_ADDR="+e.ips[0], "MASTER_PORT=23456", "WORLD_SIZE=2", fmt.Sprintf("RANK=%d", i),
				"GORUN_SECRET="+secret, e.ring, "-timeout", "40s")
			var b bytes.Buffer
			c.Stdout, c.Stderr = &b, &b
			err := c.Run()
			outs[i], codes[i] = b.String(), exitCode(err)
		}(i)
	}
	wg.Wait()
	for i := 0; i < 2; i++ {
		// (the host is os.Hostname() without gorun's GORUN_HOST: the test
		// hosts share this machine's)
		want := regexp.MustCompile(fmt.Sprintf(`(?m)^rank %d of 2 \(local 0, host \S+, launcher torchrun\): barrier passed$`, i))
		if codes[i] != 0 || !want.MatchString(outs[i]) {
			t.Errorf("pod %d: exit status %d, output:\n%s\nwant %q", i, codes[i], outs[i], want)
		}
	}
	e.noneLeft(t, 10*time.Second)
}
