package main

import (
	"encoding/hex"
	"fmt"
	"math/rand"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The lab's OpenMPI command line with gorun in mpirun's place (issue 39).

// testIface is an interface of this machine that is up, not loopback and
// has an IPv4 address (as eth0 on the lab's VMs), else lo.
func testIface(t *testing.T) (name, ip string) {
	t.Helper()
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ifc.Name, ipn.IP.String()
			}
		}
	}
	return "lo", "127.0.0.1"
}

// envWithout is testEnv without the named variables.
func envWithout(names ...string) []string {
	var env []string
	for _, kv := range testEnv() {
		k, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, n := range names {
			drop = drop || k == n
		}
		if !drop {
			env = append(env, kv)
		}
	}
	return env
}

// TestLabCommandLine: the lab's whole mpirun command line, unchanged but
// for the program: the dry run shows what each flag became, and a real run
// with a "remote" host (127.0.0.2 through a launch agent) passes the ring.
// LD_LIBRARY_PATH is unset, as on a VM without CUDA: a warning, not an
// error; the interface of --mca btl_tcp_if_include and NCCL_SOCKET_IFNAME
// (the lab's eth0; here this machine's) is what the ranks bind.
func TestLabCommandLine(t *testing.T) {
	ifname, ip := testIface(t)
	env := envWithout("LD_LIBRARY_PATH", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE")
	lab := func(hosts string, prog ...string) []string {
		args := []string{"--allow-run-as-root", "-n", "4", "-H", hosts, "-bind-to", "none", "-map-by", "slot",
			"--mca", "btl_tcp_if_include", ifname, "-x", "NCCL_SOCKET_IFNAME=" + ifname, "-x", "NCCL_DEBUG=INFO", "-x", "LD_LIBRARY_PATH"}
		return append(args, prog...)
	}
	wantErr := "gorun: warning: -x LD_LIBRARY_PATH: LD_LIBRARY_PATH is not set in gorun's environment, so the ranks do not get it (mpirun warns and goes on too)\n" +
		"gorun: --mca btl_tcp_if_include " + ifname + ", -x NCCL_SOCKET_IFNAME=" + ifname + ": the ranks bind and advertise " + ifname + " (as --iface " + ifname + ")\n"

	r := gorunEnv(t, env, "", lab("vm1.invalid:2,vm2.invalid:2", "--dry-run", "python", "run.py", "--epochs", "1")...)
	checkNoPanic(t, r)
	if r.code != 0 || r.stderr != wantErr {
		t.Fatalf("dry run: status %d\nstderr %q\nwant   %q\n%s", r.code, r.stderr, wantErr, r.stdout)
	}
	for _, want := range []string{
		"gorun: dry run: 4 ranks on 2 hosts, job ", ", rendezvous " + ip + ":<port>\n",
		"0     vm1.invalid  0           2           0          ssh\n1     vm1.invalid  1           2           0          ssh\n" +
			"2     vm2.invalid  0           2           1          ssh\n3     vm2.invalid  1           2           1          ssh\n",
		"[vm1.invalid: ranks 0, 1] ssh -o BatchMode=yes -o ConnectTimeout=10 vm1.invalid 'cd ",
		" && exec env NCCL_SOCKET_IFNAME=" + ifname + " NCCL_DEBUG=INFO GORUN_IFACE=" + ifname + " GORUN_SIZE=4 GORUN_LOCAL_SIZE=2 GORUN_NODE_RANK=1 ",
		" --internal-remote-agent --grace 30s --ranks 2.0,3.1 --cuda-local -- python run.py --epochs 1'",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dry run lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "LD_LIBRARY_PATH") {
		t.Errorf("an unset -x variable reached a command:\n%s", r.stdout)
	}

	r = gorunEnv(t, env, "", lab("localhost:2,127.0.0.2:2", "--launch-agent", agentSh, ringBin, "-timeout", "40s")...)
	checkNoPanic(t, r)
	for rk := 0; rk < 4; rk++ {
		if !strings.Contains(r.stdout, fmt.Sprintf("[%d] rank %d of 4 ", rk, rk)) {
			t.Errorf("rank %d did not pass the barrier", rk)
		}
	}
	if r.code != 0 || r.stderr != wantErr {
		t.Errorf("run: status %d\nstderr %q\nwant   %q\n%s", r.code, r.stderr, wantErr, r.stdout)
	}
}

// freePorts returns n consecutive ports free for UDP and TCP on ip and on
// 127.0.0.1 now, below the kernel's ephemeral ports.
func freePorts(t *testing.T, ip string, n int) (lo, hi int) {
	t.Helper()
	ips := []string{ip}
	if ip != "127.0.0.1" {
		ips = append(ips, "127.0.0.1")
	}
	for try := 0; try < 100; try++ {
		lo := 20000 + rand.Intn(10000)
		var held []interface{ Close() error }
		ok := true
		for i := 0; i < n*len(ips) && ok; i++ {
			a := net.JoinHostPort(ips[i/n], strconv.Itoa(lo+i%n))
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
			return lo, lo + n - 1
		}
	}
	t.Fatal("no free port range")
	return 0, 0
}

// sock is a socket a process listens on.
type sock struct {
	proto string // udp or tcp
	addr  netip.AddrPort
}

// listeners returns the UDP sockets and listening TCP sockets of process
// pid, from /proc.
func listeners(t *testing.T, pid int) []sock {
	t.Helper()
	inodes := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if in, ok := strings.CutPrefix(l, "socket:["); ok {
			inodes[strings.TrimSuffix(in, "]")] = true
		}
	}
	var out []sock
	for _, table := range []string{"udp", "tcp", "udp6", "tcp6"} {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		lines := strings.Split(string(b), "\n")
		for _, l := range lines[min(1, len(lines)):] {
			f := strings.Fields(l)
			if len(f) < 10 || !inodes[f[9]] || strings.HasPrefix(table, "tcp") && f[3] != "0A" { // 0A: LISTEN
				continue
			}
			hexIP, hexPort, _ := strings.Cut(f[1], ":")
			raw, _ := hex.DecodeString(hexIP)
			for i := 0; i+4 <= len(raw); i += 4 { // each 32-bit word is in host (little-endian) order
				raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
			}
			a, _ := netip.AddrFromSlice(raw)
			port, _ := strconv.ParseUint(hexPort, 16, 16)
			out = append(out, sock{strings.TrimSuffix(table, "6"), netip.AddrPortFrom(a.Unmap(), uint16(port))})
		}
	}
	return out
}

