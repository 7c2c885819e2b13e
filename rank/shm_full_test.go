//go:build linux

package rank

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A nearly full /dev/shm: every segment's pages are reserved when it is
// created (fallocate), so that a segment that does not fit is a warning
// and a fallback (sockets for a pair, the rings for the group's
// allreduce), and a segment that fits can be written whole even when the
// file system fills up afterwards, never a SIGBUS.
//
// Each case runs two ranks (a loopback group, shared memory on) in a child
// process with a mount namespace of its own (unshare CLONE_NEWNS, mounts
// private) in which a small tmpfs is mounted on /dev/shm itself: the
// default directory, as on a host whose /dev/shm is nearly full, and
// nothing outside the child sees it. Needs root (CAP_SYS_ADMIN).

const shmFullChildEnv = "GORUN_SHM_FULL_CHILD"

// The two ranks' segments with one channel: the host's lowest rank creates
// the group segment first, then the pair's (rank/shm.go setupShm).
func shmFullSizes() (pair, grp int) {
	_, pair = shmLayout(1)
	_, grp = grpLayout(2)
	return
}

var shmFullCases = []struct {
	name        string
	size        func(pair, grp int) int // of the tmpfs
	pairShm     bool                    // the pair's segment fits
	group       bool                    // the group's fits (and the pair's: a group needs both)
	pairWarning bool
	grpWarning  bool
}{
	// 1 MiB: no segment fits; the pair goes over sockets, the host's
	// allreduce over messages.
	{"1MiB", func(pair, grp int) int { return 1 << 20 }, false, false, true, true},
	// room for the pair's rings and 1 MiB more: no group segment.
	{"pair-only", func(pair, grp int) int { return pair + 1<<20 }, true, false, false, true},
	// room for the group segment and 1 MiB more: the pair over sockets,
	// so no group either (its members watch each other through the pairs).
	{"group-only", func(pair, grp int) int { return grp + 1<<20 }, false, false, true, false},
	// room for both and 1 MiB more, which is then filled up.
	{"both-then-full", func(pair, grp int) int { return grp + pair + 1<<20 }, true, true, false, false},
}

func TestShmFullDevShm(t *testing.T) {
	if name := os.Getenv(shmFullChildEnv); name != "" {
		shmFullChild(t, name) // this process is the child of one case
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a small tmpfs on /dev/shm in a mount namespace of its own")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GORUN_SHM") {
			env = append(env, kv) // segments in /dev/shm, shared memory and the group on
		}
	}
	for _, c := range shmFullCases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(exe, "-test.run=^TestShmFullDevShm$", "-test.v", "-test.count=1")
			cmd.Env = append(env, shmFullChildEnv+"="+c.name)
			cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) {
					t.Skipf("cannot start a process in a mount namespace of its own: %v", err)
				}
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				cmd.Process.Kill()
				<-done
				t.Fatalf("the child did not end in 2 minutes:\n%s", out.String())
			}
			s := out.String()
			if i := strings.Index(s, "--- SKIP: TestShmFullDevShm"); i >= 0 {
				t.Skipf("child skipped: %s", strings.TrimSpace(s[i:]))
			}
			if err != nil || !strings.Contains(s, "--- PASS: TestShmFullDevShm") {
				t.Fatalf("child: %v\n%s", err, s)
			}
			for _, bad := range []string{"SIGBUS", "fatal error", "unexpected fault"} {
				if strings.Contains(s, bad) {
					t.Fatalf("child output has %q:\n%s", bad, s)
				}
			}
			for _, l := range strings.Split(s, "\n") {
				if strings.HasPrefix(l, "gorun: warning: ") {
					t.Log(l)
				}
			}
			// what each rank says: one line per segment that did not fit,
			// naming /dev/shm, the room it needed and what was free
			for _, w := range []struct {
				want bool
				line string
			}{
				{c.grpWarning, "gorun: warning: rank 0: no shared-memory group segment (/dev/shm is full: "},
				{c.pairWarning, "gorun: warning: rank 0: no shared memory with rank 1 on the same host (rank 0 cannot create a segment: /dev/shm is full: "},
			} {
				n := strings.Count(s, w.line)
				switch {
				case w.want && n != 1:
					t.Errorf("want the line %q... once, got %d times:\n%s", w.line, n, s)
				case !w.want && n != 0:
					t.Errorf("unexpected line %q...:\n%s", w.line, s)
				}
			}
			if (c.grpWarning || c.pairWarning) && !strings.Contains(s, " MiB free of ") {
				t.Errorf("the warnings do not say how much room there was:\n%s", s)
			}
		})
	}
}

