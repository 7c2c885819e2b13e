package rank

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// Under a foreign launcher without GORUN_SECRET the ranks derive a secret
// from what their job shares. Without a job id from the launcher two jobs
// on one rendezvous port would derive the same one, and a rank of one
// would join the other: every rank then refuses to start, in one line.
func TestDerivedSecretNeedsJobID(t *testing.T) {
	torch := []string{"WORLD_SIZE", "2", "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", "29500"}
	slurm := []string{"SLURM_NTASKS", "4", "SLURM_JOB_NODELIST", "gpu[07-08]", "SLURM_STEP_ID", "0"}
	ompi := []string{"OMPI_COMM_WORLD_SIZE", "2", "GORUN_RENDEZVOUS", "127.0.0.1:4000"}
	cases := []struct {
		name     string
		rankVar  string
		env      []string
		want     string
		exactly  bool
		withID   []string // the job id that makes the same job start
		launcher string
	}{
		{"torchrun", "RANK", torch,
			"started by torchrun without a job id (TORCHELASTIC_RUN_ID) or GORUN_SECRET: two jobs on MASTER_PORT 29500 could join each other; " +
				"set GORUN_SECRET to the same random value on every rank (openssl rand -hex 32), or start torchrun with --standalone or --rdzv-id=<an id of this job>",
			true, []string{"TORCHELASTIC_RUN_ID", "3f2a"}, "torchrun"},
		// torchrun's --rdzv-id is "none" unless given: every such job's id.
		{"torchrun's default run id", "RANK", append([]string{"TORCHELASTIC_RUN_ID", "none"}, torch...),
			`started by torchrun without a job id (TORCHELASTIC_RUN_ID is torchrun's default "none", which every job started without --rdzv-id shares) or GORUN_SECRET: two jobs on MASTER_PORT 29500 could join each other`,
			false, []string{"TORCHELASTIC_RUN_ID", "3f2a"}, "torchrun"},
		{"slurm", "SLURM_PROCID", slurm,
			"started by Slurm without a job id (SLURM_JOB_ID) or GORUN_SECRET: two jobs on rendezvous gpu07:29400 could join each other",
			false, []string{"SLURM_JOB_ID", "991"}, "slurm"},
		{"openmpi", "OMPI_COMM_WORLD_RANK", ompi,
			"started by OpenMPI without a job id (OMPI_MCA_ess_base_jobid or PMIX_NAMESPACE) or GORUN_SECRET: two jobs on rendezvous 127.0.0.1:4000 could join each other",
			false, []string{"OMPI_MCA_ess_base_jobid", "4718593"}, "openmpi"},
	}
	for _, c := range cases {
		for _, r := range []string{"0", "1"} {
			env := append([]string{c.rankVar, r}, c.env...)
			_, err := fromEnv(envOf(env...))
			switch {
			case err == nil:
				t.Errorf("%s, rank %s: started without a job id or a secret", c.name, r)
				continue
			case c.exactly && err.Error() != c.want:
				t.Errorf("%s, rank %s:\n got %s\nwant %s", c.name, r, err, c.want)
			case !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "set GORUN_SECRET to the same random value on every rank"):
				t.Errorf("%s, rank %s: got %v, want it to contain %q", c.name, r, err, c.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("%s: more than one line: %q", c.name, err)
			}
			// A secret, or the launcher's job id, and the rank starts.
			for _, more := range [][]string{{"GORUN_SECRET", strings.Repeat("c3", 32)}, c.withID} {
				id, err := fromEnv(envOf(append(env, more...)...))
				if err != nil || id.Launcher != c.launcher || len(id.Secret) < 16 || id.InsecureSecret != (more[0] != "GORUN_SECRET") {
					t.Errorf("%s, rank %s, with %s: %+v, %v", c.name, r, more[0], id, err)
				}
			}
		}
	}
}