// TestPortRangeAndIfaceSockets: with --port-range and --mca
// btl_tcp_if_include, every socket the job listens on, gorun's rendezvous
// and each rank's UDP (QUIC) and TCP (TLS/TCP) port, is on the chosen
// interface's address and in the range, two ranks on one host each with
// their own ports; the ranks were told both. GORUN_PORT_RANGE does the
// same as the flag.
func TestPortRangeAndIfaceSockets(t *testing.T) {
	ifname, ip := testIface(t)
	lo, hi := freePorts(t, ip, 3)
	pr := fmt.Sprintf("%d-%d", lo, hi)
	j := startJob(t, "-np", "2", "--port-range", pr, "--mca", "btl_tcp_if_include", ifname, ringBin, "-hold", "60s", "-timeout", "40s")
	j.waitOutput(t, "ring: token", 1) // every rank connected, now holding
	id := jobIDOf(t, j.cmd.Process.Pid, 2)
	ranks, _ := jobProcs(id)
	inRange := func(s sock) bool {
		return s.addr.Addr().String() == ip && int(s.addr.Port()) >= lo && int(s.addr.Port()) <= hi
	}
	used := map[string]bool{}
	check := func(who string, pid int, want ...string) {
		t.Helper()
		var got []string
		for _, s := range listeners(t, pid) {
			got = append(got, s.proto)
			key := fmt.Sprint(s.proto, s.addr)
			if !inRange(s) || used[key] {
				t.Errorf("%s listens on %s %s: want %s:%s, each port once", who, s.proto, s.addr, ip, pr)
			}
			used[key] = true
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s listens on %v, want %v", who, got, want)
		}
	}
	check("gorun's rendezvous", j.cmd.Process.Pid, "udp")
	for r, p := range ranks {
		check(fmt.Sprintf("rank %d", r), p.pid, "udp", "tcp")
		if p.env["GORUN_PORT_RANGE"] != pr || p.env["GORUN_IFACE"] != ifname {
			t.Errorf("rank %d: GORUN_PORT_RANGE=%q GORUN_IFACE=%q", r, p.env["GORUN_PORT_RANGE"], p.env["GORUN_IFACE"])
		}
	}
	if len(ranks) != 2 || len(used) != 5 {
		t.Errorf("%d ranks, %d sockets: %v", len(ranks), len(used), used)
	}
	j.cmd.Process.Signal(syscall.SIGTERM)
	j.wait(t, 20*time.Second)

	// GORUN_PORT_RANGE in gorun's environment: the rendezvous (which -v
	// names) in the range, the ranks too (or the job would fail: the range
	// is just wide enough).
	r := gorunEnv(t, append(testEnv(), "GORUN_PORT_RANGE="+pr), "", "-v", "-np", "2", ringBin, "-timeout", "40s")
	if r.code != 0 || !strings.Contains(r.stderr, fmt.Sprintf(", rendezvous 127.0.0.1:%d\n", lo)) || strings.Count(r.stdout, "barrier passed") != 2 {
		t.Errorf("GORUN_PORT_RANGE=%s: %d\n%s%s", pr, r.code, r.stdout, r.stderr)
	}
}

