package mpirun

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/rank"
)

// Kubeflow's MPIJob (mpi-operator) and PyTorchJob (training-operator), as
// far as one machine can play them; examples/kubeflow has the manifests,
// and test/multihost/kubeflow_test.go plays them over real ssh.

// mpiJobHostfile is /etc/mpi/hostfile as mpi-operator writes it for an
// MPIJob named gorun-nmt in namespace default with 2 workers and
// slotsPerWorker 2 ("%s.%s.%s.svc slots=%d": the worker's name, the job's
// Service, the namespace).
const mpiJobHostfile = "gorun-nmt-worker-0.gorun-nmt.default.svc slots=2\ngorun-nmt-worker-1.gorun-nmt.default.svc slots=2\n"

// mpiJobLauncherEnv sets the environment mpi-operator gives the launcher
// pod of an OpenMPI MPIJob (v2beta1: ssh, with OMPI_MCA_plm_rsh_args), with
// the hostfile in dir.
func mpiJobLauncherEnv(t *testing.T, dir string) string {
	t.Helper()
	hf := filepath.Join(dir, "hostfile")
	if err := os.WriteFile(hf, []byte(mpiJobHostfile), 0o644); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"K_MPI_JOB_ROLE":                    "launcher",
		"OMPI_MCA_orte_keep_fqdn_hostnames": "true",
		"OMPI_MCA_orte_default_hostfile":    hf,
		"OMPI_MCA_plm_rsh_args":             "-o ConnectionAttempts=10",
		"OMPI_MCA_orte_set_default_slots":   "2",
	} {
		t.Setenv(k, v)
	}
	return hf
}

