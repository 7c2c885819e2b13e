package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/rank/ranktest"
)

var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "arperf")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "allreduce-perf")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building allreduce-perf: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// launch starts n ranks by hand with the environment gorun gives them
// (and a rendezvous served here, as gorun serves it), and waits for them.
// extraEnv(r) adds variables for rank r; kill, if >= 0, is a rank killed
// with SIGKILL after killAfter.
func launch(t *testing.T, n int, args []string, extraEnv func(r int) []string, kill int, killAfter time.Duration) ([]string, []error) {
	t.Helper()
	secretHex := rank.NewSecret()
	secret, _ := hex.DecodeString(secretHex)
	rdv, err := rank.ListenRendezvous("127.0.0.1:0", n, secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rdv.Close()
	outs := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(testenv.CleanEnv(),
			"GORUN_RANK="+strconv.Itoa(r), "GORUN_SIZE="+strconv.Itoa(n),
			"GORUN_LOCAL_RANK="+strconv.Itoa(r), "GORUN_LOCAL_SIZE="+strconv.Itoa(n), "GORUN_NODE_RANK=0",
			"GORUN_RENDEZVOUS="+rdv.Addr(), "GORUN_JOB_ID=perftest", "GORUN_SECRET="+secretHex)
		if extraEnv != nil {
			cmd.Env = append(cmd.Env, extraEnv(r)...)
		}
		var b bytes.Buffer
		cmd.Stdout, cmd.Stderr = &b, &b
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if r == kill {
			go func() {
				time.Sleep(killAfter)
				cmd.Process.Kill()
			}()
		}
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			errs[r] = cmd.Wait()
			outs[r] = b.String()
		}(r)
	}
	wg.Wait()
	return outs, errs
}

// launchOK is launch for n healthy ranks: any rank's failure fails the test.
func launchOK(t *testing.T, n int, args []string, extraEnv func(r int) []string) []string {
	t.Helper()
	outs, errs := launch(t, n, args, extraEnv, -1, 0)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, outs[r])
		}
	}
	return outs
}

var rowRE = regexp.MustCompile(`(?m)^\s+(\d+)\s+(\d+)\s+(float|half|bfloat16)\s+(sum|avg|min|max)\s+(ring|tree|direct|shm|hd|rd)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s*$`)

func TestRanksAsProcesses(t *testing.T) {
	for _, k := range []struct {
		n    int
		args []string
		rows int
	}{
		{3, []string{"-b", "8", "-e", "1M", "-f", "4", "-n", "3", "-w", "1", "-d", "float", "-o", "sum", "-a", "ring"}, 9},
		{4, []string{"-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-w", "1", "-d", "half", "-o", "avg", "-a", "tree"}, 3},
		{2, []string{"-b", "100", "-e", "100", "-n", "2", "-w", "0", "-d", "bfloat16", "-o", "max"}, 1},
		{3, []string{"-b", "4K", "-e", "256K", "-f", "8", "-n", "2", "-w", "1", "-d", "float", "-o", "min", "-W", "half"}, 3},
		{3, []string{"-b", "4K", "-e", "128K", "-f", "4", "-n", "2", "-w", "1", "-d", "float", "-o", "avg", "-a", "direct"}, 3},
		// ranks of one host: auto runs the shared-memory allreduce, over
		// several rounds at 3 MiB (GORUN_SHM_ROUND: 256 KiB)
		{4, []string{"-b", "0", "-e", "3M", "-f", "8", "-n", "3", "-w", "1", "-d", "half", "-o", "sum", "-a", "auto"}, 8},
	} {
		t.Run(strings.Join(append([]string{fmt.Sprint("np", k.n)}, k.args...), " "), func(t *testing.T) {
			outs := launchOK(t, k.n, k.args, nil)
			rows := rowRE.FindAllStringSubmatch(outs[0], -1)
			if len(rows) != k.rows {
				t.Fatalf("rank 0 printed %d rows, want %d:\n%s", len(rows), k.rows, outs[0])
			}
			for _, row := range rows {
				if i := slices.Index(k.args, "-a"); (i < 0 || k.args[i+1] == "auto") && row[5] != "shm" {
					t.Errorf("auto on one host ran %s, want shm: %s", row[5], row[0])
				}
				size, _ := strconv.Atoi(row[1])
				count, _ := strconv.Atoi(row[2])
				es := map[string]int{"float": 4, "half": 2, "bfloat16": 2}[row[3]]
				if size != count*es {
					t.Errorf("size %d != count %d x %d", size, count, es)
				}
				for _, c := range []int{9, 13} {
					if row[c] != "0" {
						t.Errorf("wrong elements: %s", row[0])
					}
				}
				for _, c := range []int{6, 10} {
					us, _ := strconv.ParseFloat(row[c], 64)
					algbw, _ := strconv.ParseFloat(row[c+1], 64)
					busbw, _ := strconv.ParseFloat(row[c+2], 64)
					if us <= 0 {
						t.Errorf("time %v: %s", us, row[0])
					}
					want := algbw * 2 * float64(k.n-1) / float64(k.n)
					if d := busbw - want; d > 0.002 || d < -0.002 {
						t.Errorf("busbw %v, want algbw*2(n-1)/n = %v: %s", busbw, want, row[0])
					}
				}
			}
			if !strings.Contains(outs[0], "# Avg bus bandwidth") || !strings.Contains(outs[0], "Out of bounds values : 0 OK") {
				t.Errorf("no summary:\n%s", outs[0])
			}
			for r := 1; r < k.n; r++ {
				if strings.TrimSpace(outs[r]) != "" {
					t.Errorf("rank %d printed: %s", r, outs[r])
				}
			}
		})
	}
}