// TestPortRangeTaken: when other programs hold every port of the range, a
// rank says so in one line naming itself, its host and the range, and the
// job ends non-zero; a range too narrow for the job is one line before
// anything starts.
func TestPortRangeTaken(t *testing.T) {
	lo, hi := freePorts(t, "127.0.0.1", 3)
	pr := fmt.Sprintf("%d-%d", lo, hi)
	for p := lo; p <= hi; p++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	r := gorun(t, "", "-np", "2", "--port-range", pr, ringBin, "-timeout", "40s")
	checkNoPanic(t, r)
	rankLine := regexp.MustCompile(`^\[([01])\] ring: rank ([01]) on localhost: no free TCP port in ` + pr + ` \(3 ports, all taken\): widen --port-range \(GORUN_PORT_RANGE\)$`)
	gorunLine := regexp.MustCompile(`^gorun: rank [01] \(host localhost, pid \d+\) exited with status 1$`)
	said, gorunSaid := 0, 0
	for _, l := range strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n") {
		if m := rankLine.FindStringSubmatch(l); m != nil && m[1] == m[2] {
			said++
		} else if gorunLine.MatchString(l) {
			gorunSaid++
		} else if strings.HasPrefix(l, "gorun: warning: MASTER_PORT on localhost (rank 0's host): no free TCP port in "+pr) {
			// the ranks' MASTER_PORT (for torchrun-style programs) found no port either
		} else {
			t.Errorf("unexpected line %q", l)
		}
	}
	if r.code != 1 || said == 0 || gorunSaid != 1 {
		t.Errorf("status %d, stderr:\n%s", r.code, r.stderr)
	}
	r = gorun(t, "", "-np", "2", "--port-range", fmt.Sprintf("%d-%d", lo, lo), ringBin)
	want := fmt.Sprintf("gorun: --port-range %d-%d has 1 port, too few: host localhost runs 2 ranks, each with a UDP and a TCP port, and gorun's rendezvous takes one more UDP port there; widen it (at least %d-%d)\n", lo, lo, lo, lo+2)
	if r.code != 2 || r.stderr != want || r.stdout != "" {
		t.Errorf("a 1-port range for 2 ranks: %d %q; want %q", r.code, r.stderr, want)
	}
	r = gorunEnv(t, append(testEnv(), "GORUN_PORT_RANGE=x"), "", "-np", "1", "/bin/true")
	if r.code != 2 || r.stderr != "gorun: GORUN_PORT_RANGE=\"x\": want LO-HI, such as 29500-29531\n" {
		t.Errorf("GORUN_PORT_RANGE=x: %d %q", r.code, r.stderr)
	}
}

