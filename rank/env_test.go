package rank

import (
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
			"slurm", 3, 4, 1, 4, "gpu07:29400", false, true},
		{"torchrun", envOf("RANK", "1", "WORLD_SIZE", "2", "LOCAL_RANK", "1", "MASTER_ADDR", "host0", "MASTER_PORT", "1234", "GORUN_SECRET", sec),
			"torchrun", 1, 2, 1, 2, "host0:1234", false, false},
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
