package mpirun

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/rank"
)

// The test binary is also a rank of these tests' jobs when its first
// argument is rankHelperArg (before TestMain: a remote rank inherits the
// agent's MPIRUN_TEST_AS_GORUN=1).
const rankHelperArg = "-mpirun-test-rank-helper"

func init() {
	if len(os.Args) > 2 && os.Args[1] == rankHelperArg {
		os.Exit(rankHelper(os.Args[2]))
	}
}

// foreignLine is what /bin/sh ranks print of the variables of torchrun and
// OpenMPI, after their gorun rank.
const foreignLine = `echo "$GORUN_RANK RANK=${RANK-unset} WORLD_SIZE=${WORLD_SIZE-unset} LOCAL_RANK=${LOCAL_RANK-unset} LOCAL_WORLD_SIZE=${LOCAL_WORLD_SIZE-unset} GROUP_RANK=${GROUP_RANK-unset} OMPI=${OMPI_COMM_WORLD_RANK-unset}/${OMPI_COMM_WORLD_SIZE-unset}/${OMPI_COMM_WORLD_LOCAL_RANK-unset}/${OMPI_COMM_WORLD_LOCAL_SIZE-unset} MASTER=${MASTER_ADDR-unset}:${MASTER_PORT-unset} RDV=$GORUN_RENDEZVOUS"`