// TestOpenMPIReportFlags: --display-map, --report-bindings, --map-by
// ppr:N:node, and the single-dash forms mpirun users type.
func TestOpenMPIReportFlags(t *testing.T) {
	r := gorun(t, "", "-np", "2", "--display-map", "--report-bindings", "--tag", "none", "/bin/sh", "-c", "echo $$")
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) < 3 || !regexp.MustCompile(`^ Data for JOB \[[0-9a-f]+\] offset 0 Total slots allocated 2$`).MatchString(lines[0]) ||
		!strings.Contains(r.stdout, "\n Data for node: localhost\tNum slots: 2\tMax slots: 0\tNum procs: 2\n") {
		t.Fatalf("--display-map: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	pids := lines[len(lines)-2:]
	var want []string
	for rk := 0; rk < 2; rk++ {
		for _, pid := range pids {
			want = append(want, fmt.Sprintf("[localhost:%s] MCW rank %d is not bound (or bound to all available processors)", pid, rk))
		}
	}
	for _, l := range strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n") {
		found := false
		for _, w := range want {
			found = found || l == w
		}
		if !found {
			t.Errorf("--report-bindings: %q is not one of %q", l, want)
		}
	}
	if strings.Count(r.stderr, "\n") != 2 || strings.Count(r.stderr, "MCW rank 0 ") != 1 {
		t.Errorf("--report-bindings: %q", r.stderr)
	}

	for _, args := range [][]string{{"--map-by", "ppr:3:node"}, {"-map-by", "ppr:3:node"}, {"-H", "localhost:1", "--map-by", "ppr:3:node"}} {
		r := gorun(t, "", append(args, "/bin/sh", "-c", `echo "$GORUN_SIZE"`)...)
		if r.code != 0 || strings.Count(r.stdout, "3\n") != 3 || r.stderr != "" {
			t.Errorf("%q: %d %q %q", args, r.code, r.stdout, r.stderr)
		}
	}
	r = gorun(t, "", "-map-by", "ppr:2:socket", "/bin/true")
	if r.code != 2 || r.stderr != "gorun: --map-by ppr:2:socket: gorun places ranks per node only (ppr:N:node, the same as -N N); it does not place by socket, NUMA node or core\n" {
		t.Errorf("ppr:2:socket: %d %q", r.code, r.stderr)
	}
	r = gorun(t, "", "-np", "1", "-bind-to", "core", "-map-by", "node", "/bin/true")
	if r.code != 0 || r.stderr != "gorun: --bind-to core: gorun does not bind ranks to cores (as --bind-to none); each rank sizes its own threads (nmt-train --threads)\n" {
		t.Errorf("-bind-to core -map-by node: %d %q", r.code, r.stderr)
	}
}

// TestDefaultGraceSecondSignal: the default grace is 30s (for a stop
// checkpoint), and it does not delay a job whose ranks ignore SIGTERM once
// gorun gets a second signal: that kills at once, gorun says so, and exits
// 137 (not the clean stop's 143).
func TestDefaultGraceSecondSignal(t *testing.T) {
	j := startJob(t, "-np", "2", "/bin/sh", "-c", `trap "" TERM; echo ready; while :; do sleep 0.1; done`)
	j.waitOutput(t, "ready", 2)
	id := jobIDOf(t, j.cmd.Process.Pid, 2)
	ranks, _ := jobProcs(id)
	j.cmd.Process.Signal(syscall.SIGTERM)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, e := j.out(); strings.Contains(e, "gorun: terminated: stopping the job: forwarded to every rank, which are killed if still running after --grace 30s; a second signal kills them at once\n") {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no line about the first SIGTERM:\n%s", e)
		}
	}
	j.cmd.Process.Signal(syscall.SIGTERM)
	j.wait(t, 15*time.Second)
	_, e := j.out()
	if j.code != 137 || !strings.HasSuffix(e, "gorun: ranks 0, 1 killed with SIGKILL at a second signal (terminated)\n") {
		t.Errorf("status %d, want 137; stderr:\n%s", j.code, e)
	}
	var pids []int
	for _, p := range ranks {
		pids = append(pids, p.pid)
	}
	checkGone(t, pids)
}

// TestNohup: the lab starts gorun under nohup; SIGHUP then stays ignored,
// by gorun (a hangup of the terminal does not stop the job) and by the
// ranks, as with mpirun.
func TestNohup(t *testing.T) {
	nohup, err := exec.LookPath("nohup")
	if err != nil {
		t.Skip("no nohup here")
	}
	dir := t.TempDir()
	script := `grep '^SigIgn:' /proc/$$/status; echo ready; while [ ! -e ` + dir + `/go ]; do sleep 0.05; done; echo done`
	j := &job{cmd: exec.Command(nohup, gorunBin, "-np", "2", "--tag", "none", "/bin/sh", "-c", script), done: make(chan struct{})}
	j.start(t)
	j.waitOutput(t, "ready", 2)
	j.cmd.Process.Signal(syscall.SIGHUP) // nohup exec'd gorun: the same pid
	os.WriteFile(dir+"/go", nil, 0o644)
	j.wait(t, 20*time.Second)
	o, e := j.out()
	if j.code != 0 || strings.Count(o, "done\n") != 2 || e != "" {
		t.Fatalf("status %d\nstdout:\n%s\nstderr:\n%s", j.code, o, e)
	}
	for _, l := range strings.Split(o, "\n") {
		if mask, ok := strings.CutPrefix(l, "SigIgn:"); ok {
			if m, _ := strconv.ParseUint(strings.TrimSpace(mask), 16, 64); m&1 == 0 { // bit 0: SIGHUP
				t.Errorf("a rank does not ignore SIGHUP under nohup: %q", l)
			}
		}
	}
}