// TestKilledRank: kill -9 of one rank makes the others exit with an error
// naming it, well before the timeout... or at the latest at it.
func TestKilledRank(t *testing.T) {
	start := time.Now()
	outs, errs := launch(t, 3, []string{"-b", "64M", "-e", "64M", "-n", "1000", "-w", "0", "-c", "0", "-t", "10s"}, nil, 2, 1500*time.Millisecond)
	if d := time.Since(start); d > 25*time.Second {
		t.Errorf("took %v", d)
	}
	for r := 0; r < 2; r++ {
		if errs[r] == nil {
			t.Fatalf("rank %d succeeded:\n%s", r, outs[r])
		}
		if !strings.Contains(outs[r], "rank 2") || strings.Contains(outs[r], "goroutine") {
			t.Errorf("rank %d: error does not name rank 2 in one line:\n%s", r, outs[r])
		}
		t.Logf("rank %d: %s", r, strings.TrimSpace(outs[r]))
	}
}

var p2pRowRE = regexp.MustCompile(`(?m)^\s+(\d+)\s+(\d+)\s+(float|half|bfloat16)\s+none\s+p2p\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s*$`)

// TestSendRecv: -C sendrecv between processes, over QUIC and over shared
// memory: one out-of-place column, busbw = algbw, the data checked against
// what the previous rank sent, and the GOMAXPROCS line (this rank's share
// of the host, or the variable).
func TestSendRecv(t *testing.T) {
	for _, k := range []struct {
		n    int
		env  []string
		args []string
		rows int
	}{
		{3, []string{"GORUN_SHM=off"}, []string{"-b", "0", "-e", "1M", "-f", "16", "-d", "half"}, 6},
		{2, []string{"GORUN_SHM=on"}, []string{"-b", "4K", "-e", "4M", "-f", "32", "-d", "float"}, 3},
		{2, []string{"GORUN_SHM=off", "GORUN_TRANSPORT=tcp", "GOMAXPROCS=3"}, []string{"-b", "1000", "-e", "1000", "-d", "bfloat16"}, 1},
	} {
		t.Run(fmt.Sprint("np", k.n, k.env), func(t *testing.T) {
			args := append([]string{"-C", "sendrecv", "-n", "3", "-w", "1"}, k.args...)
			outs := launchOK(t, k.n, args, func(int) []string { return k.env })
			rows := p2pRowRE.FindAllStringSubmatch(outs[0], -1)
			if len(rows) != k.rows {
				t.Fatalf("rank 0 printed %d sendrecv rows, want %d:\n%s", len(rows), k.rows, outs[0])
			}
			for _, row := range rows {
				if row[7] != "0" {
					t.Errorf("wrong elements: %s", row[0])
				}
				if row[5] != row[6] {
					t.Errorf("busbw %s != algbw %s: %s", row[6], row[5], row[0])
				}
			}
			want := fmt.Sprintf("# GOMAXPROCS %d per rank (%d cores / %d ranks on this host", max(1, runtime.NumCPU()/k.n), runtime.NumCPU(), k.n)
			if slices.Contains(k.env, "GOMAXPROCS=3") {
				want = "# GOMAXPROCS 3 per rank (from the GOMAXPROCS variable)"
			}
			if !strings.Contains(outs[0], want) {
				t.Errorf("no %q in:\n%s", want, outs[0])
			}
		})
	}
}