// rankHelper is one rank of a test job:
//
//	identity  rank.FromEnv under all these variables, then rank.Connect
//	          (gorun's own ranks: the launcher, the rendezvous they use)
//	master    torch.distributed's store, by hand: rank 0 listens on
//	          MASTER_PORT on every address, the others connect to
//	          MASTER_ADDR:MASTER_PORT and say their rank
func rankHelper(mode string) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "rank %s: %v\n", os.Getenv("GORUN_RANK"), err)
		return 1
	}
	switch mode {
	case "identity":
		id, err := rank.FromEnv()
		if err != nil {
			return fail(err)
		}
		fmt.Printf("rank %d of %d local %d of %d launcher %s rendezvous %s serve %v GORUN_RENDEZVOUS %s MASTER %s:%s OMPI_COMM_WORLD_RANK %s\n",
			id.Rank, id.Size, id.LocalRank, id.LocalSize, id.Launcher, id.Rendezvous, id.ServeRendezvous,
			os.Getenv("GORUN_RENDEZVOUS"), os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"), os.Getenv("OMPI_COMM_WORLD_RANK"))
		ctx := context.Background()
		m, err := rank.Connect(ctx, id, rank.Options{Timeout: 30 * time.Second})
		if err != nil {
			return fail(err)
		}
		defer m.Close()
		// a barrier: no rank closes its mesh while another still connects
		tag := rank.Tag{Seq: 1, Kind: 2}
		if id.Rank == 0 {
			for p := 1; p < id.Size; p++ {
				err = m.Recv(ctx, p, 0, tag, nil)
				if err != nil {
					return fail(err)
				}
			}
			for p := 1; p < id.Size; p++ {
				if err := m.Send(ctx, p, 0, tag, nil); err != nil {
					return fail(err)
				}
			}
		} else if err := m.Send(ctx, 0, 0, tag, nil); err != nil {
			return fail(err)
		} else if err := m.Recv(ctx, 0, 0, tag, nil); err != nil {
			return fail(err)
		}
		fmt.Printf("rank %d connected\n", id.Rank)
		return 0
	case "master":
		r, _ := strconv.Atoi(os.Getenv("RANK"))
		n, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
		addr := net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
		fmt.Printf("rank %d master %s\n", r, addr)
		if r == 0 {
			l, err := net.Listen("tcp", ":"+os.Getenv("MASTER_PORT"))
			if err != nil {
				return fail(fmt.Errorf("listening on MASTER_PORT: %w", err))
			}
			defer l.Close()
			var heard []string
			for i := 1; i < n; i++ {
				c, err := l.Accept()
				if err != nil {
					return fail(err)
				}
				b, _ := io.ReadAll(c)
				c.Close()
				heard = append(heard, string(b))
			}
			fmt.Printf("rank 0 heard from %d ranks\n", len(heard))
			return 0
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				fmt.Fprintf(c, "%d", r)
				c.Close()
				return 0
			}
			if time.Now().After(deadline) {
				return fail(fmt.Errorf("no store at MASTER_ADDR:MASTER_PORT %s: %w", addr, err))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return fail(fmt.Errorf("unknown helper mode %q", mode))
}

// helperJob runs this test binary as the ranks, in mode.
func helperJob(t *testing.T, cfg Config, mode string) (code int, stdout, stderr string) {
	t.Helper()
	self, _ := os.Executable()
	var o, e testenv.Buffer
	cfg.Program, cfg.Args = self, []string{rankHelperArg, mode}
	cfg.RemoteGorun, cfg.Reaper = self, self
	cfg.Stdout, cfg.Stderr, cfg.StdinRank, cfg.Tag = &o, &e, -1, TagNone
	if cfg.Environ == nil {
		cfg.Environ = os.Environ() // gorun's environment: this test's
	}
	code, err := Run(cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return code, o.String(), e.String()
}

// clearForeign leaves the variables of torchrun and OpenMPI out of this
// test's environment (restored after it).
func clearForeign(t *testing.T) {
	t.Helper()
	for _, k := range append(append([]string{}, ForeignVars...), rank.EnvRank, EnvOMPIHostfile, EnvOMPIRSHAgent, EnvOMPIRSHArgs) {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
}

// TestForeignVarsLocal: every local rank gets torchrun's and OpenMPI's
// variables, consistent with its gorun ones; MASTER_ADDR is the
// rendezvous address and MASTER_PORT, the same for all, the highest port of
// --port-range (the rendezvous takes the lowest).
func TestForeignVarsLocal(t *testing.T) {
	clearForeign(t)
	pr := freePorts(t, 4)
	code, out, errs := runSh(t, Config{NP: 3, PortRange: pr, Tag: TagNone, StdinRank: -1}, foreignLine)
	if code != 0 || errs != "" {
		t.Fatalf("status %d, stderr %q", code, errs)
	}
	rdv := "127.0.0.1:" + strconv.Itoa(pr.Lo)
	var want []string
	for r := 0; r < 3; r++ {
		want = append(want, fmt.Sprintf("%d RANK=%d WORLD_SIZE=3 LOCAL_RANK=%d LOCAL_WORLD_SIZE=3 GROUP_RANK=0 OMPI=%d/3/%d/3 MASTER=127.0.0.1:%d RDV=%s", r, r, r, r, r, pr.Hi, rdv))
	}
	if got := sortedLines(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the ranks saw\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestForeignVarsRemote: ranks on a "remote" host (127.0.0.2 through a
// launch agent with an empty environment, as ssh) get theirs from the
// agent; the dry run shows the placeholders it fills in.
func TestForeignVarsRemote(t *testing.T) {
	clearForeign(t)
	agent := sshLikeAgent(t)
	self, _ := os.Executable()
	hosts := []Host{{Name: "localhost", Slots: 1}, {Name: "127.0.0.2", Slots: 2}}
	var o, e testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), Hosts: hosts, LaunchAgent: agent, RemoteGorun: self, Reaper: self,
		Program: "/bin/sh", Args: []string{"-c", foreignLine}, Tag: TagNone, StdinRank: -1, Stdout: &o, Stderr: &e})
	if err != nil || code != 0 {
		t.Fatalf("status %d, %v\n%s%s", code, err, o.String(), e.String())
	}
	got := sortedLines(o.String())
	if len(got) != 3 {
		t.Fatalf("stdout %q", o.String())
	}
	m := regexp.MustCompile(`MASTER=(\S+) RDV=(\S+):\d+$`).FindStringSubmatch(got[0])
	if m == nil {
		t.Fatalf("rank 0: %q", got[0])
	}
	master, rdvIP := m[1], m[2]
	if h, _, _ := net.SplitHostPort(master); h != rdvIP {
		t.Errorf("MASTER_ADDR %s, want the rendezvous' address %s (rank 0 runs here)", h, rdvIP)
	}
	want := []string{
		"0 RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=0 OMPI=0/3/0/1 MASTER=" + master,
		"1 RANK=1 WORLD_SIZE=3 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 OMPI=1/3/0/2 MASTER=" + master,
		"2 RANK=2 WORLD_SIZE=3 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 OMPI=2/3/1/2 MASTER=" + master,
	}
	for i, l := range got {
		if !strings.HasPrefix(l, want[i]+" RDV=") {
			t.Errorf("rank %d saw %q, want %q", i, l, want[i])
		}
	}

	// All remote: the agent picks MASTER_ADDR and MASTER_PORT; the command
	// says where.
	o = testenv.Buffer{}
	code, err = Run(Config{Environ: os.Environ(), Hosts: []Host{{Name: "node7.invalid", Slots: 2}}, Program: "/bin/true", RemoteGorun: "/opt/gorun", Dir: "/tmp",
		DryRun: true, Stdout: &o, StdinRank: -1})
	if err != nil || code != 0 || !strings.Contains(o.String(), " RANK=@rank@ WORLD_SIZE=2 LOCAL_RANK=@local-rank@ LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=@master-addr@ MASTER_PORT=@master-port@ OMPI_COMM_WORLD_RANK=@rank@ OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=@local-rank@ OMPI_COMM_WORLD_LOCAL_SIZE=2 GORUN_HOST=node7.invalid ") {
		t.Errorf("dry run: %d %v\n%s", code, err, o.String())
	}
}

// TestMasterPortReachable: rank 0 of a job listens on MASTER_PORT on
// every address, as torch.distributed's store does, and every other rank
// reaches it at MASTER_ADDR:MASTER_PORT: rank 0 here, rank 0 on a "remote"
// host with a rank here (which waits for the agent's pick), and every rank
// remote on two hosts (the second agent waits for gorun to pass the pick
// on), with --port-range and without.
func TestMasterPortReachable(t *testing.T) {
	clearForeign(t)
	agent := sshLikeAgent(t)
	for _, c := range []struct {
		name  string
		hosts []Host
		pr    bool
	}{
		{"rank 0 here", []Host{{Name: "localhost", Slots: 2}, {Name: "127.0.0.2", Slots: 1}}, false},
		{"rank 0 remote, a rank here", []Host{{Name: "127.0.0.2", Slots: 2}, {Name: "localhost", Slots: 1}}, true},
		{"every rank remote", []Host{{Name: "127.0.0.2", Slots: 1}, {Name: "127.0.0.3", Slots: 2}}, false},
		{"every rank remote, --port-range", []Host{{Name: "127.0.0.2", Slots: 1}, {Name: "127.0.0.3", Slots: 2}}, true},
	} {
		cfg := Config{Hosts: c.hosts, LaunchAgent: agent}
		if c.pr {
			cfg.PortRange = freePorts(t, 4)
		}
		code, out, errs := helperJob(t, cfg, "master")
		if code != 0 || !strings.Contains(out, "rank 0 heard from 2 ranks\n") {
			t.Errorf("%s: status %d\nstdout:\n%s\nstderr:\n%s", c.name, code, out, errs)
			continue
		}
		addrs := regexp.MustCompile(`(?m)^rank \d master (\S+)$`).FindAllStringSubmatch(out, -1)
		if len(addrs) != 3 || addrs[0][1] != addrs[1][1] || addrs[1][1] != addrs[2][1] {
			t.Errorf("%s: the ranks were told different masters:\n%s", c.name, out)
			continue
		}
		_, port, _ := net.SplitHostPort(addrs[0][1])
		if n, _ := strconv.Atoi(port); c.pr && n != cfg.PortRange.Hi {
			t.Errorf("%s: MASTER_PORT %s, want %d, the highest free port of --port-range %s", c.name, port, cfg.PortRange.Hi, cfg.PortRange)
		}
	}
}

// TestMasterPortFresh: a restart (--max-restarts) picks MASTER_PORT
// again: the first start's port, held by another process when the job
// restarts, is not told again.
func TestMasterPortFresh(t *testing.T) {
	clearForeign(t)
	dir := t.TempDir()
	pr := freePorts(t, 4)
	type result struct {
		code      int
		out, errs string
	}
	done := make(chan result, 1)
	go func() {
		var o, e testenv.Buffer
		code, _ := Run(Config{Environ: os.Environ(), NP: 1, PortRange: pr, MaxRestarts: 1, Program: "/bin/sh", Args: []string{"-c", `echo $MASTER_PORT > ` + dir + `/port.$GORUN_RESTART
			if [ $GORUN_RESTART = 0 ]; then
				for i in $(seq 400); do [ -e ` + dir + `/held ] && exit 3; sleep 0.05; done
				exit 4
			fi`}, StdinRank: -1, Stdout: &o, Stderr: &e})
		done <- result{code, o.String(), e.String()}
	}()
	read := func(name string) string {
		for i := 0; i < 400; i++ {
			if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil && strings.HasSuffix(string(b), "\n") {
				return strings.TrimSpace(string(b))
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("no %s", name)
		return ""
	}
	first := read("port.0")
	l, err := net.Listen("tcp", ":"+first)
	if err != nil {
		t.Fatalf("holding the first start's MASTER_PORT %s: %v", first, err)
	}
	defer l.Close()
	os.WriteFile(filepath.Join(dir, "held"), nil, 0o600)
	r := <-done
	second := read("port.1")
	if r.code != 0 || !strings.Contains(r.errs, "gorun: restarting the job (restart 1 of 1") {
		t.Fatalf("status %d, stderr %q", r.code, r.errs)
	}
	if first != strconv.Itoa(pr.Hi) || second != strconv.Itoa(pr.Hi-1) {
		t.Errorf("MASTER_PORT %s, then %s after the restart; want %d (the highest of %s), then %d (the next free one)", first, second, pr.Hi, pr, pr.Hi-1)
	}
}

// TestForeignVarsUserSet: what the user sets wins: -x for any of them (one
// value for every rank, as asked), MASTER_ADDR and MASTER_PORT in gorun's
// environment (for remote ranks too); the per-rank ones found in gorun's
// environment are another launcher's, replaced with a note; inside a rank
// of a gorun job all of them are that job's, replaced without one.
func TestForeignVarsUserSet(t *testing.T) {
	clearForeign(t)
	agent := sshLikeAgent(t)
	self, _ := os.Executable()
	hosts := []Host{{Name: "localhost", Slots: 1}, {Name: "127.0.0.2", Slots: 1}}
	run := func(export ...string) ([]string, string) {
		t.Helper()
		var o, e testenv.Buffer
		code, err := Run(Config{Environ: os.Environ(), Hosts: hosts, LaunchAgent: agent, RemoteGorun: self, Reaper: self, Export: export,
			Program: "/bin/sh", Args: []string{"-c", foreignLine}, Tag: TagNone, StdinRank: -1, Stdout: &o, Stderr: &e})
		if err != nil || code != 0 {
			t.Fatalf("status %d, %v\n%s%s", code, err, o.String(), e.String())
		}
		got := sortedLines(o.String())
		for i := range got {
			got[i], _, _ = strings.Cut(got[i], " RDV=")
		}
		return got, e.String()
	}
	t.Setenv("MASTER_ADDR", "10.9.8.7")
	t.Setenv("MASTER_PORT", "4242")
	t.Setenv("WORLD_SIZE", "99")
	t.Setenv("OMPI_COMM_WORLD_RANK", "5")
	got, errs := run("RANK=7", "GROUP_RANK")
	want := []string{
		"0 RANK=7 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=0 OMPI=0/2/0/1 MASTER=10.9.8.7:4242",
		"1 RANK=7 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=1 OMPI=1/2/0/1 MASTER=10.9.8.7:4242",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the ranks saw\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	wantErr := "gorun: warning: -x GROUP_RANK: GROUP_RANK is not set in gorun's environment, so the ranks do not get it (mpirun warns and goes on too)\n" +
		"gorun: WORLD_SIZE=99 OMPI_COMM_WORLD_RANK=5 in gorun's environment (from the launcher that started gorun?): each rank gets its own value instead (-x NAME=VALUE gives every rank one value)\n"
	if errs != wantErr {
		t.Errorf("stderr\n%q\nwant\n%q", errs, wantErr)
	}

	// gorun started by a rank of another gorun job
	t.Setenv(rank.EnvRank, "3")
	got, errs = run()
	if len(got) != 2 || strings.Contains(strings.Join(got, ""), "10.9.8.7") || strings.Contains(strings.Join(got, ""), "4242") || errs != "" {
		t.Errorf("inside a gorun job: the ranks saw\n%s\nstderr %q; want gorun's own values, no note", strings.Join(got, "\n"), errs)
	}
}

// TestGorunRanksUnaffected: gorun's own ranks, local and remote, given all
// of torchrun's and OpenMPI's variables too, still take gorun as their
// launcher and gorun's rendezvous (not MASTER_ADDR:MASTER_PORT), serve
// none themselves, and connect.
func TestGorunRanksUnaffected(t *testing.T) {
	clearForeign(t)
	agent := sshLikeAgent(t)
	code, out, errs := helperJob(t, Config{Hosts: []Host{{Name: "localhost", Slots: 2}, {Name: "127.0.0.2", Slots: 2}}, LaunchAgent: agent}, "identity")
	if code != 0 {
		t.Fatalf("status %d\n%s%s", code, out, errs)
	}
	lines := regexp.MustCompile(`(?m)^rank (\d) of 4 local \d of 2 launcher (\S+) rendezvous (\S+) serve (\S+) GORUN_RENDEZVOUS (\S+) MASTER (\S+) OMPI_COMM_WORLD_RANK (\d)$`).FindAllStringSubmatch(out, -1)
	if len(lines) != 4 || strings.Count(out, " connected\n") != 4 {
		t.Fatalf("want 4 ranks' identities and connections:\n%s%s", out, errs)
	}
	for _, l := range lines {
		if l[2] != "gorun" || l[4] != "false" || l[3] != l[5] || l[3] == l[6] || l[7] != l[1] {
			t.Errorf("rank %s: launcher %s, rendezvous %s, serves it: %s (GORUN_RENDEZVOUS %s, MASTER_ADDR:MASTER_PORT %s, OMPI_COMM_WORLD_RANK %s); want gorun's, not served",
				l[1], l[2], l[3], l[4], l[5], l[6], l[7])
		}
	}
}

// TestMasterPortNone: with no free TCP port for MASTER_PORT in the range,
// on gorun's host or on a remote rank 0's, the ranks get no MASTER_PORT,
// and gorun (or the agent, through gorun) says so in one line naming the
// host; the job runs (gorun's own ranks do not need it).
func TestMasterPortNone(t *testing.T) {
	clearForeign(t)
	pr := freePorts(t, 3)
	for p := pr.Lo; p <= pr.Hi; p++ {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	taken := fmt.Sprintf("no free TCP port in %s (3 ports, all taken): the ranks get no MASTER_PORT (torch.distributed's env:// needs it); widen --port-range (GORUN_PORT_RANGE), or set MASTER_PORT", pr)
	code, out, errs := runSh(t, Config{NP: 2, PortRange: pr, Tag: TagNone, StdinRank: -1}, `echo "$GORUN_RANK MASTER=${MASTER_ADDR-unset}:${MASTER_PORT-unset}"`)
	if want := "gorun: warning: MASTER_PORT on localhost (rank 0's host): " + taken + "\n"; code != 0 || errs != want || out != "0 MASTER=127.0.0.1:unset\n1 MASTER=127.0.0.1:unset\n" && out != "1 MASTER=127.0.0.1:unset\n0 MASTER=127.0.0.1:unset\n" {
		t.Errorf("local: status %d, stdout %q\nstderr %q\nwant   %q", code, out, errs, want)
	}

	agent := sshLikeAgent(t)
	self, _ := os.Executable()
	var o, e testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), Hosts: []Host{{Name: "127.0.0.2", Slots: 1}, {Name: "localhost", Slots: 1}, {Name: "127.0.0.3", Slots: 1}}, LaunchAgent: agent, RemoteGorun: self, Reaper: self, PortRange: pr,
		Program: "/bin/sh", Args: []string{"-c", `echo "$GORUN_RANK MASTER=${MASTER_ADDR-unset}:${MASTER_PORT-unset}"`}, Tag: TagNone, StdinRank: -1, Stdout: &o, Stderr: &e})
	got := strings.Join(sortedLines(o.String()), ",")
	if want := "gorun: 127.0.0.2: warning: MASTER_PORT on 127.0.0.2 (rank 0's host): " + taken + "\n"; err != nil || code != 0 || e.String() != want ||
		!regexp.MustCompile(`^0 MASTER=127\.0\.0\.1:unset,1 MASTER=127\.0\.0\.1:unset,2 MASTER=127\.0\.0\.1:unset$`).MatchString(got) {
		t.Errorf("remote rank 0: status %d, %v, stdout %q\nstderr %q\nwant   %q", code, err, got, e.String(), want)
	}

	t.Setenv("MASTER_PORT", "4243") // the user's: nothing to pick
	code, out, errs = runSh(t, Config{NP: 1, PortRange: pr, Tag: TagNone, StdinRank: -1}, `echo "$MASTER_PORT"`)
	if code != 0 || out != "4243\n" || errs != "" {
		t.Errorf("MASTER_PORT set: %d %q %q", code, out, errs)
	}
}

// TestMasterAgentTooOld: an agent on rank 0's host that starts its ranks
// without saying MASTER_ADDR and MASTER_PORT (an older gorun there; here
// a launch agent that fills the placeholders itself) would leave the other
// ranks waiting: it is one line naming the rank and the host instead.
func TestMasterAgentTooOld(t *testing.T) {
	clearForeign(t)
	agent := filepath.Join(t.TempDir(), "agent.sh")
	script := "#!/bin/sh\ncmd=$(printf %s \"$2\" | sed 's/@master-addr@/127.0.0.1/; s/@master-port@/1/')\n" +
		"exec env -i PATH=/usr/bin:/bin MPIRUN_TEST_AS_GORUN=1 /bin/sh -c \"$cmd\"\n"
	if err := os.WriteFile(agent, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	var o, e testenv.Buffer
	code, err := Run(Config{Environ: os.Environ(), Hosts: []Host{{Name: "127.0.0.2", Slots: 1}, {Name: "localhost", Slots: 1}}, LaunchAgent: agent, RemoteGorun: self, Reaper: self,
		Grace: time.Second, Program: "/bin/sh", Args: []string{"-c", "exec sleep 30"}, Tag: TagNone, StdinRank: -1, Stdout: &o, Stderr: &e})
	re := regexp.MustCompile(`^gorun: rank 0 \(host 127\.0\.0\.2, pid \d+\): the agent there started it without picking MASTER_ADDR and MASTER_PORT: is the gorun there \(--remote-gorun\) an older one than this\?\n$`)
	if err != nil || code != ExitLaunch || !re.MatchString(e.String()) {
		t.Errorf("status %d, %v, stderr %q", code, err, e.String())
	}
}