// The derived secret is the same on every rank of a job and differs
// between jobs that share the rendezvous but not the launcher's job.
func TestDerivedSecretIsPerJob(t *testing.T) {
	secret := func(kv ...string) []byte {
		t.Helper()
		id, err := fromEnv(envOf(kv...))
		if err != nil {
			t.Fatal(err)
		}
		if !id.InsecureSecret {
			t.Fatalf("%v: the secret is not derived", kv)
		}
		return id.Secret
	}
	torch := func(r, port, run string) []byte {
		return secret("RANK", r, "WORLD_SIZE", "2", "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", port, "TORCHELASTIC_RUN_ID", run)
	}
	slurm := func(r, job, step string) []byte {
		return secret("SLURM_PROCID", r, "SLURM_NTASKS", "2", "SLURM_JOB_NODELIST", "n1", "SLURM_JOB_ID", job, "SLURM_STEP_ID", step)
	}
	ompi := func(r, job, key string) []byte {
		return secret("OMPI_COMM_WORLD_RANK", r, "OMPI_COMM_WORLD_SIZE", "2", "GORUN_RENDEZVOUS", "127.0.0.1:29921",
			"OMPI_MCA_ess_base_jobid", job, "OMPI_MCA_orte_precondition_transports", key)
	}
	for _, c := range []struct {
		what       string
		a, b       []byte
		shouldDiff bool
	}{
		{"torchrun, ranks of one job", torch("0", "29500", "r1"), torch("1", "29500", "r1"), false},
		{"torchrun, two runs on one port", torch("0", "29500", "r1"), torch("0", "29500", "r2"), true},
		{"torchrun, one run id on two ports", torch("0", "29500", "r1"), torch("0", "29501", "r1"), true},
		{"slurm, ranks of one step", slurm("0", "77", "0"), slurm("1", "77", "0"), false},
		{"slurm, two steps of one job", slurm("0", "77", "0"), slurm("0", "77", "1"), true},
		{"slurm, two jobs", slurm("0", "77", "0"), slurm("0", "78", "0"), true},
		{"openmpi, ranks of one job", ompi("0", "4718593", "4b80-4f17"), ompi("1", "4718593", "4b80-4f17"), false},
		{"openmpi, two jobs", ompi("0", "4718593", "4b80-4f17"), ompi("0", "4849665", "4b80-4f17"), true},
		{"openmpi, one job id, two jobs' keys", ompi("0", "4718593", "4b80-4f17"), ompi("0", "4718593", "9e01-22aa"), true},
	} {
		if differ := !bytes.Equal(c.a, c.b); differ != c.shouldDiff {
			t.Errorf("%s: secrets differ: %v, want %v", c.what, differ, c.shouldDiff)
		}
	}
}

// Two jobs of one launcher on one rendezvous port, told apart only by the
// launcher's job id: a rank of the second, finding the first job's
// rendezvous (its own rank 0 could not bind the port), is refused there,
// and the first job then forms with its own rank 1.
func TestJobsOnOnePortStayApart(t *testing.T) {
	for _, c := range []struct {
		name string
		env  func(r int, port, job string) []string
		a, b string
	}{
		{"torchrun", func(r int, port, job string) []string {
			return []string{"RANK", strconv.Itoa(r), "WORLD_SIZE", "2", "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", port, "TORCHELASTIC_RUN_ID", job}
		}, "8c1e-a", "8c1e-b"},
		// Two srun steps of one allocation share SLURM_JOB_ID.
		{"slurm steps", func(r int, port, step string) []string {
			return []string{"SLURM_PROCID", strconv.Itoa(r), "SLURM_NTASKS", "2", "SLURM_JOB_ID", "77", "SLURM_STEP_ID", step, "GORUN_RENDEZVOUS", "127.0.0.1:" + port}
		}, "0", "1"},
		{"openmpi", func(r int, port, job string) []string {
			return []string{"OMPI_COMM_WORLD_RANK", strconv.Itoa(r), "OMPI_COMM_WORLD_SIZE", "2", "OMPI_MCA_ess_base_jobid", job, "GORUN_RENDEZVOUS", "127.0.0.1:" + port}
		}, "4718593", "4849665"},
	} {
		t.Run(c.name, func(t *testing.T) {
			port := testenv.FreeUDPPort(t)
			ident := func(r int, job string) Identity {
				t.Helper()
				id, err := fromEnv(envOf(c.env(r, port, job)...))
				if err != nil {
					t.Fatal(err)
				}
				return id
			}
			opt := Options{Timeout: 20 * time.Second}
			type result struct {
				m   *Mesh
				err error
			}
			a0 := make(chan result, 1)
			go func() {
				m, err := Connect(context.Background(), ident(0, c.a), opt)
				a0 <- result{m, err}
			}()
			mb, err := Connect(context.Background(), ident(1, c.b), opt)
			if err == nil {
				mb.Close()
				if r := <-a0; r.m != nil {
					r.m.Close()
				}
				t.Fatalf("rank 1 of job %s joined job %s on port %s", c.b, c.a, port)
			}
			if !strings.Contains(err.Error(), "authentication failed") {
				t.Errorf("rank 1 of job %s: want an authentication failure, got %v", c.b, err)
			}
			ma1, err := Connect(context.Background(), ident(1, c.a), opt)
			r := <-a0
			if err != nil || r.err != nil {
				t.Fatalf("job %s after the other job's rank was refused: rank 0: %v; rank 1: %v", c.a, r.err, err)
			}
			t.Cleanup(func() { closeAll([]Transport{r.m, ma1}) })
			checkPairWorks(t, []*Mesh{r.m, ma1})
		})
	}
}