// TestSamples: with -S the row's time is the median of the samples, and a
// line under the row gives the mean, the median and the best, out of place
// and in place, for allreduce and sendrecv alike.
func TestSamples(t *testing.T) {
	noteRE := regexp.MustCompile(`(?m)^#\s+(\d+) (out-of-place|in-place): mean ([\d.]+) us, median ([\d.]+) us, best ([\d.]+) us$`)
	for _, k := range []struct {
		args  []string
		rows  int
		notes int
	}{
		{[]string{"-b", "64K", "-e", "1M", "-f", "4", "-n", "7", "-S", "3", "-w", "1"}, 3, 6},
		{[]string{"-C", "sendrecv", "-b", "4K", "-e", "4K", "-n", "4", "-S", "4", "-w", "0"}, 1, 1},
	} {
		t.Run(strings.Join(k.args, " "), func(t *testing.T) {
			outs := launchOK(t, 2, k.args, nil)
			if !strings.Contains(outs[0], "# time: the median of "+k.args[slices.Index(k.args, "-S")+1]+" samples") {
				t.Errorf("no line on the time's statistic:\n%s", outs[0])
			}
			re, timeCol := rowRE, 6
			if k.args[0] == "-C" {
				re, timeCol = p2pRowRE, 4
			}
			rows := re.FindAllStringSubmatch(outs[0], -1)
			notes := noteRE.FindAllStringSubmatch(outs[0], -1)
			if len(rows) != k.rows || len(notes) != k.notes {
				t.Fatalf("%d rows and %d notes, want %d and %d:\n%s", len(rows), len(notes), k.rows, k.notes, outs[0])
			}
			for i, nt := range notes {
				row := rows[i*k.rows/len(notes)]
				col := timeCol + 4*(i%(k.notes/k.rows))
				if nt[1] != row[1] || nt[4] != row[col] {
					t.Errorf("note %q does not match its row's size and time %q: %q", nt[0], row[col], row[0])
				}
				mean, _ := strconv.ParseFloat(nt[3], 64)
				median, _ := strconv.ParseFloat(nt[4], 64)
				best, _ := strconv.ParseFloat(nt[5], 64)
				if mean <= 0 || best <= 0 || best > median {
					t.Errorf("mean %v, median %v, best %v: %s", mean, median, best, nt[0])
				}
			}
		})
	}
}

