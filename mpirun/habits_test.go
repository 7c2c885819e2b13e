package mpirun

import (
	"math/rand"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/rank"
)

// The lab's mpirun command line in gorun's place (issue 39): what its
// OpenMPI, NCCL, Gloo and Horovod settings become.

// TestRunIfaceFromMCAAndVars: --mca btl/oob_tcp_if_include/exclude,
// NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME and HOROVOD_GLOO_IFACE (with -x or
// in gorun's environment) choose GORUN_IFACE and the rendezvous address as
// --iface does, in one line; --iface wins; a hint that disagrees is named.
func TestRunIfaceFromMCAAndVars(t *testing.T) {
	mca := func(kv ...string) []MCAParam {
		var ps []MCAParam
		for i := 0; i < len(kv); i += 2 {
			ps = append(ps, MCAParam{Flag: "--mca", Key: kv[i], Value: kv[i+1]})
		}
		return ps
	}
	for _, c := range []struct {
		name   string
		cfg    Config
		iface  string // what the ranks see in GORUN_IFACE
		stderr string
	}{
		{"btl include", Config{MCA: mca("btl_tcp_if_include", "lo")}, "lo",
			"gorun: --mca btl_tcp_if_include lo: the ranks bind and advertise lo (as --iface lo)\n"},
		{"btl exclude", Config{MCA: mca("btl_tcp_if_exclude", "nosuch0,docker0")}, "^nosuch0,docker0",
			"gorun: --mca btl_tcp_if_exclude nosuch0,docker0: the ranks bind and advertise the interface of the route to the rendezvous unless it is nosuch0 or docker0, else the first up interface that is not loopback and not excluded (as --iface '^nosuch0,docker0')\n"},
		{"oob subnet", Config{MCA: mca("oob_tcp_if_include", "127.0.0.0/8")}, "127.0.0.0/8",
			"gorun: --mca oob_tcp_if_include 127.0.0.0/8: the ranks bind and advertise the interface in 127.0.0.0/8 (as --iface 127.0.0.0/8)\n"},
		{"NCCL exact", Config{Export: []string{"NCCL_SOCKET_IFNAME==lo"}}, "lo",
			"gorun: -x NCCL_SOCKET_IFNAME==lo: the ranks bind and advertise lo (as --iface lo)\n"},
		{"NCCL prefix", Config{Export: []string{"NCCL_SOCKET_IFNAME=lo"}}, "lo*",
			"gorun: -x NCCL_SOCKET_IFNAME=lo: the ranks bind and advertise an interface named lo* (as --iface 'lo*')\n"},
		{"Gloo from the environment", Config{IfaceVars: map[string]string{"GLOO_SOCKET_IFNAME": "nosuch0,lo"}}, "nosuch0,lo",
			"gorun: GLOO_SOCKET_IFNAME=nosuch0,lo (gorun's environment): the ranks bind and advertise the first of nosuch0 or lo that exists on each host (as --iface nosuch0,lo)\n"},
		{"-x wins over the environment", Config{Export: []string{"HOROVOD_GLOO_IFACE=lo"}, IfaceVars: map[string]string{"HOROVOD_GLOO_IFACE": "nosuch0"}}, "lo",
			"gorun: -x HOROVOD_GLOO_IFACE=lo: the ranks bind and advertise lo (as --iface lo)\n"},
		{"hints that agree here, and other MCA settings", Config{MCA: mca("btl", "tcp,self", "btl_tcp_if_include", "lo"), Export: []string{"NCCL_SOCKET_IFNAME=lo"}}, "lo",
			"gorun: --mca btl tcp,self ignored: it sets an OpenMPI parameter, and gorun is not OpenMPI\n" +
				"gorun: --mca btl_tcp_if_include lo, -x NCCL_SOCKET_IFNAME=lo: the ranks bind and advertise lo (as --iface lo)\n"},
		{"a hint that disagrees", Config{MCA: mca("btl_tcp_if_include", "lo"), Export: []string{"NCCL_SOCKET_IFNAME==nosuch0"}}, "lo",
			"gorun: --mca btl_tcp_if_include lo: the ranks bind and advertise lo (as --iface lo); not followed: -x NCCL_SOCKET_IFNAME==nosuch0 (as --iface nosuch0)\n"},
		{"--iface wins, silently when they agree", Config{Iface: "lo", MCA: mca("btl_tcp_if_include", "lo")}, "lo", ""},
		{"--iface wins", Config{Iface: "lo", MCA: mca("btl_tcp_if_exclude", "lo"), IfaceVars: map[string]string{"NCCL_SOCKET_IFNAME": "nosuch"}}, "lo",
			"gorun: --iface lo wins over --mca btl_tcp_if_exclude lo (as --iface '^lo'), NCCL_SOCKET_IFNAME=nosuch (gorun's environment) (as --iface 'nosuch*'), which choose another interface here\n"},
	} {
		cfg := c.cfg
		cfg.NP, cfg.Tag, cfg.StdinRank = 2, TagNone, -1
		code, out, errs := runSh(t, cfg, `echo "$GORUN_IFACE $GORUN_RENDEZVOUS ${NCCL_SOCKET_IFNAME-unset}"`)
		nccl := "unset"
		for _, kv := range cfg.Export {
			if v, ok := strings.CutPrefix(kv, "NCCL_SOCKET_IFNAME="); ok {
				nccl = v // -x still exports it
			}
		}
		// every interface chosen here is loopback's (an exclude list that
		// excludes nothing here keeps the default, loopback for a local job)
		re := regexp.MustCompile(`^` + regexp.QuoteMeta(c.iface) + ` 127\.0\.0\.1:\d+ ` + regexp.QuoteMeta(nccl) + `$`)
		for _, l := range sortedLines(out) {
			if !re.MatchString(l) {
				t.Errorf("%s: a rank saw %q, want GORUN_IFACE=%s and the rendezvous on 127.0.0.1", c.name, l, c.iface)
			}
		}
		if code != 0 || errs != c.stderr || len(sortedLines(out)) != 2 {
			t.Errorf("%s: status %d, stdout %q\nstderr %q\nwant   %q", c.name, code, out, errs, c.stderr)
		}
	}
	// Bad values: one line, exit 2, nothing started.
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{MCA: mca("btl_tcp_if_include", "eth0,")}, "--mca btl_tcp_if_include eth0,: want interface names or subnets, comma-separated"},
		{Config{MCA: mca("btl_tcp_if_exclude", "10.0.0.0/33")}, "--mca btl_tcp_if_exclude 10.0.0.0/33: want interface names or subnets"},
		{Config{Export: []string{"HOROVOD_GLOO_IFACE=nosuch0"}}, "-x HOROVOD_GLOO_IFACE=nosuch0: no interface of this host matches nosuch0 (it has lo"},
		{Config{IfaceVars: map[string]string{"NCCL_SOCKET_IFNAME": "^"}}, "NCCL_SOCKET_IFNAME=^ (gorun's environment): not an interface list"},
		{Config{Iface: "eth0,,lo"}, `--iface "eth0,,lo": an empty interface name in the list`},
		{Config{Iface: "nosuch0,nosuch1"}, `--iface "nosuch0,nosuch1": no interface of this host matches nosuch0,nosuch1`},
	} {
		var o, e testenv.Buffer
		cfg := c.cfg
		cfg.NP, cfg.Program, cfg.StdinRank, cfg.Stdout, cfg.Stderr = 1, "/bin/true", -1, &o, &e
		cfg.Environ = os.Environ()
		code, err := Run(cfg)
		if code != ExitUsage || err == nil || !strings.HasPrefix(err.Error(), c.want) || strings.Contains(err.Error(), "\n") || e.String() != "" {
			t.Errorf("%+v: status %d, %v, stderr %q; want %q", c.cfg, code, err, e.String(), c.want)
		}
	}
}