// kubexec writes a stand-in for mpi-operator's v1 kubexec.sh (its
// launcher's OMPI_MCA_plm_rsh_agent): "kubexec.sh POD COMMAND" runs COMMAND
// in the pod with kubectl exec. Every "pod" is this machine here; withStdin
// is kubectl exec's -i (the operator's own script has none).
func kubexec(t *testing.T, dir string, withStdin bool) string {
	t.Helper()
	in := " </dev/null"
	if withStdin {
		in = ""
	}
	script := "#!/bin/sh\nset -x\nPOD_NAME=$1\nshift\n" +
		"# the operator's: ${KUBECTL} exec ${POD_NAME} -- /bin/sh -c \"$*\"\n" +
		"exec env -i PATH=/usr/bin:/bin MPIRUN_TEST_AS_GORUN=1 /bin/sh -c \"$*\"" + in + "\n"
	p := filepath.Join(dir, "kubexec.sh")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMPIJobLauncher: gorun in the launcher pod, with nothing on its
// command line but -np and the program, takes the hosts from the
// operator's hostfile (OMPI_MCA_orte_default_hostfile) and reaches the
// workers through OMPI_MCA_plm_rsh_agent; 4 of gorun's ranks on the two
// workers connect, rank 0 on worker 0. The operator's kubexec.sh as it is
// (kubectl exec without -i: no stdin for gorun's agent) is one line
// saying what is missing.
func TestMPIJobLauncher(t *testing.T) {
	clearForeign(t)
	dir := t.TempDir()
	hf := mpiJobLauncherEnv(t, dir)
	agent := kubexec(t, dir, true)
	t.Setenv(EnvOMPIRSHAgent, agent)
	code, out, errs := helperJob(t, Config{NP: 4}, "identity")
	if code != 0 {
		t.Fatalf("status %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	for _, want := range []string{
		"gorun: hosts from OMPI_MCA_orte_default_hostfile=" + hf + " (as mpirun reads it; Kubeflow's MPIJob sets it)\n",
		"gorun: remote hosts through OMPI_MCA_plm_rsh_agent=" + agent + ", called as: " + agent + " HOST COMMAND (it must pass gorun's stdin on, as kubectl exec -i does)\n",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	ids := regexp.MustCompile(`(?m)^rank (\d) of 4 local (\d) of 2 launcher gorun `).FindAllStringSubmatch(out, -1)
	if len(ids) != 4 || strings.Count(out, " connected\n") != 4 {
		t.Fatalf("want 4 ranks of gorun, 2 on each worker, connected:\n%s%s", out, errs)
	}

	// the placement: the operator's slots, rank 0 on the first worker
	o := testenv.Buffer{}
	code, err := Run(Config{Environ: os.Environ(), DryRun: true, Program: "/bin/true", StdinRank: -1, Stdout: &o, Stderr: &testenv.Buffer{}})
	if err != nil || code != 0 || !strings.Contains(o.String(), "0     gorun-nmt-worker-0.gorun-nmt.default.svc  0           2           0          launch-agent\n") ||
		!strings.Contains(o.String(), "3     gorun-nmt-worker-1.gorun-nmt.default.svc  1           2           1          launch-agent\n") {
		t.Errorf("dry run: %d %v\n%s", code, err, o.String())
	}

	// kubectl exec without -i
	kubexec(t, dir, false)
	code, out, errs = helperJob(t, Config{NP: 4}, "identity")
	re := regexp.MustCompile(`^gorun: cannot start rank \d on host gorun-nmt-worker-\d\.gorun-nmt\.default\.svc: gorun agent: no job secret on stdin \(.*a --launch-agent must pass gorun's stdin on, as ssh does and kubectl exec does with -i\)$`)
	var gorunLines []string
	for _, l := range strings.Split(strings.TrimSpace(errs), "\n") {
		if strings.HasPrefix(l, "gorun: ") && !strings.HasPrefix(l, "gorun: hosts from") && !strings.HasPrefix(l, "gorun: remote hosts through") {
			gorunLines = append(gorunLines, l)
		}
	}
	if code != ExitLaunch || len(gorunLines) != 1 || !re.MatchString(gorunLines[0]) || out != "" {
		t.Errorf("kubexec.sh without -i: status %d (want %d), stdout %q, gorun's lines:\n%s", code, ExitLaunch, out, strings.Join(gorunLines, "\n"))
	}
}

// TestMPIJobSSH: with ssh (mpi-operator v2beta1's way), the operator's
// OMPI_MCA_plm_rsh_args are added to gorun's ssh after --ssh-args (whose
// options win: ssh keeps the first); OpenMPI's default agent "ssh : rsh" is
// ssh; -H or -hostfile win over the operator's hostfile; a hostfile that
// is not there is one line naming the variable.
func TestMPIJobSSH(t *testing.T) {
	clearForeign(t)
	dir := t.TempDir()
	mpiJobLauncherEnv(t, dir)
	t.Setenv(EnvOMPIRSHAgent, "ssh : rsh")
	dry := func(cfg Config) (string, error) {
		t.Helper()
		var o, e testenv.Buffer
		cfg.DryRun, cfg.Program, cfg.StdinRank, cfg.Stdout, cfg.Stderr = true, "/bin/true", -1, &o, &e
		cfg.Environ = os.Environ()
		_, err := Run(cfg)
		return o.String() + e.String(), err
	}
	out, err := dry(Config{SSHArgs: "-o ConnectionAttempts=3 -F ./cfg", Dir: "/tmp", RemoteGorun: "/opt/gorun"})
	want := "[gorun-nmt-worker-0.gorun-nmt.default.svc: ranks 0, 1] ssh -o ConnectionAttempts=3 -F ./cfg -o ConnectionAttempts=10 -o BatchMode=yes -o ConnectTimeout=10 gorun-nmt-worker-0.gorun-nmt.default.svc 'cd /tmp && exec env "
	if err != nil || !strings.Contains(out, want) || !strings.Contains(out, "[gorun-nmt-worker-1.gorun-nmt.default.svc: ranks 2, 3] ssh ") {
		t.Errorf("dry run: %v; want %q in:\n%s", err, want, out)
	}
	if out, err := dry(Config{Hosts: []Host{{Name: "other.invalid", Slots: 1}}}); err != nil || strings.Contains(out, "gorun-nmt") || !strings.Contains(out, "other.invalid") {
		t.Errorf("-H given: %v\n%s", err, out)
	}
	t.Setenv(EnvOMPIHostfile, filepath.Join(dir, "none"))
	var o, e testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), Program: "/bin/true", StdinRank: -1, Stdout: &o, Stderr: &e})
	wantErr := "OMPI_MCA_orte_default_hostfile=" + filepath.Join(dir, "none") + ": hostfile: open " + filepath.Join(dir, "none") + ": no such file or directory"
	if code != ExitUsage || err == nil || err.Error() != wantErr || o.String()+e.String() != "" {
		t.Errorf("missing hostfile: %d %v; want %q", code, err, wantErr)
	}
}

