//go:build linux

package collective

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/rank"
)

// The child side of TestFrozenRankNamed: a rank (this test binary
// re-executed) that allreduces in a loop until a call fails, then prints
// the rank its error blames and exits.
const (
	frozenChildEnv = "GORUN_FROZEN_TEST_CHILD" // algorithm
	frozenBytesEnv = "GORUN_FROZEN_TEST_BYTES"
	frozenCfgEnv   = "GORUN_FROZEN_TEST_CONFIG_TIMEOUT" // Config.Timeout, as nmt-train sets it
)

// blamed is the rank err names as the cause: the culprit of an abort, the
// peer of a transport error or a mismatch; -1 if none.
func blamed(err error) int {
	var ab *AbortError
	var me *MismatchError
	var pe *rank.PeerError
	switch {
	case errors.As(err, &ab):
		return ab.Culprit
	case errors.As(err, &me):
		return me.Peer
	case errors.As(err, &pe):
		return pe.Peer
	}
	return -1
}

func frozenChild() error {
	a, err := algo.ParseAlgorithm(os.Getenv(frozenChildEnv))
	if err != nil {
		return err
	}
	n, _ := strconv.Atoi(os.Getenv(frozenBytesEnv))
	id, err := rank.FromEnv()
	if err != nil {
		return err
	}
	// GORUN_TIMEOUT and GORUN_SHM from the parent, as a program's edge
	// reads them (internal/envconf.Mesh, which imports this package)
	opt := rank.Options{SharedMemory: os.Getenv(rank.EnvShm)}
	opt.Timeout, _ = time.ParseDuration(os.Getenv(rank.EnvTimeout))
	m, err := rank.Connect(context.Background(), id, opt)
	if err != nil {
		return err
	}
	var cfg Config
	if d, err := time.ParseDuration(os.Getenv(frozenCfgEnv)); err == nil {
		cfg.Timeout = d
	}
	c, err := New(m, cfg)
	if err != nil {
		return err
	}
	buf := make([]byte, n/4*4)
	for i := 0; ; i++ {
		if err := c.Allreduce(context.Background(), nil, buf, dtype.Float32, Sum, WithAlgorithm(a)); err != nil {
			fmt.Printf("FAILED blaming %d: %v\n", blamed(err), err)
			os.Exit(1)
		}
		if i == 20 {
			fmt.Println("READY")
		}
	}
}

// TestFrozenRankNamed (issue 15, defect 3): one rank of three is stopped
// (SIGSTOP) while the ranks allreduce in a loop; the two others must fail
// with errors that blame the stopped rank, for every algorithm, over QUIC
// and through shared memory, with and without a Config.Timeout (nmt-train
// runs its token counts as a forced ring of 3 floats under one), in every
// repetition, whichever rank is stopped.
func TestFrozenRankNamed(t *testing.T) {
	if os.Getenv(frozenChildEnv) != "" {
		if err := frozenChild(); err != nil {
			fmt.Println("child:", err)
			os.Exit(2)
		}
		return
	}
	const timeout = 2 * time.Second
	reps := 3
	if testing.Short() {
		reps = 1
	}
	for _, k := range []struct {
		name, shm, algo string
		bytes           int
		cfgTimeout      bool
	}{
		{"quic/ring", "0", "ring", 4 << 10, false},
		{"quic/tree", "0", "tree", 4 << 10, false},
		{"quic/direct", "0", "direct", 4 << 10, true},
		{"quic/hd", "0", "hd", 64 << 10, false},
		{"shm/hd", "1", "hd", 4 << 10, true},
		{"shm/ring-token-counts", "1", "ring", 12, true},
		{"shm/tree", "1", "tree", 64 << 10, false},
		{"shm/direct", "1", "direct", 4 << 10, false},
		{"shm/shm", "1", "shm", 64 << 10, true},
	} {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			for rep := 0; rep < reps; rep++ {
				frozen := (rep + 1) % 3
				env := []string{frozenChildEnv + "=" + k.algo, frozenBytesEnv + "=" + strconv.Itoa(k.bytes),
					rank.EnvTimeout + "=" + timeout.String(), "GORUN_SHM=" + k.shm}
				if k.cfgTimeout {
					env = append(env, frozenCfgEnv+"="+timeout.String())
				}
				start := time.Now()
				outs := runFrozen(t, 3, frozen, env, 4*timeout+20*time.Second)
				t.Logf("repetition %d: rank %d stopped; the job ended %v later", rep, frozen, time.Since(start).Round(time.Millisecond))
				for r, out := range outs {
					if r == frozen {
						continue
					}
					if !strings.Contains(out, fmt.Sprintf("FAILED blaming %d:", frozen)) {
						t.Errorf("repetition %d, rank %d stopped: rank %d does not blame it:\n%s", rep, frozen, r, out)
					} else {
						t.Logf("repetition %d: rank %d: %s", rep, r, strings.TrimSpace(out))
					}
				}
			}
		})
	}
}

// runFrozen starts n ranks (this test binary as frozenChild), stops rank
// frozen once every rank has allreduced a while, waits for the others to
// exit (at most limit) and returns their last output lines.
func runFrozen(t *testing.T, n, frozen int, env []string, limit time.Duration) []string {
	t.Helper()
	secretHex := rank.NewSecret()
	secret, _ := hex.DecodeString(secretHex)
	rdv, err := rank.ListenRendezvous("127.0.0.1:0", n, secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rdv.Close()
	cmds := make([]*exec.Cmd, n)
	outs := make([]string, n)
	ready := make(chan int, n)
	exited := make(chan int, n)
	var mu sync.Mutex
	for r := 0; r < n; r++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFrozenRankNamed$", "-test.count=1")
		cmd.Env = append(testenv.CleanEnv(), env...)
		cmd.Env = append(cmd.Env,
			"GORUN_RANK="+strconv.Itoa(r), "GORUN_SIZE="+strconv.Itoa(n),
			"GORUN_LOCAL_RANK="+strconv.Itoa(r), "GORUN_LOCAL_SIZE="+strconv.Itoa(n), "GORUN_NODE_RANK=0",
			"GORUN_RENDEZVOUS="+rdv.Addr(), "GORUN_JOB_ID=frozentest", "GORUN_SECRET="+secretHex)
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = pw, pw
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pw.Close()
		cmds[r] = cmd
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		go func(r int) {
			sc := bufio.NewScanner(pr)
			var last []string
			for sc.Scan() {
				l := sc.Text()
				if l == "READY" {
					ready <- r
					continue
				}
				last = append(last, l)
				if len(last) > 20 {
					last = last[1:]
				}
				mu.Lock()
				outs[r] = strings.Join(last, "\n")
				mu.Unlock()
			}
			pr.Close()
			exited <- r
		}(r)
	}
	deadline := time.After(limit)
	for i := 0; i < n; i++ {
		select {
		case <-ready:
		case r := <-exited:
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("rank %d exited before the stop:\n%s", r, outs[r])
		case <-deadline:
			t.Fatalf("ranks not ready after %v", limit)
		}
	}
	cmds[frozen].Process.Signal(syscall.SIGSTOP)
	for i := 0; i < n-1; i++ {
		select {
		case r := <-exited:
			if r == frozen {
				t.Fatal("the stopped rank exited")
			}
		case <-deadline:
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("ranks still running %v after rank %d was stopped: %q", limit, frozen, outs)
		}
	}
	cmds[frozen].Process.Kill()
	mu.Lock()
	defer mu.Unlock()
	return append([]string(nil), outs...)
}