// TestRunIfaceReachesRemoteRanks: an interface chosen by --mca reaches the
// remote ranks (through an agent that starts them with an empty
// environment, as ssh does), and so does --port-range.
func TestRunIfaceReachesRemoteRanks(t *testing.T) {
	agent := sshLikeAgent(t)
	self, _ := os.Executable()
	pr := freePorts(t, 3)
	var o, e testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), Hosts: []Host{{Name: "localhost", Slots: 1}, {Name: "127.0.0.2", Slots: 2}}, LaunchAgent: agent, RemoteGorun: self, Reaper: self,
		MCA: []MCAParam{{"-mca", "btl_tcp_if_include", "nosuch0,lo"}}, PortRange: pr,
		Program: "/bin/sh", Args: []string{"-c", `echo "$GORUN_RANK $GORUN_IFACE $GORUN_PORT_RANGE $GORUN_RENDEZVOUS"`},
		Tag: TagNone, StdinRank: -1, Stdout: &o, Stderr: &e})
	want := []string{}
	for r := 0; r < 3; r++ {
		want = append(want, strconv.Itoa(r)+" nosuch0,lo "+pr.String()+" 127.0.0.1:"+strconv.Itoa(pr.Lo))
	}
	if err != nil || code != 0 || strings.Join(sortedLines(o.String()), "\n") != strings.Join(want, "\n") ||
		e.String() != "gorun: -mca btl_tcp_if_include nosuch0,lo: the ranks bind and advertise the first of nosuch0 or lo that exists on each host (as --iface nosuch0,lo)\n" {
		t.Errorf("status %d, %v\nstdout %q\nwant %q\nstderr %q", code, err, o.String(), want, e.String())
	}
}