// TestWrongFrom: the sendrecv check counts every element that is not the
// previous rank's.
func TestWrongFrom(t *testing.T) {
	for _, dt := range []dtype.DType{dtype.Float32, dtype.Float16, dtype.BFloat16} {
		b := make([]byte, 1001*dt.Size())
		fill(b, 2, dt)
		if w := wrongFrom(b, 2, dt); w != 0 {
			t.Errorf("%s: %d wrong in an intact buffer", dt, w)
		}
		if w := wrongFrom(b, 1, dt); w < 900 {
			t.Errorf("%s: rank 1's data read as rank 2's: only %d wrong", dt, w)
		}
		b[dt.Size()*500] ^= 0x40
		b[len(b)-1] ^= 0x40
		if w := wrongFrom(b, 2, dt); w != 2 {
			t.Errorf("%s: %d wrong after corrupting 2 elements", dt, w)
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-b", "12X"}, {"-e", "-5"}, {"-b", "1M", "-e", "1K"}, {"-d", "double"}, {"-o", "prod"},
		{"-a", "butterfly"}, {"-c", "7"}, {"-n", "0"}, {"-f", "1", "-b", "8", "-e", "16"}, {"-d", "half", "-W", "bfloat16"}, {"--nope"}, {"extra"},
		{"-n", "4", "-S", "5"}, {"-S", "0"}, {"-C", "alltoall"}, {"-C", "sendrecv", "-I", "1"}, {"-C", "sendrecv", "-a", "ring"}, {"-C", "sendrecv", "-o", "max"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Env = testenv.CleanEnv()
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 {
			t.Errorf("%v: want exit status 2, got %v: %s", args, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "allreduce-perf: ") {
			t.Errorf("%v: want one error line, got:\n%s", args, out)
		}
	}
}

// TestExitStatus: as gorun's, a mistake in the command line exits 2 (the
// help of an unknown topic too) and a failure 1, each with one line.
func TestExitStatus(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  []string
		code int
		want string
	}{
		{[]string{"--nope"}, nil, 2, "allreduce-perf: flag provided but not defined: -nope (see allreduce-perf --help)"},
		{[]string{"-n"}, nil, 2, "allreduce-perf: flag needs an argument: -n (see allreduce-perf --help)"},
		{[]string{"--help", "extra"}, nil, 2, "allreduce-perf: No help topic for 'extra'"},
		{[]string{"extra"}, nil, 2, `allreduce-perf: unexpected argument "extra"`},
		// a failure: the launcher's variables are wrong, not the flags
		{[]string{"-b", "8", "-e", "8"}, []string{"GORUN_RANK=0", "GORUN_SIZE=x"}, 1, "allreduce-perf: environment variable GORUN_SIZE"},
	} {
		cmd := exec.Command(bin, c.args...)
		cmd.Env = append(testenv.CleanEnv(), c.env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != c.code || !strings.HasPrefix(stderr.String(), c.want) || strings.Count(stderr.String(), "\n") != 1 || stdout.Len() != 0 {
			t.Errorf("%v: status %d, stdout %q, stderr %q; want status %d and one line starting %q", c.args, code, stdout.String(), stderr.String(), c.code, c.want)
		}
	}
}

func TestParseSize(t *testing.T) {
	for s, want := range map[string]int64{"8": 8, "1K": 1024, "64k": 65536, "256M": 256 << 20, "1G": 1 << 30, "2KiB": 2048, "3MB": 3 << 20, "0": 0} {
		got, err := parseSize("b", s)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "K", "1.5M", "-1", "1T", "99999999999G"} {
		if _, err := parseSize("b", s); err == nil {
			t.Errorf("parseSize(%q) accepted", s)
		}
	}
}

// TestOneRankWithoutLauncher: with no launcher variables it is rank 0 of
// 1: it copies, checks, and reports busbw 0.
func TestOneRankWithoutLauncher(t *testing.T) {
	cmd := exec.Command(bin, "-b", "8", "-e", "1K", "-f", "2", "-n", "2", "-w", "1", "-d", "half", "-o", "max")
	cmd.Env = testenv.CleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rows := rowRE.FindAllStringSubmatch(string(out), -1)
	if len(rows) != 8 || !strings.Contains(string(out), "1 ranks") {
		t.Fatalf("want 8 rows of 1 rank:\n%s", out)
	}
	for _, row := range rows {
		if row[8] != "0.000" || row[9] != "0" {
			t.Errorf("row: %s", row[0])
		}
	}
}

// TestSumCounts: the wrong-element counts are added up over real sockets
// without the collective under test, and every rank gets the total.
func TestSumCounts(t *testing.T) {
	ctx := context.Background()
	ts, err := ranktest.Loopback(ctx, 3, rank.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ranktest.CloseAll(ts)
	seqs := make([]uint64, len(ts)) // each rank's own, as in its own process
	for round, counts := range [][]int{{0, 0, 0}, {5, 0, 1 << 40}, {0, 7, 0}} {
		got := make([]int, len(ts))
		errs := make([]error, len(ts))
		var wg sync.WaitGroup
		for r, tr := range ts {
			wg.Add(1)
			go func() { defer wg.Done(); got[r], errs[r] = sumCounts(ctx, tr, &seqs[r], counts[r]) }()
		}
		wg.Wait()
		want := counts[0] + counts[1] + counts[2]
		for r := range ts {
			if errs[r] != nil || got[r] != want {
				t.Fatalf("round %d rank %d: %d (%v), want %d", round, r, got[r], errs[r], want)
			}
		}
	}
}
