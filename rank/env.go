package rank

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"strconv"
	"strings"
)

// The rank environment contract (docs/architecture.md): gorun sets these for every rank.
const (
	EnvRank       = "GORUN_RANK"
	EnvSize       = "GORUN_SIZE"
	EnvLocalRank  = "GORUN_LOCAL_RANK"
	EnvLocalSize  = "GORUN_LOCAL_SIZE"
	EnvNodeRank   = "GORUN_NODE_RANK"
	EnvRendezvous = "GORUN_RENDEZVOUS"
	EnvJobID      = "GORUN_JOB_ID"
	EnvSecret     = "GORUN_SECRET" // hex; passed through the environment or ssh stdin, never argv
	EnvIface      = "GORUN_IFACE"  // address or interface name to listen on
	EnvHost       = "GORUN_HOST"   // the host name gorun placed this rank on (for messages)
	EnvTransport  = "GORUN_TRANSPORT"
	EnvConns      = "GORUN_CONNS_PER_PEER"
	EnvTimeout    = "GORUN_TIMEOUT"
	EnvTCPCipher  = "GORUN_TCP_CIPHER"
	EnvQUICGRO    = "GORUN_QUIC_GRO"
	// EnvRestart counts the times gorun --max-restarts started the job
	// again after a failure (absent or 0: the first start).
	EnvRestart = "GORUN_RESTART"
	// EnvRestartCause is gorun's line about the failure that caused the
	// restart (unset on the first start).
	EnvRestartCause = "GORUN_RESTART_CAUSE"
)

// DefaultRendezvousPort is used when a foreign launcher gives a host but no port.
const DefaultRendezvousPort = 29400

// Identity is who this process is in the job, and how to find the others.
type Identity struct {
	Rank, Size           int
	LocalRank, LocalSize int
	NodeRank             int
	Rendezvous           string // host:port of the rendezvous
	JobID                string
	Secret               []byte
	Host                 string // this rank's host as the launcher named it ("" if unknown)
	Launcher             string // "gorun", "openmpi", "slurm", "torchrun" or "none"
	// ServeRendezvous is true when no launcher serves the rendezvous and
	// this process (rank 0 under a foreign launcher) must serve it.
	ServeRendezvous bool
	// InsecureSecret is true when no secret was given and one was derived
	// from public job information (foreign launchers without GORUN_SECRET).
	InsecureSecret bool
	// Restart is the number of times the launcher has restarted the job
	// after a failure (GORUN_RESTART, torchrun's TORCHELASTIC_RESTART_COUNT).
	Restart int
}

// NewSecret returns a fresh random job secret, hex encoded.
func NewSecret() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b)
}

// NewJobID returns a short random job id.
func NewJobID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

type envGetter func(string) (string, bool)

// FromEnv reads the identity from the environment: gorun's variables first,
// then OpenMPI's, Slurm's and torchrun's. With none of them the process is
// rank 0 of 1.
func FromEnv() (Identity, error) { return fromEnv(os.LookupEnv) }

func fromEnv(get envGetter) (Identity, error) {
	e := envReader{get}
	id, err := e.launcher()
	if err != nil {
		return id, err
	}
	id.Host = e.str(EnvHost)
	if id.Host == "" && id.Launcher == "slurm" {
		// the node's name as Slurm knows it (scontrol, sinfo), for messages
		id.Host = e.str("SLURMD_NODENAME")
	}
	if id.Rendezvous, err = e.rendezvous(id); err != nil {
		return id, err
	}
	// Under gorun, gorun serves the rendezvous; otherwise rank 0 does.
	id.ServeRendezvous = id.Launcher != "gorun" && id.Rank == 0 && id.Size > 1

	for _, k := range []string{EnvRestart, "TORCHELASTIC_RESTART_COUNT"} {
		if v := e.str(k); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return id, fmt.Errorf("%s=%q: want a count of restarts", k, v)
			}
			id.Restart = n
			break
		}
	}
	job := e.launcherJob(id.Launcher)
	id.JobID = e.str(EnvJobID)
	if id.JobID == "" {
		id.JobID = job.id
	}
	err = e.secret(&id, job)
	return id, err
}

// launcherJob is what a foreign launcher tells every rank of one job and no
// rank of another: its job id (and, for Slurm, the step), and where the
// launcher gives one, a random key of the job.
type launcherJob struct {
	id    string // the job id as the launcher names it; "" when there is none
	key   string // what the derived secret mixes in: id and more; "" when there is none
	where string // the variables it comes from, for messages
	why   string // why there is none, for messages
}