// TestRunExportUnsetWarns: -x NAME of a variable gorun's environment lacks
// is a warning, as with mpirun, and the job runs without it.
func TestRunExportUnsetWarns(t *testing.T) {
	os.Unsetenv("MPIRUN_TEST_SURELY_UNSET")
	code, out, errs := runSh(t, Config{NP: 2, Export: []string{"MPIRUN_TEST_SURELY_UNSET", "B=2"}, Tag: TagNone, StdinRank: -1},
		`echo "${MPIRUN_TEST_SURELY_UNSET-unset} $B"`)
	if code != 0 || out != "unset 2\nunset 2\n" ||
		errs != "gorun: warning: -x MPIRUN_TEST_SURELY_UNSET: MPIRUN_TEST_SURELY_UNSET is not set in gorun's environment, so the ranks do not get it (mpirun warns and goes on too)\n" {
		t.Errorf("status %d, stdout %q, stderr %q", code, out, errs)
	}
	var o, e testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), NP: 1, Program: "/bin/true", Export: []string{"MPIRUN_TEST_SURELY_UNSET", "MPIRUN_TEST_SURELY_UNSET"}, Stdout: &o, Stderr: &e, StdinRank: -1})
	if code != ExitUsage || err == nil || err.Error() != "-x MPIRUN_TEST_SURELY_UNSET given twice" || e.String() != "" {
		t.Errorf("twice: %d %v %q", code, err, e.String())
	}
}

// TestMapByPPR: --map-by ppr:N:node is -N N; other ppr forms are one line.
func TestMapByPPR(t *testing.T) {
	var o testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), Hosts: []Host{{Name: "a.invalid", Slots: 1}, {Name: "b.invalid", Slots: 1}}, MapBy: "ppr:2:node",
		Program: "/bin/true", DryRun: true, Stdout: &o, StdinRank: -1})
	table := "RANK  HOST       LOCAL RANK  LOCAL SIZE  NODE RANK  START\n" +
		"0     a.invalid  0           2           0          ssh\n1     a.invalid  1           2           0          ssh\n" +
		"2     b.invalid  0           2           1          ssh\n3     b.invalid  1           2           1          ssh\n"
	if err != nil || code != 0 || !strings.Contains(o.String(), table) {
		t.Errorf("ppr:2:node: %d %v\n%s", code, err, o.String())
	}
	for mapBy, want := range map[string]string{
		"ppr:2:socket":     "--map-by ppr:2:socket: gorun places ranks per node only (ppr:N:node, the same as -N N); it does not place by socket, NUMA node or core",
		"ppr:1:node:pe=2":  "--map-by ppr:1:node:pe=2: gorun places ranks per node only",
		"ppr:0:node":       "--map-by ppr:0:node: want ppr:N:node with N >= 1",
		"ppr:x":            "--map-by ppr:x: want ppr:N:node with N >= 1",
		"core":             `--map-by "core": want slot, node or ppr:N:node`,
		"ppr:2:node & -N3": "--map-by ppr:2:node and -N 3 disagree: give one of them",
	} {
		cfg := Config{NP: 0, Program: "/bin/true", MapBy: mapBy, StdinRank: -1, Stdout: &o, Stderr: &o, Environ: os.Environ()}
		if m, ok := strings.CutSuffix(mapBy, " & -N3"); ok {
			cfg.MapBy, cfg.PerNode = m, 3
		}
		if code, err := Run(cfg); code != ExitUsage || err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("--map-by %s: %d %v; want %q", mapBy, code, err, want)
		}
	}
}