// pyTorchJobPods reads examples/kubeflow/pytorchjob.yaml and returns each
// pod's environment as the operator completes it: the manifest's own
// (GORUN_SECRET from its Secret: secret here), then PYTHONUNBUFFERED,
// MASTER_ADDR (the master pod's Service name; masterAddr here), MASTER_PORT
// (the pytorchjob-port; port here), WORLD_SIZE and RANK (master 0, worker
// i: i+1), as training-operator's setPodEnv does.
func pyTorchJobPods(t *testing.T, masterAddr, port, secret string) (pods [][]string, command []string) {
	t.Helper()
	b, err := os.ReadFile("../examples/kubeflow/pytorchjob.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type envVar struct {
		Name      string
		Value     string
		ValueFrom *struct {
			SecretKeyRef *struct{ Name, Key string } `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	}
	type replica struct {
		Replicas int
		Template struct {
			Spec struct {
				Containers []struct {
					Name    string
					Command []string
					Env     []envVar
					Ports   []struct {
						Name          string
						ContainerPort int `yaml:"containerPort"`
					}
				}
			}
		}
	}
	var job struct {
		Kind string
		Spec struct {
			Replicas map[string]replica `yaml:"pytorchReplicaSpecs"`
		}
	}
	if err := yaml.Unmarshal(b, &job); err != nil {
		t.Fatalf("pytorchjob.yaml: %v", err)
	}
	master, worker := job.Spec.Replicas["Master"], job.Spec.Replicas["Worker"]
	if job.Kind != "PyTorchJob" || master.Replicas != 1 || worker.Replicas < 1 {
		t.Fatalf("pytorchjob.yaml: want a PyTorchJob with 1 master and workers, got %+v", job)
	}
	world := master.Replicas + worker.Replicas
	podEnv := func(r replica, rk int) []string {
		c := r.Template.Spec.Containers[0]
		if c.Name != "pytorch" {
			t.Fatalf("pytorchjob.yaml: container %q: the operator sets its variables in the container named pytorch", c.Name)
		}
		command = c.Command
		env := []string{"PATH=/usr/bin:/bin"}
		for _, v := range c.Env {
			switch {
			case v.ValueFrom != nil && v.ValueFrom.SecretKeyRef != nil:
				env = append(env, v.Name+"="+secret)
			default:
				env = append(env, v.Name+"="+v.Value)
			}
		}
		return append(env, "PYTHONUNBUFFERED=0", "MASTER_ADDR="+masterAddr, "MASTER_PORT="+port,
			"WORLD_SIZE="+strconv.Itoa(world), "RANK="+strconv.Itoa(rk))
	}
	found := false
	for _, p := range master.Template.Spec.Containers[0].Ports {
		found = found || p.Name == "pytorchjob-port"
	}
	if !found {
		t.Fatalf("pytorchjob.yaml: the master's container has no port named pytorchjob-port (MASTER_PORT)")
	}
	pods = append(pods, podEnv(master, 0))
	for i := 0; i < worker.Replicas; i++ {
		pods = append(pods, podEnv(worker, i+1))
	}
	return pods, command
}

// TestPyTorchJobRanks: gorun's ranks started directly, one per "pod", with
// the environment of examples/kubeflow/pytorchjob.yaml and of the
// operator: they read it as torchrun's, rank 0 serves the rendezvous on
// MASTER_PORT, one rank per pod, and they connect. Without GORUN_SECRET
// (the manifest's Secret left out) a rank refuses to start, in one line.
func TestPyTorchJobRanks(t *testing.T) {
	self, _ := os.Executable()
	port := testenv.FreeUDPPort(t)
	pods, command := pyTorchJobPods(t, "localhost", port, rank.NewSecret())
	if len(command) == 0 || !strings.HasSuffix(command[0], "/nmt-train") {
		t.Errorf("pytorchjob.yaml runs %q, want gorun's nmt-train", command)
	}
	type result struct {
		out  string
		code int
	}
	results := make([]result, len(pods))
	var wg sync.WaitGroup
	for i, env := range pods {
		wg.Add(1)
		go func(i int, env []string) {
			defer wg.Done()
			c := exec.Command(self, rankHelperArg, "identity")
			c.Env = env
			var b bytes.Buffer
			c.Stdout, c.Stderr = &b, &b
			done := make(chan error, 1)
			if err := c.Start(); err != nil {
				results[i] = result{err.Error(), -1}
				return
			}
			go func() { done <- c.Wait() }()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				c.Process.Kill()
				<-done
			}
			results[i] = result{b.String(), c.ProcessState.ExitCode()}
		}(i, env)
	}
	wg.Wait()
	n := len(pods)
	for r, res := range results {
		want := fmt.Sprintf("rank %d of %d local 0 of 1 launcher torchrun rendezvous localhost:%s serve %v ", r, n, port, r == 0)
		if res.code != 0 || !strings.HasPrefix(res.out, want) || !strings.Contains(res.out, fmt.Sprintf("rank %d connected\n", r)) {
			t.Errorf("pod of rank %d: status %d, output %q; want %q... and connected", r, res.code, res.out, want)
		}
	}

	// no GORUN_SECRET
	var env []string
	for _, kv := range pods[1] {
		if !strings.HasPrefix(kv, rank.EnvSecret+"=") {
			env = append(env, kv)
		}
	}
	c := exec.Command(self, rankHelperArg, "identity")
	c.Env = env
	out, err := c.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err == nil || len(lines) != 1 || !strings.Contains(lines[0], "started by torchrun without a job id (TORCHELASTIC_RUN_ID) or GORUN_SECRET: two jobs on MASTER_PORT "+port+" could join each other") {
		t.Errorf("without GORUN_SECRET: %v, output %q", err, out)
	}
}