// launcherJob reads the job id of launcher from its variables.
func (e envReader) launcherJob(launcher string) launcherJob {
	switch launcher {
	case "openmpi":
		// OpenMPI 4's mpirun exports its job id to every rank
		// (OMPI_MCA_ess_base_jobid) and a random 128-bit key per job for
		// its transports (OMPI_MCA_orte_precondition_transports, the same
		// on every rank: PSM needs it so); OpenMPI 5's PRRTE names the job
		// in PMIX_NAMESPACE.
		j := launcherJob{where: "OMPI_MCA_ess_base_jobid or PMIX_NAMESPACE"}
		j.id = e.str("OMPI_MCA_ess_base_jobid")
		if j.id == "" {
			j.id = e.str("PMIX_NAMESPACE")
		}
		if j.id != "" {
			j.key = j.id + "\x00" + e.str("OMPI_MCA_orte_precondition_transports")
		}
		return j
	case "slurm":
		// Two steps of one allocation share SLURM_JOB_ID (and the first
		// host's rendezvous port); the step tells them apart.
		j := launcherJob{where: "SLURM_JOB_ID", id: e.str("SLURM_JOB_ID")}
		if j.id != "" {
			j.key = j.id + "." + e.slurmStep()
		}
		return j
	case "torchrun":
		// torchrun's run id is --rdzv-id, "none" unless given (a fresh
		// UUID with --standalone): "none" is every such job's id.
		j := launcherJob{where: "TORCHELASTIC_RUN_ID", id: e.str("TORCHELASTIC_RUN_ID")}
		switch j.id {
		case "":
		case "none":
			j.why = `TORCHELASTIC_RUN_ID is torchrun's default "none", which every job started without --rdzv-id shares`
		default:
			j.key = j.id
		}
		return j
	}
	return launcherJob{}
}

// envReader reads the variables of one environment.
type envReader struct{ get envGetter }

// num reads a non-negative integer; ok is false when name is unset or blank.
func (e envReader) num(name string) (n int, ok bool, err error) {
	v, ok := e.get(name)
	if !ok || strings.TrimSpace(v) == "" {
		return 0, false, nil
	}
	n, err = strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0, true, fmt.Errorf("environment variable %s=%q is not a non-negative integer", name, v)
	}
	return n, true, nil
}

func (e envReader) str(name string) string { v, _ := e.get(name); return strings.TrimSpace(v) }

