package rank

import (
	"strings"
	"testing"
)

// TestGorunWinsOverForeignVars: gorun gives every rank torchrun's and
// OpenMPI's variables too (mpirun.ForeignVars), with MASTER_ADDR and
// MASTER_PORT on rank 0's host. A rank with all of them and gorun's own
// still takes gorun as its launcher, gorun's numbers, and gorun's
// rendezvous, which it does not serve; OMPI_COMM_WORLD_* does not make it
// an OpenMPI rank, nor MASTER_* a torchrun one. (mpirun's
// TestGorunRanksUnaffected checks the same with real ranks of gorun.)
func TestGorunWinsOverForeignVars(t *testing.T) {
	sec := strings.Repeat("cd", 32)
	for _, r := range []string{"0", "3"} {
		id, err := fromEnv(envOf(
			"GORUN_RANK", r, "GORUN_SIZE", "4", "GORUN_LOCAL_RANK", "1", "GORUN_LOCAL_SIZE", "2", "GORUN_NODE_RANK", "1",
			"GORUN_RENDEZVOUS", "10.0.0.1:41234", "GORUN_JOB_ID", "5b0c2a1f9e3d", "GORUN_SECRET", sec, "GORUN_HOST", "node2",
			"RANK", r, "WORLD_SIZE", "4", "LOCAL_RANK", "1", "LOCAL_WORLD_SIZE", "2", "GROUP_RANK", "1",
			"MASTER_ADDR", "10.0.0.2", "MASTER_PORT", "29511",
			"OMPI_COMM_WORLD_RANK", r, "OMPI_COMM_WORLD_SIZE", "4", "OMPI_COMM_WORLD_LOCAL_RANK", "1", "OMPI_COMM_WORLD_LOCAL_SIZE", "2"))
		if err != nil {
			t.Fatalf("rank %s: %v", r, err)
		}
		if id.Launcher != "gorun" || id.Rendezvous != "10.0.0.1:41234" || id.ServeRendezvous || id.InsecureSecret ||
			id.Size != 4 || id.LocalRank != 1 || id.LocalSize != 2 || id.NodeRank != 1 || id.JobID != "5b0c2a1f9e3d" {
			t.Errorf("rank %s: %+v; want gorun's launcher, numbers and rendezvous (10.0.0.1:41234), not served", r, id)
		}
	}
}
