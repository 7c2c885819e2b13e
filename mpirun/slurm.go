package mpirun

import (
	"fmt"
	"strings"

	"github.com/gorun/gorun/internal/words"
	"github.com/gorun/gorun/rank"
)

// SlurmAllocation is the hosts and slots of the Slurm allocation gorun runs
// in (inside salloc, or a batch script of sbatch), read as OpenMPI's mpirun
// reads them: the nodes of SLURM_JOB_NODELIST, each with its count of
// SLURM_TASKS_PER_NODE as its slots.
type SlurmAllocation struct {
	JobID        string
	NodeList     string // SLURM_JOB_NODELIST as given ("h[1-2]")
	TasksPerNode string // SLURM_TASKS_PER_NODE as given ("2(x2)")
	Hosts        []Host // one per node, in Slurm's order, Where naming the variables
}

// SlurmLaunchAgent starts gorun's remote agent on a node of the
// allocation with srun, as OpenMPI's mpirun starts its orted under Slurm,
// so that no ssh is needed and Slurm accounts for, signals and cleans up
// the ranks. It is a --launch-agent (invoked as CMD host remote-command):
// one task on that node (-N1 -n1 -w host) that shares the allocation's
// CPUs with the job's other steps (--overlap) and is bound to none of them
// (--cpu-bind=none: the agent's ranks size their own threads), its output
// passed on unbuffered (-u: the agent's frames are not lines), srun's
// informational messages left out (-Q); its errors still say the node.
// The job's own task layout in srun's input variables (SLURM_NTASKS_PER_NODE
// from sbatch --ntasks-per-node) is overridden by one task on one node.
const SlurmLaunchAgent = `sh -c 'exec srun -N1 -n1 --ntasks-per-node=1 -w "$1" --overlap --cpu-bind=none --mpi=none -u -Q /bin/sh -c "$2"' srun`

// SlurmHosts reads the allocation from get (the process's LookupEnv, at
// the edge).
// ok is false outside a Slurm allocation (no SLURM_JOB_ID, or no node
// list). Bad values are one line naming the variable.
func SlurmHosts(get func(string) (string, bool)) (a SlurmAllocation, ok bool, err error) {
	str := func(name string) string { v, _ := get(name); return strings.TrimSpace(v) }
	a.JobID = str("SLURM_JOB_ID")
	listVar := "SLURM_JOB_NODELIST"
	a.NodeList = str(listVar)
	if a.NodeList == "" {
		listVar = "SLURM_NODELIST" // Slurm before 17.11, and still set
		a.NodeList = str(listVar)
	}
	if a.JobID == "" || a.NodeList == "" {
		return a, false, nil
	}
	nodes, err := rank.ExpandSlurmHostlist(a.NodeList)
	if err != nil {
		return a, true, fmt.Errorf("Slurm job %s: %s: %w", a.JobID, listVar, err)
	}
	countVar := "SLURM_TASKS_PER_NODE"
	a.TasksPerNode = str(countVar)
	if a.TasksPerNode == "" {
		// an allocation always has it; without it, each node's CPUs
		countVar = "SLURM_JOB_CPUS_PER_NODE"
		a.TasksPerNode = str(countVar)
	}
	counts := make([]int, len(nodes))
	if a.TasksPerNode == "" {
		countVar = ""
		for i := range counts {
			counts[i] = 1
		}
	} else {
		if counts, err = rank.ParseSlurmTasksPerNode(a.TasksPerNode); err != nil {
			return a, true, fmt.Errorf("Slurm job %s: %s: %w", a.JobID, countVar, err)
		}
		if len(counts) != len(nodes) {
			return a, true, fmt.Errorf("Slurm job %s: %s=%s gives %s for the %s of %s=%s",
				a.JobID, countVar, a.TasksPerNode, words.Plural(len(counts), "count"), words.Plural(len(nodes), "node"), listVar, a.NodeList)
		}
	}
	for i, n := range nodes {
		h := Host{Name: n, Slots: counts[i], Where: fmt.Sprintf("Slurm job %s: %s=%s", a.JobID, listVar, a.NodeList)}
		if countVar != "" {
			h.Where += fmt.Sprintf(", %s=%s", countVar, a.TasksPerNode)
		}
		if err := checkHostName(n); err != nil {
			return a, true, fmt.Errorf("%s: node %q: %w", h.Where, n, err)
		}
		a.Hosts = mergeHost(a.Hosts, h)
	}
	return a, true, nil
}

// Line is gorun's one line about the hosts it took from the allocation.
func (a SlurmAllocation) Line(srun bool) string {
	var hosts []string
	total := 0
	for _, h := range a.Hosts {
		hosts = append(hosts, fmt.Sprintf("%s:%d", h.Name, h.Slots))
		total += h.Slots
	}
	if len(hosts) > 8 {
		hosts = append(hosts[:8], fmt.Sprintf("and %d more", len(hosts)-8))
	}
	how := ""
	if srun {
		how = "; ranks on other nodes started with srun"
	}
	return fmt.Sprintf("hosts from Slurm job %s: %s (%s) from %s%s (no -hostfile or -H given)",
		a.JobID, strings.Join(hosts, ","), words.Plural(total, "slot"), strings.TrimPrefix(a.Hosts[0].Where, "Slurm job "+a.JobID+": "), how)
}
