package rank

import (
	"strconv"
	"strings"
	"testing"
)

func envOf(kv ...string) envGetter {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestFromEnvSchemes(t *testing.T) {
	sec := strings.Repeat("ab", 16)
	cases := []struct {
		name                   string
		env                    envGetter
		launcher               string
		rank, size, local, lsz int
		rdv                    string
		serve, insecure        bool
	}{
		{"none", envOf(), "none", 0, 1, 0, 1, "", false, false},
		{"gorun", envOf("GORUN_RANK", "2", "GORUN_SIZE", "4", "GORUN_LOCAL_RANK", "0", "GORUN_LOCAL_SIZE", "2", "GORUN_RENDEZVOUS", "10.0.0.1:555", "GORUN_SECRET", sec),
			"gorun", 2, 4, 0, 2, "10.0.0.1:555", false, false},
		{"openmpi", envOf("OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "2", "OMPI_COMM_WORLD_LOCAL_RANK", "0", "GORUN_RENDEZVOUS", "127.0.0.1:4000", "OMPI_MCA_ess_base_jobid", "4242"),
			"openmpi", 0, 2, 0, 2, "127.0.0.1:4000", true, true},
		{"openmpi's mpirun, one node", envOf("OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2", "OMPI_COMM_WORLD_LOCAL_RANK", "1",
			"OMPI_MCA_orte_hnp_uri", "1249771520.0;tcp://192.0.2.2:60409;tcp6://[fd00::2]:57589", "OMPI_MCA_orte_num_nodes", "1", "OMPI_MCA_ess_base_jobid", "1249771521"),
			"openmpi", 1, 2, 1, 2, "127.0.0.1:29921", false, true},
		{"openmpi's mpirun, two nodes", envOf("OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "4", "OMPI_COMM_WORLD_LOCAL_RANK", "0", "OMPI_COMM_WORLD_LOCAL_SIZE", "2",
			"OMPI_MCA_orte_hnp_uri", "77.0;tcp6://[fd00::2]:1;tcp://10.1.2.3:60409", "OMPI_MCA_orte_num_nodes", "2", "OMPI_MCA_ess_base_jobid", "5000"),
			"openmpi", 0, 4, 0, 2, "10.1.2.3:29400", true, true},
		{"openmpi, MASTER_ADDR overrides", envOf("OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "2", "MASTER_ADDR", "h9", "MASTER_PORT", "7",
			"OMPI_MCA_orte_hnp_uri", "77.0;tcp://10.1.2.3:60409", "OMPI_MCA_orte_num_nodes", "2", "PMIX_NAMESPACE", "prterun-h9-77@1"),
			"openmpi", 0, 2, 0, 2, "h9:7", true, true},
		{"slurm", envOf("SLURM_PROCID", "3", "SLURM_NTASKS", "4", "SLURM_LOCALID", "1", "SLURM_JOB_NODELIST", "gpu[07-08],cpu1", "SLURM_JOB_ID", "99"),
			"slurm", 3, 4, 1, 4, "gpu07:" + strconv.Itoa(slurmPort("99", "")), false, true},
		{"torchrun", envOf("RANK", "1", "WORLD_SIZE", "2", "LOCAL_RANK", "1", "MASTER_ADDR", "host0", "MASTER_PORT", "1234", "GORUN_SECRET", sec),
			"torchrun", 1, 2, 1, 2, "host0:1234", false, false},
		{"PyTorchJob: RANK and WORLD_SIZE alone, one process a pod", envOf("RANK", "2", "WORLD_SIZE", "4", "MASTER_ADDR", "job-master-0", "MASTER_PORT", "23456", "GORUN_SECRET", sec),
			"torchrun", 2, 4, 0, 1, "job-master-0:23456", false, false},
		{"gorun wins over torchrun", envOf("GORUN_RANK", "0", "GORUN_SIZE", "1", "RANK", "5", "WORLD_SIZE", "8"),
			"gorun", 0, 1, 0, 1, "", false, false},
	}
	for _, c := range cases {
		id, err := fromEnv(c.env)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if id.Launcher != c.launcher || id.Rank != c.rank || id.Size != c.size || id.LocalRank != c.local || id.LocalSize != c.lsz || id.Rendezvous != c.rdv || id.ServeRendezvous != c.serve || id.InsecureSecret != c.insecure {
			t.Errorf("%s: got %+v", c.name, id)
		}
		if id.Size > 1 && len(id.Secret) < 16 {
			t.Errorf("%s: no secret", c.name)
		}
	}
}

func TestFromEnvErrors(t *testing.T) {
	cases := []struct {
		env  envGetter
		want string
	}{
		{envOf("GORUN_RANK", "x", "GORUN_SIZE", "2"), "GORUN_RANK"},
		{envOf("GORUN_RANK", "2", "GORUN_SIZE", "2"), "inconsistent"},
		{envOf("OMPI_COMM_WORLD_RANK", "1"), "OMPI_COMM_WORLD_SIZE is not set"},
		{envOf("RANK", "1", "WORLD_SIZE", "2"), "no rendezvous address"},
		{envOf("OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2", "OMPI_MCA_orte_num_nodes", "2", "OMPI_MCA_orte_hnp_uri", "77.0;tcp6://[fd00::2]:1"), "names no IPv4 address"},
		{envOf("GORUN_RANK", "1", "GORUN_SIZE", "2", "GORUN_RENDEZVOUS", "h:1"), "GORUN_SECRET is not set"},
		{envOf("GORUN_RANK", "1", "GORUN_SIZE", "2", "GORUN_RENDEZVOUS", "nohostport", "GORUN_SECRET", strings.Repeat("a", 32)), "not host:port"},
		{envOf("GORUN_RANK", "1", "GORUN_SIZE", "2", "GORUN_RENDEZVOUS", "h:1", "GORUN_SECRET", "zz"), "hex"},
	}
	for _, c := range cases {
		_, err := fromEnv(c.env)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want error containing %q, got %v", c.want, err)
		}
	}
}

func TestFirstSlurmHost(t *testing.T) {
	for in, want := range map[string]string{
		"node1":            "node1",
		"node[01-04]":      "node01",
		"a[3,5-7],b[1-2]":  "a3",
		"gpu-[10-12]-ib,x": "gpu-10-ib",
		"cn001,cn002":      "cn001",
	} {
		got, err := FirstSlurmHost(in)
		if err != nil || got != want {
			t.Errorf("%q: got %q %v, want %q", in, got, err, want)
		}
	}
	if _, err := FirstSlurmHost("a]b["); err == nil {
		t.Error("unbalanced brackets accepted")
	}
}

// What real srun sets for a task (Slurm 22.05, sbatch -N 2
// --ntasks-per-node 2, then srun -N 2 -n 3 in it): the step's own node list
// and counts, not the job's, and no SLURM_NTASKS_PER_NODE unless given.
func TestFromEnvSlurmStep(t *testing.T) {
	step := func(kv ...string) envGetter {
		return envOf(append([]string{"SLURM_JOB_ID", "4242", "SLURM_STEP_ID", "1", "SLURM_NTASKS", "3",
			"SLURM_JOB_NODELIST", "gpu[07-09]", "SLURM_STEP_NODELIST", "gpu[08-09]", "SLURM_TASKS_PER_NODE", "2(x3)",
			"SLURM_STEP_TASKS_PER_NODE", "2,1"}, kv...)...)
	}
	for _, c := range []struct {
		env                    envGetter
		rank, local, lsz, node int
		host                   string
	}{
		{step("SLURM_PROCID", "0", "SLURM_LOCALID", "0", "SLURM_NODEID", "0", "SLURMD_NODENAME", "gpu08"), 0, 0, 2, 0, "gpu08"},
		{step("SLURM_PROCID", "1", "SLURM_LOCALID", "1", "SLURM_NODEID", "0", "SLURMD_NODENAME", "gpu08"), 1, 1, 2, 0, "gpu08"},
		{step("SLURM_PROCID", "2", "SLURM_LOCALID", "0", "SLURM_NODEID", "1", "SLURMD_NODENAME", "gpu09"), 2, 0, 1, 1, "gpu09"},
		// --ntasks-per-node=2 given: the step's counts still win (the last node has 1)
		{step("SLURM_PROCID", "2", "SLURM_LOCALID", "0", "SLURM_NODEID", "1", "SLURM_NTASKS_PER_NODE", "2"), 2, 0, 1, 1, ""},
		// gorun's host name wins for messages
		{step("SLURM_PROCID", "2", "SLURM_NODEID", "1", "SLURMD_NODENAME", "gpu09", "GORUN_HOST", "n9"), 2, 2, 1, 1, "n9"},
	} {
		id, err := fromEnv(c.env)
		if err != nil {
			t.Fatal(err)
		}
		want := "gpu08:" + strconv.Itoa(slurmPort("4242", "1"))
		if id.Rank != c.rank || id.LocalRank != c.local || id.LocalSize != c.lsz || id.NodeRank != c.node || id.Host != c.host || id.Rendezvous != want {
			t.Errorf("rank %d: got %+v, want local %d/%d node %d host %q rendezvous %s", c.rank, id, c.local, c.lsz, c.node, c.host, want)
		}
	}
	// Only the job's counts (a program run in the batch script itself).
	id, err := fromEnv(envOf("SLURM_PROCID", "0", "SLURM_NTASKS", "4", "SLURM_NODEID", "0", "SLURM_TASKS_PER_NODE", "3,1", "SLURM_JOB_ID", "5", "SLURM_JOB_NODELIST", "a,b"))
	if err != nil || id.LocalSize != 3 {
		t.Errorf("SLURM_TASKS_PER_NODE 3,1 on node 0: local size %d, %v; want 3", id.LocalSize, err)
	}
	for _, bad := range []struct {
		env  envGetter
		want string
	}{
		{step("SLURM_PROCID", "0", "SLURM_NODEID", "2"), `SLURM_STEP_TASKS_PER_NODE="2,1" has 2 node(s), but SLURM_NODEID is 2`},
		{step("SLURM_PROCID", "0", "SLURM_STEP_TASKS_PER_NODE", "2(x"), `environment variable SLURM_STEP_TASKS_PER_NODE: "2(x": "2(x" is not N or N(xR)`},
		{step("SLURM_PROCID", "0", "SLURM_STEP_NODELIST", "gpu[08"), `SLURM_STEP_NODELIST: host list "gpu[08": "gpu[08": '[' without ']'`},
	} {
		if _, err := fromEnv(bad.env); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("got %v, want %q", err, bad.want)
		}
	}
}

