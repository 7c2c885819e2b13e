package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

var ringBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ringtest")
	if err != nil {
		panic(err)
	}
	ringBin = filepath.Join(dir, "ring")
	out, err := exec.Command("go", "build", "-o", ringBin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building ring: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// startByHand runs n ring processes with the environment a foreign launcher
// would give rank r, and waits for all of them.
func startByHand(t *testing.T, n int, env func(r int) []string) []string {
	t.Helper()
	outs := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			cmd := exec.Command(ringBin, "-timeout", "20s")
			cmd.Env = append(testenv.CleanEnv(), env(r)...)
			var b bytes.Buffer
			cmd.Stdout, cmd.Stderr = &b, &b
			errs[r] = cmd.Run()
			outs[r] = b.String()
		}(r)
	}
	wg.Wait()
	for r := range errs {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v\n%s", r, errs[r], outs[r])
		}
	}
	return outs
}

func TestForeignLaunchers(t *testing.T) {
	const n = 3
	cases := map[string]func(port string) func(r int) []string{
		"openmpi": func(port string) func(r int) []string {
			return func(r int) []string {
				return []string{fmt.Sprintf("OMPI_COMM_WORLD_RANK=%d", r), fmt.Sprintf("OMPI_COMM_WORLD_SIZE=%d", n),
					fmt.Sprintf("OMPI_COMM_WORLD_LOCAL_RANK=%d", r), "OMPI_MCA_ess_base_jobid=4242", "GORUN_RENDEZVOUS=127.0.0.1:" + port}
			}
		},
		"slurm": func(port string) func(r int) []string {
			return func(r int) []string {
				return []string{fmt.Sprintf("SLURM_PROCID=%d", r), fmt.Sprintf("SLURM_NTASKS=%d", n),
					fmt.Sprintf("SLURM_LOCALID=%d", r), "SLURM_JOB_ID=77", "SLURM_JOB_NODELIST=localhost", "MASTER_PORT=" + port}
			}
		},
		"torchrun": func(port string) func(r int) []string {
			return func(r int) []string {
				return []string{fmt.Sprintf("RANK=%d", r), fmt.Sprintf("WORLD_SIZE=%d", n), fmt.Sprintf("LOCAL_RANK=%d", r),
					"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "GORUN_SECRET=" + strings.Repeat("5e", 32)}
			}
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			outs := startByHand(t, n, mk(testenv.FreeUDPPort(t)))
			if !strings.Contains(outs[0], fmt.Sprintf("went 3 times around %d ranks (sum 3 ok)", n)) {
				t.Errorf("rank 0 output: %s", outs[0])
			}
			for r, o := range outs {
				if !strings.Contains(o, fmt.Sprintf("rank %d of %d", r, n)) || !strings.Contains(o, "launcher "+name) {
					t.Errorf("rank %d output: %s", r, o)
				}
			}
		})
	}
}

// A rank whose peers never show up fails within its timeout, naming the
// rendezvous and who is missing, instead of hanging.
func TestAloneRankTimesOut(t *testing.T) {
	cmd := exec.Command(ringBin, "-timeout", "2s")
	cmd.Env = append(testenv.CleanEnv(), "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+testenv.FreeUDPPort(t), "TORCHELASTIC_RUN_ID=alone")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("a lonely rank succeeded: %s", out)
	}
	if !strings.Contains(string(out), "rank 1") || strings.Contains(string(out), "goroutine") {
		t.Errorf("unclear error: %s", out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v", d)
	}
}

// TestUnderOpenMPI starts the ring with OpenMPI's own mpirun, as Horovod
// labs start jobs, with no gorun variable at all: the ranks find the
// rendezvous from what mpirun gives them.
func TestUnderOpenMPI(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("OpenMPI's mpirun is not installed (Debian: openmpi-bin; .ci/run installs it)")
	}
	cmd := exec.Command(mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "3", ringBin, "-timeout", "20s")
	cmd.Env = testenv.CleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	s := string(out)
	if !strings.Contains(s, "went 3 times around 3 ranks (sum 3 ok)") || strings.Count(s, "launcher openmpi") != 3 {
		t.Fatalf("output:\n%s", s)
	}
}