// launcher finds the first launcher whose rank and size variables are set
// (gorun's, OpenMPI's, Slurm's, torchrun's) and reads the ranks from them;
// with none, the process is rank 0 of 1.
func (e envReader) launcher() (Identity, error) {
	var id Identity
	type scheme struct {
		name                   string
		rank, size, local, lsz string
		node                   string
	}
	schemes := []scheme{
		{"gorun", EnvRank, EnvSize, EnvLocalRank, EnvLocalSize, EnvNodeRank},
		{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK"},
		{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID"},
		{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"},
	}
	found := false
	for _, s := range schemes {
		r, okR, err := e.num(s.rank)
		if err != nil {
			return id, err
		}
		n, okN, err := e.num(s.size)
		if err != nil {
			return id, err
		}
		if !okR && !okN {
			continue
		}
		if okR != okN {
			missing := s.size
			if !okR {
				missing = s.rank
			}
			return id, fmt.Errorf("%s launcher variables incomplete: %s is not set", s.name, missing)
		}
		if n < 1 || r >= n {
			return id, fmt.Errorf("%s launcher variables inconsistent: rank %d, size %d", s.name, r, n)
		}
		id.Rank, id.Size, id.Launcher = r, n, s.name
		lr, okL, err := e.num(s.local)
		if err != nil {
			return id, err
		}
		ls, okLS, _ := e.num(s.lsz)
		nr, _, _ := e.num(s.node)
		switch {
		case s.name == "torchrun" && !okL && !okLS:
			// RANK and WORLD_SIZE alone: Kubeflow's PyTorchJob, one
			// process a pod, so each is alone on its host
			lr, ls = 0, 1
		default:
			if !okL {
				lr = r
			}
			if !okLS || ls < 1 {
				ls = n
			}
		}
		id.LocalRank, id.LocalSize, id.NodeRank = lr, ls, nr
		if s.name == "slurm" {
			if id.LocalSize, err = e.slurmLocalSize(nr, okLS, ls, n); err != nil {
				return id, err
			}
		}
		found = true
		break
	}
	if !found {
		id = Identity{Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1, Launcher: "none"}
	}
	return id, nil
}

// rendezvous is the rendezvous address for id: GORUN_RENDEZVOUS, torchrun's
// MASTER_ADDR and MASTER_PORT, or what OpenMPI's or Slurm's variables imply;
// "" for a job of one rank.
func (e envReader) rendezvous(id Identity) (string, error) {
	var addr string
	switch {
	case e.str(EnvRendezvous) != "":
		addr = e.str(EnvRendezvous)
	case e.str("MASTER_ADDR") != "":
		port := e.str("MASTER_PORT")
		if port == "" {
			port = strconv.Itoa(DefaultRendezvousPort)
		}
		addr = net.JoinHostPort(e.str("MASTER_ADDR"), port)
	case id.Launcher == "openmpi" && e.str("OMPI_MCA_orte_hnp_uri") != "":
		// OpenMPI's mpirun (how Horovod labs start jobs) tells every rank
		// its own address; rank 0, placed on mpirun's host by the default
		// mapping, serves the rendezvous there (all on one node: loopback)
		// on a port derived from the job id. MASTER_ADDR or
		// GORUN_RENDEZVOUS override it.
		host := "127.0.0.1"
		if n, _, _ := e.num("OMPI_MCA_orte_num_nodes"); n > 1 {
			h, err := hnpHost(e.str("OMPI_MCA_orte_hnp_uri"))
			if err != nil {
				return "", err
			}
			host = h
		}
		jid, _, _ := e.num("OMPI_MCA_ess_base_jobid")
		addr = net.JoinHostPort(host, strconv.Itoa(openMPIPort(jid)))
	case id.Launcher == "slurm" && e.slurmNodeList() != "":
		// Task 0 of a step runs on the step's first node (srun's block and
		// cyclic distributions); a step may run on fewer nodes than the job.
		name := e.slurmNodeList()
		h, err := FirstSlurmHost(e.str(name))
		if err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		port := e.str("MASTER_PORT") // a script's own port, as for torchrun
		if port == "" {
			port = strconv.Itoa(slurmPort(e.str("SLURM_JOB_ID"), e.slurmStep()))
		}
		addr = net.JoinHostPort(h, port)
	case id.Size == 1:
		addr = ""
	default:
		return "", fmt.Errorf("%s launcher started rank %d of %d but no rendezvous address is set: set %s=host:port (or MASTER_ADDR/MASTER_PORT)", id.Launcher, id.Rank, id.Size, EnvRendezvous)
	}
	if addr != "" {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return "", fmt.Errorf("rendezvous address %q is not host:port: %w", addr, err)
		}
	}
	return addr, nil
}

// secret sets id's job secret: GORUN_SECRET, or, under a foreign launcher
// without it, one derived from what every rank of the job sees: the
// launcher, its job id, the rendezvous address and the job's size. Without
// a job id two jobs on one rendezvous port would derive the same secret
// and a rank of one could join the other, so then it asks for the secret.
func (e envReader) secret(id *Identity, job launcherJob) error {
	if s := e.str(EnvSecret); s != "" {
		b, err := hex.DecodeString(s)
		if err != nil || len(b) < 16 {
			return fmt.Errorf("%s must be at least 32 hex digits", EnvSecret)
		}
		id.Secret = b
	} else if id.Size > 1 {
		if id.Launcher == "gorun" {
			return fmt.Errorf("%s is not set: gorun passes it to every rank; was this process started by an older gorun?", EnvSecret)
		}
		if job.key == "" {
			return e.noJobID(id, job)
		}
		// A foreign launcher without a secret: derive one from what every
		// rank of the job sees. This authenticates against accidents, not
		// attackers; export GORUN_SECRET for real protection.
		h := sha256.Sum256([]byte("gorun insecure job secret v2\x00" + id.Launcher + "\x00" + job.key + "\x00" + id.Rendezvous + "\x00" + strconv.Itoa(id.Size)))
		id.Secret = h[:]
		id.InsecureSecret = true
	}
	return nil
}

// noJobID is the error of a rank whose launcher gives no job id and that
// has no GORUN_SECRET, in one line.
func (e envReader) noJobID(id *Identity, job launcherJob) error {
	name := map[string]string{"openmpi": "OpenMPI", "slurm": "Slurm"}[id.Launcher]
	if name == "" {
		name = id.Launcher
	}
	why := job.where
	if job.why != "" {
		why = job.why
	}
	where := "on rendezvous " + id.Rendezvous
	if e.str(EnvRendezvous) == "" && e.str("MASTER_ADDR") != "" {
		_, port, _ := net.SplitHostPort(id.Rendezvous)
		where = "on MASTER_PORT " + port
	}
	hint := ""
	if id.Launcher == "torchrun" {
		hint = ", or start torchrun with --standalone or --rdzv-id=<an id of this job>"
	}
	return fmt.Errorf("started by %s without a job id (%s) or %s: two jobs %s could join each other; set %s to the same random value on every rank (openssl rand -hex 32)%s",
		name, why, EnvSecret, where, EnvSecret, hint)
}

// FirstSlurmHost returns the first host of a Slurm node list such as
// "node[01-04,07],gpu5" -> "node01".
func FirstSlurmHost(list string) (string, error) {
	if strings.TrimSpace(list) == "" {
		return "", fmt.Errorf("empty host list")
	}
	first := strings.TrimSpace(splitTopLevel(list)[0])
	if first == "" {
		return "", fmt.Errorf("host list %q: empty host name", list)
	}
	names, err := expandHostItem(first, maxSlurmNodes)
	if err != nil {
		return "", fmt.Errorf("host list %q: %w", list, err)
	}
	return names[0], nil
}

// hnpHost is the IPv4 host of OpenMPI's mpirun from its contact URI,
// "JOBID.0;tcp://192.0.2.2:60409;tcp6://[fd00::2]:57589".
func hnpHost(uri string) (string, error) {
	for _, part := range strings.Split(uri, ";") {
		if rest, ok := strings.CutPrefix(part, "tcp://"); ok {
			if h, _, err := net.SplitHostPort(rest); err == nil && h != "" {
				return h, nil
			}
		}
	}
	return "", fmt.Errorf("OMPI_MCA_orte_hnp_uri=%q names no IPv4 address for the rendezvous: set %s=host:port (or MASTER_ADDR/MASTER_PORT)", uri, EnvRendezvous)
}

// openMPIPort is the rendezvous port of an OpenMPI job: one of 1000 ports
// from DefaultRendezvousPort on, by the job id, so that two jobs on one
// host rarely meet.
func openMPIPort(jobID int) int { return DefaultRendezvousPort + jobID%1000 }

// slurmStep is the step id of a Slurm task ("" outside a step).
func (e envReader) slurmStep() string {
	if s := e.str("SLURM_STEP_ID"); s != "" {
		return s
	}
	return e.str("SLURM_STEPID")
}

// slurmNodeList names the variable with the nodes of this Slurm step:
// srun's SLURM_STEP_NODELIST, else the job's (SLURM_JOB_NODELIST, or the
// older SLURM_NODELIST); "" when none is set.
func (e envReader) slurmNodeList() string {
	for _, name := range []string{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
		if e.str(name) != "" {
			return name
		}
	}
	return ""
}

// slurmPort is the rendezvous port of a Slurm step: one of 1000 ports from
// DefaultRendezvousPort on, by job and step, so that two steps of one
// allocation, or two jobs whose first node is the same, rarely meet (the
// port is bound by rank 0; a clash is one line naming the holder).
// Without a job id, DefaultRendezvousPort.
func slurmPort(job, step string) int {
	if job == "" {
		return DefaultRendezvousPort
	}
	h := fnv.New32a()
	h.Write([]byte(job + "." + step))
	return DefaultRendezvousPort + int(h.Sum32()%1000)
}

// slurmLocalSize is the number of tasks on this task's node. srun sets
// SLURM_STEP_TASKS_PER_NODE and SLURM_TASKS_PER_NODE ("2(x3),1", one
// count per node of the step, in SLURM_NODEID's order), and
// SLURM_NTASKS_PER_NODE only when --ntasks-per-node was given, which the
// last node need not reach; so the per-node lists come first.
func (e envReader) slurmLocalSize(nodeID int, okNTasksPerNode bool, ntasksPerNode, size int) (int, error) {
	for _, name := range []string{"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"} {
		v := e.str(name)
		if v == "" {
			continue
		}
		counts, err := ParseSlurmTasksPerNode(v)
		if err != nil {
			return 0, fmt.Errorf("environment variable %s: %w", name, err)
		}
		if nodeID >= len(counts) {
			return 0, fmt.Errorf("environment variable %s=%q has %d node(s), but SLURM_NODEID is %d", name, v, len(counts), nodeID)
		}
		return counts[nodeID], nil
	}
	if okNTasksPerNode && ntasksPerNode >= 1 {
		return ntasksPerNode, nil
	}
	return size, nil
}

// maxSlurmNodes bounds what a Slurm node list or task count list may
// expand to.
const maxSlurmNodes = 1 << 16

// ParseSlurmTasksPerNode reads Slurm's compressed counts, as in
// SLURM_TASKS_PER_NODE and SLURM_JOB_CPUS_PER_NODE: "2(x3),1" is 2, 2, 2, 1.
func ParseSlurmTasksPerNode(s string) ([]int, error) {
	var out []int
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("empty: want counts like 2(x3),1")
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		count, rep := part, "1"
		if i := strings.IndexByte(part, '('); i >= 0 {
			if !strings.HasSuffix(part, ")") || !strings.HasPrefix(part[i+1:], "x") {
				return nil, fmt.Errorf("%q: %q is not N or N(xR)", s, part)
			}
			count, rep = part[:i], part[i+2:len(part)-1]
		}
		n, err1 := strconv.Atoi(count)
		r, err2 := strconv.Atoi(rep)
		if err1 != nil || err2 != nil || n < 1 || r < 1 || n > maxSlurmNodes {
			return nil, fmt.Errorf("%q: %q is not N or N(xR) with N and R at least 1", s, part)
		}
		if len(out)+r > maxSlurmNodes {
			return nil, fmt.Errorf("%q: more than %d nodes", s, maxSlurmNodes)
		}
		for ; r > 0; r-- {
			out = append(out, n)
		}
	}
	return out, nil
}

// ExpandSlurmHostlist expands a Slurm host list such as
// "node[01-04,07],gpu5" into node01, node02, node03, node04, node07, gpu5
// (scontrol show hostnames): ranges keep the lower bound's zero padding, and
// a name with several bracket groups ("r[1-2]n[1-2]") takes every
// combination, in order.
func ExpandSlurmHostlist(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, fmt.Errorf("empty host list")
	}
	var out []string
	for _, item := range splitTopLevel(list) {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("host list %q: empty host name", list)
		}
		names, err := expandHostItem(item, maxSlurmNodes-len(out))
		if err != nil {
			return nil, fmt.Errorf("host list %q: %w", list, err)
		}
		out = append(out, names...)
	}
	return out, nil
}