// Two steps of one allocation, and two jobs, get different rendezvous
// ports on the same first node (both on it at once is common: a job's
// steps in parallel, jobs sharing a node).
func TestSlurmPort(t *testing.T) {
	seen := map[int]string{}
	for _, js := range [][2]string{{"100", "0"}, {"100", "1"}, {"100", "2"}, {"101", "0"}, {"101", "1"}, {"4242", "0"}} {
		p := slurmPort(js[0], js[1])
		if p < DefaultRendezvousPort || p >= DefaultRendezvousPort+1000 {
			t.Errorf("job %s step %s: port %d out of %d..%d", js[0], js[1], p, DefaultRendezvousPort, DefaultRendezvousPort+999)
		}
		if other, ok := seen[p]; ok {
			t.Errorf("job %s step %s: port %d, as %s", js[0], js[1], p, other)
		}
		seen[p] = js[0] + "." + js[1]
	}
	if slurmPort("", "") != DefaultRendezvousPort {
		t.Error("without a job id: not the default port")
	}
}

func TestExpandSlurmHostlist(t *testing.T) {
	for in, want := range map[string]string{
		"node1":               "node1",
		"node[01-04,07],gpu5": "node01 node02 node03 node04 node07 gpu5",
		"n[8-11]":             "n8 n9 n10 n11",
		"n[098-101]":          "n098 n099 n100 n101",
		"gpu-[1-2]-ib,x":      "gpu-1-ib gpu-2-ib x",
		"r[1-2]n[1-2]":        "r1n1 r1n2 r2n1 r2n2",
		" a , b ":             "a b",
	} {
		got, err := ExpandSlurmHostlist(in)
		if err != nil || strings.Join(got, " ") != want {
			t.Errorf("%q: got %q %v, want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a[1-2", "a]", "a[2-1]", "a[x]", "a[1-]", "a[[1]]", "a,,b", "a[1-70000]"} {
		if _, err := ExpandSlurmHostlist(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	counts, err := ParseSlurmTasksPerNode("2(x3),1")
	if err != nil || len(counts) != 4 || counts[0] != 2 || counts[2] != 2 || counts[3] != 1 {
		t.Errorf("2(x3),1: %v %v", counts, err)
	}
}

// A batch script's own MASTER_PORT (with no MASTER_ADDR) is the port on
// the step's first node.
func TestSlurmMasterPort(t *testing.T) {
	id, err := fromEnv(envOf("SLURM_PROCID", "1", "SLURM_NTASKS", "2", "SLURM_JOB_ID", "9", "SLURM_JOB_NODELIST", "n[3-4]", "MASTER_PORT", "12345"))
	if err != nil || id.Rendezvous != "n3:12345" {
		t.Errorf("got %q, %v; want n3:12345", id.Rendezvous, err)
	}
}

// List names ranks in order without changing its argument, and cuts a
// long list after eight.
func TestList(t *testing.T) {
	rs := []int{3, 1, 2}
	for _, c := range []struct {
		rs   []int
		want string
	}{
		{[]int{4}, "rank 4"},
		{rs, "ranks 1, 2, 3"},
		{[]int{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}, "ranks 0, 1, 2, 3, 4, 5, 6, 7, and 2 more"},
	} {
		if got := List(c.rs); got != c.want {
			t.Errorf("List(%v) = %q, want %q", c.rs, got, c.want)
		}
	}
	if rs[0] != 3 {
		t.Errorf("List sorted its argument: %v", rs)
	}
}