var jobIDRe = regexp.MustCompile(`\[[0-9a-f]{12}\]`)

// TestDisplayMap: --display-map prints OpenMPI's JOB MAP of the placement
// before anything starts (here before a dry run's table, and before the
// ranks' output).
func TestDisplayMap(t *testing.T) {
	var o testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), Hosts: []Host{{Name: "localhost", Slots: 2}, {Name: "b.invalid", Slots: 3, MaxSlots: 4}}, NP: 4,
		Program: "/bin/true", DryRun: true, DisplayMap: true, Stdout: &o, StdinRank: -1})
	want := " Data for JOB [ID] offset 0 Total slots allocated 5\n\n" +
		" ========================   JOB MAP   ========================\n\n" +
		" Data for node: localhost\tNum slots: 2\tMax slots: 0\tNum procs: 2\n" +
		" \tProcess jobid: [ID] App: 0 Process rank: 0 Local rank: 0 Bound: UNBOUND\n" +
		" \tProcess jobid: [ID] App: 0 Process rank: 1 Local rank: 1 Bound: UNBOUND\n\n" +
		" Data for node: b.invalid\tNum slots: 3\tMax slots: 4\tNum procs: 2\n" +
		" \tProcess jobid: [ID] App: 0 Process rank: 2 Local rank: 0 Bound: UNBOUND\n" +
		" \tProcess jobid: [ID] App: 0 Process rank: 3 Local rank: 1 Bound: UNBOUND\n\n" +
		" =============================================================\n" +
		"gorun: dry run: 4 ranks on 2 hosts"
	if got := jobIDRe.ReplaceAllString(o.String(), "[ID]"); err != nil || code != 0 || !strings.HasPrefix(got, want) {
		t.Errorf("%d %v\n%s\nwant\n%s", code, err, got, want)
	}
	code, out, _ := runSh(t, Config{NP: 2, DisplayMap: true, Tag: TagNone, StdinRank: -1}, `echo ran`)
	want = " Data for JOB [ID] offset 0 Total slots allocated 2\n\n ========================   JOB MAP   ========================\n\n" +
		" Data for node: localhost\tNum slots: 2\tMax slots: 0\tNum procs: 2\n"
	if got := jobIDRe.ReplaceAllString(out, "[ID]"); code != 0 || !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "=\nran\nran\n") {
		t.Errorf("a run: %d\n%s", code, got)
	}
}

// TestReportBindings: --report-bindings prints OpenMPI's line for an
// unbound rank as each starts, with the rank's host and pid, local and
// remote.
func TestReportBindings(t *testing.T) {
	dir := t.TempDir()
	agent := dir + "/agent.sh"
	os.WriteFile(agent, []byte("#!/bin/sh\nexec env MPIRUN_TEST_AS_GORUN=1 /bin/sh -c \"$2\"\n"), 0o755)
	self, _ := os.Executable()
	var o, e testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), Hosts: []Host{{Name: "localhost", Slots: 2}, {Name: "127.0.0.2", Slots: 1}}, LaunchAgent: agent, RemoteGorun: self, Reaper: self,
		ReportBindings: true, Program: "/bin/sh", Args: []string{"-c", `echo $$`}, StdinRank: -1, Stdout: &o, Stderr: &e})
	if err != nil || code != 0 {
		t.Fatalf("%d %v %s", code, err, e.String())
	}
	pids := map[string]string{}
	for _, l := range sortedLines(o.String()) {
		r, pid, _ := strings.Cut(strings.TrimPrefix(l, "["), "] ")
		pids[r] = pid
	}
	want := []string{
		"[127.0.0.2:" + pids["2"] + "] MCW rank 2 is not bound (or bound to all available processors)",
		"[localhost:" + pids["0"] + "] MCW rank 0 is not bound (or bound to all available processors)",
		"[localhost:" + pids["1"] + "] MCW rank 1 is not bound (or bound to all available processors)",
	}
	if got := sortedLines(e.String()); len(pids) != 3 || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("stderr\n%s\nwant\n%s", e.String(), strings.Join(want, "\n"))
	}
}