// splitTopLevel splits s at the commas outside brackets.
func splitTopLevel(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

// expandHostItem expands one name with bracket groups, at most limit names.
func expandHostItem(item string, limit int) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.ContainsAny(item, "]") {
			return nil, fmt.Errorf("%q: ']' without '['", item)
		}
		return []string{item}, nil
	}
	end := strings.IndexByte(item[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("%q: '[' without ']'", item)
	}
	end += open
	inner := item[open+1 : end]
	if strings.ContainsAny(inner, "[") || strings.ContainsAny(item[:open], "]") {
		return nil, fmt.Errorf("%q: unbalanced brackets", item)
	}
	prefix := item[:open]
	rest, err := expandHostItem(item[end+1:], limit)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range strings.Split(inner, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isDigits(lo) || (isRange && !isDigits(hi)) {
			return nil, fmt.Errorf("%q: [%s]: %q is not a number or a range N-M", item, inner, r)
		}
		a, err1 := strconv.ParseUint(lo, 10, 32)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.ParseUint(hi, 10, 32)
		}
		if err1 != nil || err2 != nil || b < a {
			return nil, fmt.Errorf("%q: [%s]: %q is not a range from low to high", item, inner, r)
		}
		if uint64(len(out))+(b-a+1)*uint64(len(rest)) > uint64(limit) {
			return nil, fmt.Errorf("%q: more than %d hosts", item, maxSlurmNodes)
		}
		width := 0
		if len(lo) > 1 && lo[0] == '0' {
			width = len(lo)
		}
		for n := a; n <= b; n++ {
			num := fmt.Sprintf("%0*d", width, n)
			for _, tail := range rest {
				out = append(out, prefix+num+tail)
			}
		}
	}
	return out, nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
