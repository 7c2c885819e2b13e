//go:build linux

package rank

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The pair segments' files: names, creating, reserving and mapping.

// shmName returns a fresh segment name, gorun-JOB-LO-HI-RANDOM, with 128
// random bits.
func shmName(job string, lo, hi int) (string, error) {
	var rnd [16]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", err
	}
	j := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, job)
	if len(j) > 32 {
		j = j[:32]
	}
	if j == "" {
		j = "nojob"
	}
	return fmt.Sprintf("gorun-%s-%d-%d-%s", j, lo, hi, hex.EncodeToString(rnd[:])), nil
}

// shmCreate makes and maps a fresh segment for the pair (lo, hi) in dir.
func shmCreate(dir, job string, lo, hi, channels int) (name string, seg []byte, err error) {
	name, err = shmName(job, lo, hi)
	if err != nil {
		return "", nil, err
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	_, size := shmLayout(channels)
	if err := shmReserve(f, size); err != nil {
		os.Remove(path)
		return "", nil, err
	}
	seg, err = unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return "", nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	binary.LittleEndian.PutUint32(seg[8:], shmVersion)
	binary.LittleEndian.PutUint32(seg[12:], uint32(channels))
	binary.LittleEndian.PutUint64(seg[16:], shmRingBytes)
	binary.LittleEndian.PutUint32(seg[24:], uint32(lo))
	binary.LittleEndian.PutUint32(seg[28:], uint32(hi))
	u64At(seg, shmOffPidLo).Store(uint64(os.Getpid()))
	u64At(seg, 0).Store(shmMagic)
	return name, seg, nil
}

// shmReserve gives a new segment file its size with every page allocated
// (fallocate(2), mode 0), so that a segment that does not fit in the
// directory (a nearly full /dev/shm) is this error, naming the directory,
// what the segment needs and what is free, and never a SIGBUS at the first
// write to a page the file system has no room for, however full it gets
// afterwards. A file system without fallocate gets the size alone
// (ftruncate), as before.
func shmReserve(f *os.File, size int) error {
	fd := int(f.Fd())
	var err error
	for {
		// tmpfs gives up a long fallocate on a signal (Go's preemption
		// sends them): again, keeping what it allocated
		if err = unix.Fallocate(fd, 0, 0, int64(size)); err != unix.EINTR {
			break
		}
	}
	switch {
	case err == nil:
		return nil
	case err == unix.EOPNOTSUPP || err == unix.ENOSYS:
		return f.Truncate(int64(size))
	case err == unix.ENOSPC:
		dir := filepath.Dir(f.Name())
		var st unix.Statfs_t
		if unix.Fstatfs(fd, &st) != nil {
			return fmt.Errorf("%s is full: the segment needs %s (fallocate: %w)", dir, mib(uint64(size)), err)
		}
		return fmt.Errorf("%s is full: the segment needs %s, %s free of %s (fallocate: %w)", dir, mib(uint64(size)),
			mib(st.Bavail*uint64(st.Bsize)), mib(st.Blocks*uint64(st.Bsize)), err)
	}
	return fmt.Errorf("fallocate %s: %w", f.Name(), err)
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// shmMap opens and maps an existing segment by name in dir, checking that it is
// this user's, mode 0600, of the expected size; unlink removes the name
// once opened.
func shmMap(dir, name string, size int, unlink bool) ([]byte, string, error) {
	if !shmNameRE.MatchString(name) {
		return nil, "", fmt.Errorf("bad segment name %q", name)
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	if unlink {
		os.Remove(path)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, "", err
	}
	if st.Uid != uint32(os.Getuid()) || st.Mode&0o077 != 0 || st.Size != int64(size) {
		return nil, "", fmt.Errorf("%s: owner %d mode %o size %d, want owner %d mode 600 size %d", path, st.Uid, st.Mode&0o777, st.Size, os.Getuid(), size)
	}
	seg, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, "", fmt.Errorf("mmap %s: %w", path, err)
	}
	return seg, path, nil
}

// shmOpen maps the segment the lower rank created in dir, checks it, and unlinks it
// (both sides have it then, or the creator is gone: nothing stays behind).
func shmOpen(dir, name string, lo, hi, channels int) ([]byte, error) {
	_, size := shmLayout(channels)
	seg, path, err := shmMap(dir, name, size, true)
	if err != nil {
		return nil, err
	}
	if u64At(seg, 0).Load() != shmMagic || binary.LittleEndian.Uint32(seg[8:]) != shmVersion ||
		binary.LittleEndian.Uint32(seg[12:]) != uint32(channels) || binary.LittleEndian.Uint64(seg[16:]) != shmRingBytes ||
		binary.LittleEndian.Uint32(seg[24:]) != uint32(lo) || binary.LittleEndian.Uint32(seg[28:]) != uint32(hi) {
		unix.Munmap(seg)
		return nil, fmt.Errorf("%s: not a gorun segment for ranks %d and %d", path, lo, hi)
	}
	return seg, nil
}