// shmFullChild is TestShmFullDevShm in its child for the case name (in
// the child's mount namespace).
func shmFullChild(t *testing.T, name string) {
	var c = shmFullCases[0]
	for _, k := range shmFullCases {
		if k.name == name {
			c = k
		}
	}
	pair, grp := shmFullSizes()
	size := c.size(pair, grp)
	if err := unix.Mount("gorun-test", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=1777", size)); err != nil {
		t.Skipf("cannot mount a %d-byte tmpfs on /dev/shm: %v", size, err)
	}
	if ents, _ := os.ReadDir("/dev/shm"); len(ents) != 0 {
		t.Fatalf("/dev/shm is not the fresh tmpfs: %d entries", len(ents))
	}
	g := group(t, 2, Options{SharedMemory: "on", Channels: 1, Timeout: 20 * time.Second})
	m0, m1 := g[0].(*Mesh), g[1].(*Mesh)
	if got := m0.PeerTransport(1) == "shm"; got != c.pairShm {
		t.Fatalf("rank 0 reaches rank 1 over %s", m0.PeerTransport(1))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var grps [2]*LocalGroup
	var wg sync.WaitGroup
	var gerr [2]error
	for r, m := range []*Mesh{m0, m1} {
		wg.Add(1)
		go func() { defer wg.Done(); grps[r], gerr[r] = m.LocalGroup(ctx) }()
	}
	wg.Wait()
	for r := range grps {
		if gerr[r] != nil {
			t.Fatal(gerr[r])
		}
		if (grps[r] != nil) != c.group {
			t.Fatalf("rank %d: group segment %v, want %v", r, grps[r] != nil, c.group)
		}
	}

	// Fill the file system: what is mapped must stay writable.
	var st unix.Statfs_t
	if err := fillUp("/dev/shm/filler"); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs("/dev/shm", &st); err != nil || st.Bavail != 0 {
		t.Fatalf("/dev/shm not full: %d blocks free (%v)", st.Bavail, err)
	}

	// Every byte of both slots of the group, written by its owner, read by
	// the other member.
	if c.group {
		for r, gr := range grps {
			if err := gr.Enter(); err != nil {
				t.Fatal(err)
			}
			copy(gr.Slot(gr.Index()), pattern(r, GroupSlotBytes))
			for k := 0; k < GroupWords; k++ {
				gr.Word(gr.Index(), k).Store(uint64(r + k))
			}
			gr.Leave()
		}
		for r, gr := range grps {
			gr.Enter()
			o := 1 - gr.Index()
			if !bytes.Equal(gr.Slot(o), pattern(1-r, GroupSlotBytes)) || gr.Word(o, GroupWords-1).Load() != uint64(1-r+GroupWords-1) {
				t.Errorf("rank %d does not read member %d's slot as written", r, o)
			}
			gr.Leave()
		}
	}
	// Messages several times the ring, both ways at once, over whatever
	// carries the pair.
	const n = 3<<20 + 5
	errc := make(chan error, 4)
	for r, m := range []*Mesh{m0, m1} {
		go func() { errc <- m.Send(ctx, 1-r, 0, Tag{Seq: 1}, pattern(10+r, n)) }()
		go func() {
			buf := make([]byte, n)
			err := m.Recv(ctx, 1-r, 0, Tag{Seq: 1}, buf)
			if err == nil && !bytes.Equal(buf, pattern(10+1-r, n)) {
				err = fmt.Errorf("rank %d received other bytes than rank %d sent", r, 1-r)
			}
			errc <- err
		}()
	}
	for i := 0; i < 4; i++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	closeAll(g)
	if ents, _ := os.ReadDir("/dev/shm"); len(ents) != 1 {
		names := []string{}
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("left in /dev/shm: %v (want only the filler)", names)
	}
}

// fillUp writes path until the file system is full.
func fillUp(path string) error {
	f, err := os.OpenFile(filepath.Clean(path), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, 4096)
	for {
		if _, err := f.Write(b); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil
			}
			return err
		}
	}
}
