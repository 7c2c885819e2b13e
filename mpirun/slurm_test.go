package mpirun

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func slurmEnv(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// The allocation's hosts and slots, as OpenMPI's mpirun reads them:
// SLURM_JOB_NODELIST fully expanded, one count of SLURM_TASKS_PER_NODE each.
func TestSlurmHosts(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want string // name:slots,...
	}{
		{[]string{"SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", "node[01-04,07],gpu5", "SLURM_TASKS_PER_NODE", "2(x2),1,3(x2),1"},
			"node01:2,node02:2,node03:1,node04:3,node07:3,gpu5:1"},
		{[]string{"SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", "h[1-2]", "SLURM_TASKS_PER_NODE", "2(x2)"}, "h1:2,h2:2"},
		{[]string{"SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", "cn[9-11]", "SLURM_TASKS_PER_NODE", "1(x3)"}, "cn9:1,cn10:1,cn11:1"},
		{[]string{"SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", "r[1-2]n[01-02]", "SLURM_TASKS_PER_NODE", "4(x4)"}, "r1n01:4,r1n02:4,r2n01:4,r2n02:4"},
		{[]string{"SLURM_JOB_ID", "7", "SLURM_NODELIST", "a,b", "SLURM_TASKS_PER_NODE", "1,2"}, "a:1,b:2"},
		// no SLURM_TASKS_PER_NODE: the CPUs, then 1 per node
		{[]string{"SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", "a,b", "SLURM_JOB_CPUS_PER_NODE", "8(x2)"}, "a:8,b:8"},
		{[]string{"SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", "a,b"}, "a:1,b:1"},
	} {
		a, ok, err := SlurmHosts(slurmEnv(c.env...))
		if err != nil || !ok {
			t.Errorf("%v: ok %v, %v", c.env, ok, err)
			continue
		}
		var got []string
		for _, h := range a.Hosts {
			got = append(got, h.Name+":"+strconv.Itoa(h.Slots))
		}
		if strings.Join(got, ",") != c.want {
			t.Errorf("%v: got %s, want %s", c.env, strings.Join(got, ","), c.want)
		}
	}
	// Outside an allocation: nothing taken.
	for _, env := range [][]string{nil, {"SLURM_JOB_NODELIST", "a"}, {"SLURM_JOB_ID", "7"}} {
		if _, ok, err := SlurmHosts(slurmEnv(env...)); ok || err != nil {
			t.Errorf("%v: ok %v, %v; want not an allocation", env, ok, err)
		}
	}
}

// Bad values are one line naming the variable and the job.
func TestSlurmHostsBad(t *testing.T) {
	for _, c := range []struct {
		list, tasks, want string
	}{
		{"node[01-04", "1", `Slurm job 7: SLURM_JOB_NODELIST: host list "node[01-04": "node[01-04": '[' without ']'`},
		{"node[4-1]", "1", `"4-1" is not a range from low to high`},
		{"node[a-b]", "1", `"a-b" is not a number or a range N-M`},
		{"node[]", "1", `"" is not a number or a range N-M`},
		{"a,,b", "1", `empty host name`},
		{"node]1", "1", `']' without '['`},
		{"n[1-100000]", "1", "more than 65536 hosts"},
		{"h[1-2]", "2(x3)", "Slurm job 7: SLURM_TASKS_PER_NODE=2(x3) gives 3 counts for the 2 nodes of SLURM_JOB_NODELIST=h[1-2]"},
		{"h[1-2]", "2(x", `Slurm job 7: SLURM_TASKS_PER_NODE: "2(x": "2(x" is not N or N(xR)`},
		{"h[1-2]", "0,1", `"0" is not N or N(xR) with N and R at least 1`},
		{"h[1-2]", "2(x0)", `"2(x0)" is not N or N(xR) with N and R at least 1`},
		{"h[1-2]", "two", `"two" is not N or N(xR)`},
		{"-h", "1", `node "-h": host name may not start with '-'`},
	} {
		_, ok, err := SlurmHosts(slurmEnv("SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", c.list, "SLURM_TASKS_PER_NODE", c.tasks))
		if err == nil || !ok || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s / %s: got %v, want one line with %q", c.list, c.tasks, err, c.want)
		}
	}
}

func TestSlurmLine(t *testing.T) {
	a, _, err := SlurmHosts(slurmEnv("SLURM_JOB_ID", "12", "SLURM_JOB_NODELIST", "h[1-2]", "SLURM_TASKS_PER_NODE", "2(x2)"))
	if err != nil {
		t.Fatal(err)
	}
	want := "hosts from Slurm job 12: h1:2,h2:2 (4 slots) from SLURM_JOB_NODELIST=h[1-2], SLURM_TASKS_PER_NODE=2(x2); ranks on other nodes started with srun (no -hostfile or -H given)"
	if got := a.Line(true); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if got := a.Line(false); strings.Contains(got, "srun") {
		t.Errorf("without srun: %s", got)
	}
}

// The launch agent, run by a real sh with a stand-in srun on PATH: srun
// gets one task on the host and the remote command as one sh -c argument.
func TestSlurmLaunchAgentWords(t *testing.T) {
	w, err := splitWords(SlurmLaunchAgent)
	if err != nil {
		t.Fatal(err)
	}
	if len(w) != 4 || w[0] != "sh" || w[1] != "-c" || w[3] != "srun" {
		t.Fatalf("words %q", w)
	}
	dir := t.TempDir()
	writeExec(t, dir+"/srun", "#!/bin/sh\nfor a in \"$@\"; do printf '[%s]' \"$a\"; done\n")
	out := runWith(t, dir, append(w, "node07", "cd /w && exec env A='x y' prog"))
	want := "[-N1][-n1][--ntasks-per-node=1][-w][node07][--overlap][--cpu-bind=none][--mpi=none][-u][-Q][/bin/sh][-c][cd /w && exec env A='x y' prog]"
	if out != want {
		t.Errorf("srun got %s\nwant        %s", out, want)
	}
}

func writeExec(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o755); err != nil {
		t.Fatal(err)
	}
}

// runWith runs argv with dir first on PATH and returns its stdout.
func runWith(t *testing.T, dir string, argv []string) string {
	t.Helper()
	c := exec.Command(argv[0], argv[1:]...)
	c.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"))
	out, err := c.Output()
	if err != nil {
		t.Fatalf("%q: %v", argv, err)
	}
	return string(out)
}