// freePorts returns n consecutive ports free for UDP and TCP on 127.0.0.1
// now, below the kernel's ephemeral ports.
func freePorts(t *testing.T, n int) rank.PortRange {
	t.Helper()
	for try := 0; try < 100; try++ {
		lo := 20000 + rand.Intn(10000)
		var held []interface{ Close() error }
		ok := true
		for p := lo; p < lo+n && ok; p++ {
			a := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
			u, err := net.ListenPacket("udp", a)
			if ok = err == nil; ok {
				held = append(held, u)
				l, err := net.Listen("tcp", a)
				if ok = err == nil; ok {
					held = append(held, l)
				}
			}
		}
		for _, h := range held {
			h.Close()
		}
		if ok {
			return rank.PortRange{Lo: lo, Hi: lo + n - 1}
		}
	}
	t.Fatal("no free port range")
	return rank.PortRange{}
}

// TestRunPortRange: the rendezvous takes the first free port of the
// range, unless --rendezvous-addr names one; the ranks are told the range;
// a range narrower than a host needs is one line before anything starts;
// one whose ports are all taken, one line when gorun listens.
func TestRunPortRange(t *testing.T) {
	pr := freePorts(t, 3)
	code, out, errs := runSh(t, Config{NP: 2, PortRange: pr, Tag: TagNone, StdinRank: -1}, `echo "$GORUN_PORT_RANGE $GORUN_RENDEZVOUS"`)
	want := pr.String() + " 127.0.0.1:" + strconv.Itoa(pr.Lo) + "\n"
	if code != 0 || out != want+want || errs != "" {
		t.Errorf("status %d, stdout %q, stderr %q; want %q twice", code, out, errs, want)
	}
	outside := testenv.FreeUDPPort(t)
	code, out, errs = runSh(t, Config{NP: 2, PortRange: rank.PortRange{Lo: pr.Lo, Hi: pr.Lo + 1}, RendezvousAddr: "127.0.0.1:" + outside, Tag: TagNone, StdinRank: -1},
		`echo "$GORUN_RENDEZVOUS"`)
	if code != 0 || out != "127.0.0.1:"+outside+"\n127.0.0.1:"+outside+"\n" {
		t.Errorf("--rendezvous-addr with a port: %d %q %q", code, out, errs)
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{NP: 2, PortRange: rank.PortRange{Lo: 29500, Hi: 29501}},
			"--port-range 29500-29501 has 2 ports, too few: host localhost runs 2 ranks, each with a UDP and a TCP port, and gorun's rendezvous takes one more UDP port there; widen it (at least 29500-29502)"},
		{Config{Hosts: []Host{{Name: "a.invalid", Slots: 1}, {Name: "b.invalid", Slots: 3}}, PortRange: rank.PortRange{Lo: 65534, Hi: 65535}},
			"--port-range 65534-65535 has 2 ports, too few: host b.invalid runs 3 ranks, each with a UDP and a TCP port; widen it"},
	} {
		var o, e testenv.Buffer
		cfg := c.cfg
		cfg.Program, cfg.StdinRank, cfg.Stdout, cfg.Stderr = "/bin/true", -1, &o, &e
		cfg.Environ = os.Environ()
		if code, err := Run(cfg); code != ExitUsage || err == nil || err.Error() != c.want || e.String() != "" {
			t.Errorf("%+v: %d %v; want %q", c.cfg.PortRange, code, err, c.want)
		}
	}
	// Every port taken by others: gorun cannot serve the rendezvous.
	taken := freePorts(t, 2)
	for p := taken.Lo; p <= taken.Hi; p++ {
		c, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	var o, e testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), NP: 1, PortRange: taken, Program: "/bin/true", StdinRank: -1, Stdout: &o, Stderr: &e})
	if code != ExitSetup || err == nil || err.Error() != "rendezvous on 127.0.0.1: no free UDP port in "+taken.String()+" (2 ports, all taken): widen --port-range (GORUN_PORT_RANGE)" {
		t.Errorf("every port taken: %d %v", code, err)
	}
	// The remote agent's command carries the range.
	o = testenv.Buffer{}
	code, err = Run(Config{Environ: os.Environ(), Hosts: []Host{{Name: "a.invalid", Slots: 2}}, PortRange: pr, Program: "/bin/true", DryRun: true, Stdout: &o, StdinRank: -1})
	if code != 0 || err != nil || !strings.Contains(o.String(), " GORUN_PORT_RANGE="+pr.String()+" GORUN_SIZE=2 ") {
		t.Errorf("dry run: %d %v\n%s", code, err, o.String())
	}
}
