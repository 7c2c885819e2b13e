//go:build linux

package rank

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestShmMeshRefusesClients: a job whose ranks share memory refuses the
// same clients as one on sockets (the shared-memory handshake runs only
// over the authenticated lanes, so a refused client never learns a
// segment's name), and its ranks still reach each other through shared
// memory afterwards, with nothing left in the segment directory.
func TestShmMeshRefusesClients(t *testing.T) {
	dir := t.TempDir()
	testMeshRefusesClients(t, Options{Transport: "quic", SharedMemory: "on", ShmDir: dir, Timeout: 10 * time.Second})
	if f := shmFiles(t, dir); len(f) != 0 {
		t.Errorf("segments left in %s: %v", dir, f)
	}
}

// TestShmRefusesForeignSegments: the higher rank of a pair maps only a
// segment that is a regular file (not a link) of this user with mode 0600,
// of the size the pair's channels need, named as gorun names segments and
// written by gorun for this pair. Any other is refused with the reason,
// and the handshake answers the lower rank with it, naming both ranks.
func TestShmRefusesForeignSegments(t *testing.T) {
	dir := t.TempDir()
	const channels = 2
	_, size := shmLayout(channels)
	path := func(name string) string { return filepath.Join(dir, name) }
	segment := func(lo, hi int) string {
		name, seg, err := shmCreate(dir, "job", lo, hi, channels)
		if err != nil {
			t.Fatal(err)
		}
		unix.Munmap(seg)
		return name
	}
	must := func(err error) {
		if err != nil {
			t.Helper()
			t.Fatal(err)
		}
	}
	for _, k := range []struct {
		name string
		make func() string
		says string // "" for the one segment that must be accepted
		root bool
	}{
		{"valid", func() string { return segment(0, 1) }, "", false},
		{"mode 0644", func() string { n := segment(0, 1); must(os.Chmod(path(n), 0o644)); return n }, "mode 644 size", false},
		{"mode 0620", func() string { n := segment(0, 1); must(os.Chmod(path(n), 0o620)); return n }, "mode 620 size", false},
		{"another owner", func() string { n := segment(0, 1); must(os.Chown(path(n), 65534, 65534)); return n }, "owner 65534 mode", true},
		{"wrong size", func() string { n := segment(0, 1); must(os.Truncate(path(n), int64(size-shmPage))); return n },
			fmt.Sprintf("size %d, want owner %d mode 600 size %d", size-shmPage, os.Getuid(), size), false},
		{"symbolic link", func() string {
			n := segment(0, 1)
			l, _ := shmName("job", 0, 1)
			must(os.Symlink(path(n), path(l)))
			return l
		}, "too many levels of symbolic links", false},
		{"not a segment name", func() string { return "../" + filepath.Base(dir) + "/x" }, `bad segment name "../`, false},
		{"another pair", func() string { return segment(0, 2) }, "not a gorun segment for ranks 0 and 1", false},
		{"no gorun magic", func() string {
			// every field right but the magic number: not written by gorun
			n := segment(0, 1)
			f, err := os.OpenFile(path(n), os.O_WRONLY, 0)
			must(err)
			_, err = f.WriteAt(make([]byte, 8), 0)
			must(err)
			must(f.Close())
			return n
		}, "not a gorun segment for ranks 0 and 1", false},
	} {
		t.Run(strings.ReplaceAll(k.name, " ", "-"), func(t *testing.T) {
			if k.root && os.Getuid() != 0 {
				t.Skip("changing a file's owner needs root")
			}
			name := k.make()
			seg, err := shmOpen(dir, name, 0, 1, channels)
			if seg != nil {
				unix.Munmap(seg)
			}
			if k.says == "" {
				if err != nil {
					t.Fatalf("a valid segment was refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), k.says) {
				t.Fatalf("want a refusal saying %q, got %v", k.says, err)
			}
			// the same refusal through the handshake: rank 1 answers rank
			// 0's offer with it, and both fall back to sockets
			name = k.make()
			why, ans := shmHandshakeWith(t, dir, name, channels)
			want := "rank 1 cannot map rank 0's segment: "
			if ans.OK || ans.Why != why || !strings.HasPrefix(why, want) || !strings.Contains(why, k.says) {
				t.Fatalf("want rank 1 to refuse the offer with %q...%q, got ok %v, answer %q, why %q", want, k.says, ans.OK, ans.Why, why)
			}
		})
	}
	// A group segment another user could read is refused too.
	g, name, err := grpCreate(dir, "job", 0, 3)
	must(err)
	unix.Munmap(g.seg)
	must(os.Chmod(g.path, 0o640))
	if _, err := grpOpen(dir, name, 0, 3); err == nil || !strings.Contains(err.Error(), "mode 640") {
		t.Errorf("want a group segment of mode 640 refused, got %v", err)
	}
}

// shmHandshakeWith offers the segment name to rank 1 of a pair, as rank 0
// does, and returns why rank 1 refused it and the answer rank 0 got.
func shmHandshakeWith(t *testing.T, dir, name string, channels int) (string, shmAnswer) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	a.SetDeadline(time.Now().Add(10 * time.Second))
	b.SetDeadline(time.Now().Add(10 * time.Second))
	m := &Mesh{id: Identity{Rank: 1, Size: 2}, opt: Options{Channels: channels, ShmDir: dir}}
	var ans shmAnswer
	errc := make(chan error, 1)
	go func() {
		off := shmOffer{Name: name, Pid: os.Getpid(), PidNS: pidNS(), Channels: channels, RingBytes: shmRingBytes}
		if err := writeShmHello(a, off); err != nil {
			errc <- err
			return
		}
		errc <- readShmHello(a, &ans)
	}()
	sp, why, grp, err := m.shmAcceptFrom(b, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if sp != nil || grp != nil {
		t.Fatalf("rank 1 mapped a segment it should refuse")
	}
	return why, ans
}
