//go:build linux

package rank

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Shared memory between ranks of one host (see docs/shm.md).
//
// Every pair of ranks on the same host shares one segment: a file under
// /dev/shm that the lower rank creates (mode 0600, a name with 128 random
// bits that only travels over the authenticated control stream), the higher
// rank maps and unlinks at once, and the lower rank unlinks again (a no-op
// normally) when the higher rank answers. Nothing stays in /dev/shm after the
// handshake, whatever happens to the processes later: the memory lives only as
// long as a mapping of it does.
//
// The segment holds, for every channel and direction, a single-producer
// single-consumer byte ring. Messages are framed as on a socket lane (the
// 24-byte header, then the payload) and streamed through the ring, so a
// message may be larger than the ring. Head and tail are free-running byte
// counters on their own cache lines, updated with sync/atomic on the mapped
// memory; the producer copies, then publishes the tail; the consumer reads
// the tail, copies, then publishes the head.
//
// Waiting has no futex: a waiter spins on the counters a few hundred times,
// then yields (runtime.Gosched and sched_yield, so that a peer process on the
// same core can run), then sleeps with a growing nanosleep, then time.Sleep.
// The peer's liveness is checked while waiting through a pidfd (the process
// exiting, kill -9 included, makes it readable) and through the closed flag a
// peer sets in the segment when it closes its mesh. The QUIC (or TCP)
// connection to the peer stays open beside the segment as the mesh's
// control path.

const (
	shmMagic      = 0x31304d4853524700 // "\x00GRSHM01"
	shmVersion    = 1
	shmHelloMagic = 0x47525348 // "GRSH": the handshake frame on channel 0
	shmPage       = 4096
	shmCtrlBytes  = 128 // one ring's counters: tail at 0, head at 64
	// shmRingBytes is the capacity of one ring (one channel, one direction).
	shmRingBytes = 1 << 20
	// shmChunk bounds one copy before it is published, so that the consumer
	// starts copying out while the producer still copies in.
	shmChunk = 128 << 10

	shmSpins     = 300 // busy re-checks before yielding
	shmYields    = 200 // Gosched/sched_yield rounds before sleeping
	shmNapMin    = 10 * time.Microsecond
	shmNapMax    = 500 * time.Microsecond
	shmNapFor    = 20 * time.Millisecond // then time.Sleep(shmSleep)
	shmSleep     = time.Millisecond
	shmLiveCheck = 20 * time.Millisecond
	shmOffClosed = 64  // u32: lower rank closed; 128: higher rank closed
	shmOffPidLo  = 192 // u64 pids, informational
	shmOffCMA    = 256 // u32 at 256: the higher rank reads the lower's memory; 320: the reverse

	// Messages of at least shmCMAMin bytes travel in one copy when the
	// receiver may read the sender's memory (process_vm_readv, Linux cross
	// memory attach, as MPI's vader does): the ring carries only the header
	// and the payload's address, the receiver copies straight into its
	// buffer and acknowledges, and the Send returns. It is off unless
	// GORUN_SHM_CMA=1: on this 2-core machine the two-copy ring, whose two
	// copies run in parallel on both cores, moved more (docs/shm.md).
	shmCMAMin   = 64 << 10
	shmCMAMagic = 0x434d4147 // "GAMC": a frame header whose payload stays with the sender
	envShmCMA   = "GORUN_SHM_CMA"
)

// shmProbe is what a peer reads from this process's memory at the
// handshake to learn whether it may use process_vm_readv on us.
var shmProbe = [16]byte{'g', 'o', 'r', 'u', 'n', ' ', 'c', 'm', 'a', ' ', 'p', 'r', 'o', 'b', 'e', '!'}

var (
	errShmPeerClosed = errors.New("peer closed its mesh")
	shmNameRE        = regexp.MustCompile(`^gorun-[A-Za-z0-9]{1,32}-[0-9]+-[0-9]+-[0-9a-f]{32}$`)
)

// shmRing is one direction of one channel.
type shmRing struct {
	mu   sync.Mutex // one Send (or one Recv) at a time; guards gone
	gone bool       // the segment is unmapped
	tail *atomic.Uint64
	head *atomic.Uint64
	ack  *atomic.Uint64 // single-copy messages the consumer finished (written by it)
	ackc *atomic.Uint32 // 0: it read the sender's memory; 1: it could not, send through the ring
	// claim decides who owns a posted single-copy message: the receiver
	// (0 -> 1, before it reads) or a sender that gives up (0 -> 2).
	claim *atomic.Uint32
	buf   []byte
	mask  uint64
	hdr   [headerBytes]byte
}

// shmPeer is the segment shared with one peer.
type shmPeer struct {
	self, peer int
	host       string
	seg        []byte
	tx, rx     []*shmRing
	myClosed   *atomic.Uint32
	peerClosed *atomic.Uint32
	peerReads  *atomic.Uint32 // the peer may read this process's memory
	iReads     *atomic.Uint32 // this process may read the peer's
	closing    atomic.Bool
	pid        int
	pidfd      int // -1 without pidfd_open: kill(pid, 0) then
	dead       atomic.Bool
	timeout    time.Duration
	count      *peerCounters
	mesh       *Mesh
}

func shmLayout(channels int) (dataOff, size int) {
	rings := 2 * channels
	dataOff = (shmPage + rings*shmCtrlBytes + shmPage - 1) / shmPage * shmPage
	return dataOff, dataOff + rings*shmRingBytes
}

func u64At(seg []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&seg[off]))
}

func u32At(seg []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&seg[off]))
}

// newShmPeer builds the view of a mapped segment. lower says whether this
// rank is the pair's lower rank (it sends on direction 0).
func newShmPeer(seg []byte, self, peer, channels int, lower bool) *shmPeer {
	sp := &shmPeer{self: self, peer: peer, seg: seg, pidfd: -1}
	dataOff, _ := shmLayout(channels)
	if lower {
		sp.myClosed, sp.peerClosed = u32At(seg, shmOffClosed), u32At(seg, 2*shmOffClosed)
		sp.peerReads, sp.iReads = u32At(seg, shmOffCMA), u32At(seg, shmOffCMA+64)
	} else {
		sp.myClosed, sp.peerClosed = u32At(seg, 2*shmOffClosed), u32At(seg, shmOffClosed)
		sp.peerReads, sp.iReads = u32At(seg, shmOffCMA+64), u32At(seg, shmOffCMA)
	}
	ring := func(i int) *shmRing {
		ctrl := shmPage + i*shmCtrlBytes
		off := dataOff + i*shmRingBytes
		return &shmRing{
			tail: u64At(seg, ctrl), head: u64At(seg, ctrl+64),
			ack: u64At(seg, ctrl+72), ackc: u32At(seg, ctrl+80), claim: u32At(seg, ctrl+84),
			buf: seg[off : off+shmRingBytes : off+shmRingBytes], mask: shmRingBytes - 1,
		}
	}
	for ch := 0; ch < channels; ch++ {
		lohi, hilo := ring(2*ch), ring(2*ch+1)
		if lower {
			sp.tx, sp.rx = append(sp.tx, lohi), append(sp.rx, hilo)
		} else {
			sp.tx, sp.rx = append(sp.tx, hilo), append(sp.rx, lohi)
		}
	}
	return sp
}

func shmDir() string {
	if d := os.Getenv("GORUN_SHM_DIR"); d != "" {
		return d
	}
	return "/dev/shm"
}

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

// shmCreate makes and maps a fresh segment for the pair (lo, hi).
func shmCreate(job string, lo, hi, channels int) (name string, seg []byte, err error) {
	name, err = shmName(job, lo, hi)
	if err != nil {
		return "", nil, err
	}
	path := filepath.Join(shmDir(), name)
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
		return "", nil, fmt.Errorf("mmap %s: %v", path, err)
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
			return fmt.Errorf("%s is full: the segment needs %s (fallocate: %v)", dir, mib(uint64(size)), err)
		}
		return fmt.Errorf("%s is full: the segment needs %s, %s free of %s (fallocate: %v)", dir, mib(uint64(size)),
			mib(st.Bavail*uint64(st.Bsize)), mib(st.Blocks*uint64(st.Bsize)), err)
	}
	return fmt.Errorf("fallocate %s: %v", f.Name(), err)
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// shmMap opens and maps an existing segment by name, checking that it is
// this user's, mode 0600, of the expected size; unlink removes the name
// once opened.
func shmMap(name string, size int, unlink bool) ([]byte, string, error) {
	if !shmNameRE.MatchString(name) {
		return nil, "", fmt.Errorf("bad segment name %q", name)
	}
	path := filepath.Join(shmDir(), name)
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
		return nil, "", fmt.Errorf("mmap %s: %v", path, err)
	}
	return seg, path, nil
}

// shmOpen maps the segment the lower rank created, checks it, and unlinks it
// (both sides have it then, or the creator is gone: nothing stays behind).
func shmOpen(name string, lo, hi, channels int) ([]byte, error) {
	_, size := shmLayout(channels)
	seg, path, err := shmMap(name, size, true)
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

// shmOffer is the lower rank's handshake message, shmAnswer the higher's.
type shmOffer struct {
	Name      string `json:"name,omitempty"` // "" when the lower rank declines
	Why       string `json:"why,omitempty"`
	Pid       int    `json:"pid"`
	PidNS     string `json:"pidns"`
	Channels  int    `json:"channels"`
	RingBytes int    `json:"ring"`
	Probe     uint64 `json:"probe,omitempty"` // address of shmProbe in the sender
	Group     string `json:"group,omitempty"` // the host's group segment (shmgroup.go)
	GroupN    int    `json:"groupn,omitempty"`
}

type shmAnswer struct {
	OK      bool   `json:"ok"`
	Why     string `json:"why,omitempty"`
	Pid     int    `json:"pid"`
	Probe   uint64 `json:"probe,omitempty"`
	GroupOK bool   `json:"groupok,omitempty"` // mapped the group segment
}

func probeAddr() uint64 {
	if v := os.Getenv(envShmCMA); v != "1" && v != "on" && v != "true" {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&shmProbe[0])))
}

// canRead reports whether process_vm_readv of pid works (same user, no
// seccomp or LSM in the way) by reading its probe.
func canRead(pid int, addr uint64) bool {
	if addr == 0 || probeAddr() == 0 {
		return false
	}
	var got [len(shmProbe)]byte
	n, err := unix.ProcessVMReadv(pid, []unix.Iovec{{Base: &got[0], Len: uint64(len(got))}},
		[]unix.RemoteIovec{{Base: uintptr(addr), Len: len(got)}}, 0)
	return err == nil && n == len(got) && got == shmProbe
}

func writeShmHello(c laneConn, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b := make([]byte, 8+len(body))
	binary.LittleEndian.PutUint32(b[0:], shmHelloMagic)
	binary.LittleEndian.PutUint32(b[4:], uint32(len(body)))
	copy(b[8:], body)
	if _, err = c.Write(b); err != nil {
		return err
	}
	if f, ok := c.(flusher); ok {
		_, err = f.Flush()
	}
	return err
}

func readShmHello(c laneConn, v any) error {
	var h [8]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return err
	}
	n := binary.LittleEndian.Uint32(h[4:])
	if binary.LittleEndian.Uint32(h[0:]) != shmHelloMagic || n > 1<<16 {
		return errors.New("bad shared-memory handshake (is every rank the same gorun version?)")
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		return err
	}
	return json.Unmarshal(body, v)
}

func pidNS() string {
	s, _ := os.Readlink("/proc/self/ns/pid")
	return s
}

// setupShm runs the shared-memory handshake with every peer on this host,
// over channel 0 of the already authenticated mesh, before any message.
// A pair that cannot share memory (turned off on either side, another pid
// namespace, no /dev/shm) keeps its socket lanes.
func (m *Mesh) setupShm(ctx context.Context) error {
	want, err := shmEnabled(m.opt.SharedMemory)
	if err != nil {
		return err
	}
	local := m.localRanks()
	var peers []int
	for _, p := range local {
		if p != m.id.Rank {
			peers = append(peers, p)
		}
	}
	if len(peers) == 0 {
		return nil
	}
	shm := make([]*shmPeer, m.id.Size)
	errs := make([]error, len(peers))
	// The host's lowest rank creates the group segment and offers it with
	// every pair segment (it is the lower rank of every local pair).
	var grp *LocalGroup
	var grpName string
	if want && local[0] == m.id.Rank && os.Getenv(EnvShmGroup) != "0" {
		g, name, err := grpCreate(m.id.JobID, m.id.Rank, len(local))
		if err != nil {
			fmt.Fprintf(os.Stderr, "gorun: warning: rank %d: no shared-memory group segment (%v); the host's allreduce goes through messages\n", m.id.Rank, err)
		} else {
			grp, grpName = g, name
		}
	}
	grpMapped := make([]bool, len(peers))
	var mine *LocalGroup // a member's mapping of the leader's segment
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := m.lanes[p][0]
			l.rmu.Lock()
			l.wmu.Lock()
			defer l.wmu.Unlock()
			defer l.rmu.Unlock()
			dl, _ := ctx.Deadline()
			l.c.SetReadDeadline(dl)
			l.c.SetWriteDeadline(dl)
			defer l.c.SetReadDeadline(time.Time{})
			defer l.c.SetWriteDeadline(time.Time{})
			var sp *shmPeer
			var why string
			var err error
			if m.id.Rank < p {
				sp, why, grpMapped[i], err = m.shmOfferTo(l.c, p, want, grpName, len(local))
			} else {
				var g *LocalGroup
				sp, why, g, err = m.shmAcceptFrom(l.c, p, want)
				if g != nil {
					mine = g // only the leader offers one
				}
			}
			if err != nil {
				errs[i] = &PeerError{Self: m.id.Rank, Peer: p, Host: m.names[p], Op: "shared-memory handshake", Err: err}
				return
			}
			if sp == nil {
				if want && why != "" {
					via := m.opt.Transport
					if via == "" || via == "auto" {
						via = "sockets" // QUIC or TLS/TCP, chosen after this
					}
					fmt.Fprintf(os.Stderr, "gorun: warning: rank %d: no shared memory with rank %d on the same host (%s); using %s\n", m.id.Rank, p, why, via)
				}
				return
			}
			sp.host, sp.timeout, sp.count, sp.mesh = m.names[p], m.opt.Timeout, &m.count[p], m
			if fd, err := unix.PidfdOpen(sp.pid, 0); err == nil {
				sp.pidfd = fd
			}
			shm[p] = sp
		}()
	}
	wg.Wait()
	m.shm = shm
	if grp != nil {
		all := true
		for i, p := range peers {
			all = all && grpMapped[i] && shm[p] != nil
		}
		m.finishGroup(grp, all)
	} else if mine != nil {
		m.finishGroup(mine, false)
	}
	return errors.Join(errs...)
}

func (m *Mesh) shmOfferTo(c laneConn, p int, want bool, group string, groupN int) (*shmPeer, string, bool, error) {
	off := shmOffer{Pid: os.Getpid(), PidNS: pidNS(), Channels: m.opt.Channels, RingBytes: shmRingBytes, Probe: probeAddr()}
	var seg []byte
	var path string
	if !want {
		off.Why = fmt.Sprintf("rank %d has %s off", m.id.Rank, EnvShm)
	} else {
		name, s, err := shmCreate(m.id.JobID, m.id.Rank, p, m.opt.Channels)
		if err != nil {
			off.Why = fmt.Sprintf("rank %d cannot create a segment: %v", m.id.Rank, err)
		} else {
			off.Name, seg, path = name, s, filepath.Join(shmDir(), name)
			off.Group, off.GroupN = group, groupN
		}
	}
	undo := func() {
		if seg != nil {
			os.Remove(path)
			unix.Munmap(seg)
		}
	}
	if err := writeShmHello(c, off); err != nil {
		undo()
		return nil, "", false, err
	}
	if seg == nil {
		return nil, off.Why, false, nil
	}
	var ans shmAnswer
	if err := readShmHello(c, &ans); err != nil {
		undo()
		return nil, "", false, err
	}
	os.Remove(path) // the peer unlinked it already; this covers a peer that failed after creating nothing
	if !ans.OK {
		unix.Munmap(seg)
		return nil, ans.Why, false, nil
	}
	sp := newShmPeer(seg, m.id.Rank, p, m.opt.Channels, true)
	sp.pid = ans.Pid
	if canRead(sp.pid, ans.Probe) {
		sp.iReads.Store(1)
	}
	return sp, "", ans.GroupOK, nil
}

func (m *Mesh) shmAcceptFrom(c laneConn, p int, want bool) (*shmPeer, string, *LocalGroup, error) {
	var off shmOffer
	if err := readShmHello(c, &off); err != nil {
		return nil, "", nil, err
	}
	if off.Name == "" {
		return nil, off.Why, nil, nil
	}
	ans := shmAnswer{Pid: os.Getpid(), Probe: probeAddr()}
	var seg []byte
	var grp *LocalGroup
	switch {
	case !want:
		ans.Why = fmt.Sprintf("rank %d has %s off", m.id.Rank, EnvShm)
		if shmNameRE.MatchString(off.Name) {
			os.Remove(filepath.Join(shmDir(), off.Name))
		}
	case off.PidNS != pidNS():
		ans.Why = "the ranks are in different pid namespaces"
	case off.Channels != m.opt.Channels || off.RingBytes != shmRingBytes:
		ans.Why = fmt.Sprintf("rank %d has %d channels and %d-byte rings, rank %d %d and %d", p, off.Channels, off.RingBytes, m.id.Rank, m.opt.Channels, shmRingBytes)
	default:
		s, err := shmOpen(off.Name, p, m.id.Rank, m.opt.Channels)
		if err != nil {
			ans.Why = fmt.Sprintf("rank %d cannot map rank %d's segment: %v", m.id.Rank, p, err)
		} else {
			seg, ans.OK = s, true
			if canRead(off.Pid, off.Probe) {
				u32At(seg, shmOffCMA).Store(1) // before the answer: the lower rank may send at once
			}
			if off.Group != "" {
				if g, err := grpOpen(off.Group, p, off.GroupN); err == nil {
					grp, ans.GroupOK = g, true
				} else {
					fmt.Fprintf(os.Stderr, "gorun: warning: rank %d: cannot map rank %d's shared-memory group segment: %v\n", m.id.Rank, p, err)
				}
			}
		}
	}
	if err := writeShmHello(c, ans); err != nil {
		if seg != nil {
			unix.Munmap(seg)
		}
		if grp != nil {
			unix.Munmap(grp.seg)
		}
		return nil, "", nil, err
	}
	if !ans.OK {
		return nil, ans.Why, nil, nil
	}
	sp := newShmPeer(seg, m.id.Rank, p, m.opt.Channels, false)
	sp.pid = off.Pid
	return sp, "", grp, nil
}

// PeerTransport names how this rank exchanges messages with peer: "shm",
// "quic", "tcp", or "self".
func (m *Mesh) PeerTransport(peer int) string {
	if peer == m.id.Rank {
		return "self"
	}
	if m.shmPeer(peer) != nil {
		return "shm"
	}
	return m.choice.Transport
}

func (m *Mesh) shmPeer(peer int) *shmPeer {
	if m.shm == nil {
		return nil
	}
	return m.shm[peer]
}

func (m *Mesh) closeShm() {
	for _, sp := range m.shm {
		if sp != nil {
			sp.close()
		}
	}
}

// close tells the peer, stops this side's waiters, and unmaps the segment.
// What this side sent stays readable by the peer: its own mapping keeps the
// memory.
func (sp *shmPeer) close() {
	if sp.closing.Swap(true) {
		return
	}
	sp.myClosed.Store(1)
	for _, rs := range [][]*shmRing{sp.tx, sp.rx} {
		for _, r := range rs {
			r.mu.Lock()
			r.gone = true
		}
	}
	unix.Munmap(sp.seg)
	for _, rs := range [][]*shmRing{sp.tx, sp.rx} {
		for _, r := range rs {
			r.mu.Unlock()
		}
	}
	if sp.pidfd >= 0 {
		unix.Close(sp.pidfd)
	}
}

// alive reports whether the peer process still runs.
func (sp *shmPeer) alive() bool {
	if sp.dead.Load() {
		return false
	}
	var gone bool
	if sp.pidfd >= 0 {
		fds := []unix.PollFd{{Fd: int32(sp.pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		gone = err == nil && n > 0
	} else {
		gone = unix.Kill(sp.pid, 0) == unix.ESRCH
	}
	if gone {
		sp.dead.Store(true)
	}
	return !gone
}

// shmWait paces one Send or Recv while the ring is full or empty.
type shmWait struct {
	sp        *shmPeer
	ctx       context.Context
	n         int
	nap       time.Duration
	start     time.Time // of the wait without progress
	nextLive  time.Time
	timeout   time.Duration
	nextJudge time.Time
	stall     error // what ended the wait (errShmStall)
	gone      error // the peer closed or died: the next pause fails with it
}

// progress resets the backoff after bytes moved.
func (w *shmWait) progress() { w.n = 0 }

// pause waits a little; it fails when the wait must end.
func (w *shmWait) pause() error {
	sp := w.sp
	if sp.closing.Load() {
		return errClosed
	}
	// A peer that closed its mesh or died may have written (an abort, say)
	// just before: the caller looks at the ring once more before this
	// wait fails.
	if w.gone != nil {
		return w.gone
	}
	if sp.peerClosed.Load() != 0 {
		w.gone = errShmPeerClosed
		return nil
	}
	w.n++
	if w.n <= shmSpins {
		return nil
	}
	if w.n == shmSpins+1 {
		w.start = time.Now()
		w.nextLive = w.start.Add(shmLiveCheck)
		w.nap = shmNapMin
		if w.timeout == 0 {
			w.timeout = timeoutFrom(w.ctx, sp.timeout)
		}
		w.nextJudge = w.start.Add(w.timeout)
	}
	select {
	case <-w.ctx.Done():
		return w.ctx.Err()
	default:
	}
	if w.n <= shmSpins+shmYields {
		if w.n&1 == 0 {
			runtime.Gosched()
		} else {
			unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
		if w.n&31 != 0 {
			return nil
		}
	} else if waited := time.Since(w.start); waited < shmNapFor {
		ts := unix.NsecToTimespec(int64(w.nap))
		unix.Nanosleep(&ts, nil)
		w.nap = min(2*w.nap, shmNapMax)
	} else {
		time.Sleep(shmSleep)
	}
	now := time.Now()
	if now.After(w.nextLive) {
		w.nextLive = now.Add(shmLiveCheck)
		if !sp.alive() {
			w.gone = errShmPeerDied
			return nil
		}
	}
	if now.After(w.nextJudge) {
		// No progress for the timeout: a stopped peer is named now, a live
		// one gets longer (stall.go).
		next, err := sp.mesh.judge(sp.peer, now.Sub(w.start), w.timeout)
		if err != nil {
			w.stall = err
			return errShmStall
		}
		w.nextJudge = now.Add(next)
	}
	return nil
}

var (
	errShmStall    = errors.New("no progress")
	errShmPeerDied = errors.New("peer process died")
)

func (sp *shmPeer) fail(w *shmWait, op string, ch int, tag Tag, err error) error {
	var waited time.Duration
	switch {
	case w.ctx.Err() != nil:
		err = w.ctx.Err()
	case err == errClosed:
	case err == errShmStall:
		waited = w.stall.(*stallError).waited
		err = fmt.Errorf("%w (shared-memory channel %d, %v)", w.stall, ch, tag)
	case err == errShmPeerDied:
		err = fmt.Errorf("rank %d (pid %d) died (shared-memory channel %d, %v)", sp.peer, sp.pid, ch, tag)
	case err == errShmPeerClosed:
		err = fmt.Errorf("rank %d closed the connection (shared-memory channel %d, %v)", sp.peer, ch, tag)
	default:
		err = fmt.Errorf("%v (shared-memory channel %d, %v)", err, ch, tag)
	}
	return &PeerError{Self: sp.self, Peer: sp.peer, Host: sp.host, Op: op, Err: err, Waited: waited}
}

// put copies b into the ring from position *t, waiting for room; it
// publishes the tail after every chunk when publish is set, else leaves that
// to the caller.
func (r *shmRing) put(w *shmWait, t *uint64, b []byte, publish bool) error {
	size := uint64(len(r.buf))
	for len(b) > 0 {
		free := size - (*t - r.head.Load())
		if free == 0 {
			r.tail.Store(*t) // let the consumer drain what is written
			if err := w.pause(); err != nil {
				return err
			}
			continue
		}
		w.progress()
		n := min(free, uint64(len(b)), shmChunk)
		off := *t & r.mask
		k := copy(r.buf[off:], b[:n])
		copy(r.buf, b[k:n])
		*t += n
		b = b[n:]
		if publish {
			r.tail.Store(*t)
		}
	}
	return nil
}

// get copies the next len(b) bytes out of the ring (drops them if b is nil
// and skip > 0), waiting for data.
func (r *shmRing) get(w *shmWait, b []byte, skip int) error {
	h := r.head.Load()
	want := uint64(len(b))
	if b == nil {
		want = uint64(skip)
	}
	for want > 0 {
		avail := r.tail.Load() - h
		if avail == 0 {
			if err := w.pause(); err != nil {
				// A peer that closed after sending still delivers.
				if err == errShmPeerClosed && r.tail.Load() != h {
					continue
				}
				return err
			}
			continue
		}
		w.progress()
		n := min(avail, want, shmChunk)
		if b != nil {
			off := h & r.mask
			k := copy(b[:n], r.buf[off:])
			copy(b[k:n], r.buf)
			b = b[n:]
		}
		h += n
		want -= n
		r.head.Store(h)
	}
	return nil
}

func (sp *shmPeer) send(ctx context.Context, ch int, tag Tag, payload []byte) error {
	r := sp.tx[ch]
	r.mu.Lock()
	defer r.mu.Unlock()
	w := shmWait{sp: sp, ctx: ctx}
	if r.gone {
		return sp.fail(&w, "send", ch, tag, errClosed)
	}
	if sp.peerClosed.Load() != 0 {
		return sp.fail(&w, "send", ch, tag, errShmPeerClosed)
	}
	putHeader(r.hdr[:], tag, len(payload))
	if len(payload) >= shmCMAMin && sp.peerReads.Load() != 0 {
		return sp.sendByAddress(r, &w, ch, tag, payload)
	}
	t := r.tail.Load()
	// The header is published together with the first chunk of payload.
	if err := r.put(&w, &t, r.hdr[:], false); err != nil {
		return sp.fail(&w, "send", ch, tag, err)
	}
	if err := r.put(&w, &t, payload, true); err != nil {
		return sp.fail(&w, "send", ch, tag, err)
	}
	r.tail.Store(t)
	sp.count.sent.Add(uint64(headerBytes + len(payload)))
	return nil
}

// sendByAddress posts the header and the payload's address, and waits until
// the receiver has copied the payload out of this process's memory. The
// payload is Go heap (or foreign) memory, which does not move; it stays
// alive and unchanged while the Send blocks.
func (sp *shmPeer) sendByAddress(r *shmRing, w *shmWait, ch int, tag Tag, payload []byte) error {
	binary.LittleEndian.PutUint32(r.hdr[0:], shmCMAMagic)
	var addr [8]byte
	binary.LittleEndian.PutUint64(addr[:], uint64(uintptr(unsafe.Pointer(&payload[0]))))
	want := r.ack.Load() + 1
	r.claim.Store(0)
	t := r.tail.Load()
	if err := r.put(w, &t, r.hdr[:], false); err != nil {
		return sp.fail(w, "send", ch, tag, err)
	}
	if err := r.put(w, &t, addr[:], true); err != nil {
		return sp.fail(w, "send", ch, tag, err)
	}
	for r.ack.Load() != want {
		err := w.pause()
		if err == nil {
			continue
		}
		// Giving up (cancelled, timed out, peer gone): retract the message
		// so that the receiver never reads memory we no longer own. If it
		// is copying already, the copy is short: wait for it.
		if r.claim.CompareAndSwap(0, 2) || sp.dead.Load() || sp.closing.Load() {
			return sp.fail(w, "send", ch, tag, err)
		}
		w2 := shmWait{sp: sp, ctx: context.Background()}
		for r.ack.Load() != want {
			if err2 := w2.pause(); err2 != nil {
				return sp.fail(w, "send", ch, tag, err)
			}
		}
		break
	}
	runtime.KeepAlive(payload)
	if r.ackc.Load() != 0 {
		// The receiver could not read our memory after all: stream it.
		sp.peerReads.Store(0)
		w.progress()
		if err := r.put(w, &t, payload, true); err != nil {
			return sp.fail(w, "send", ch, tag, err)
		}
	}
	sp.count.sent.Add(uint64(headerBytes + len(payload)))
	return nil
}

// readAddress copies a single-copy payload from the sender's memory.
func (sp *shmPeer) readAddress(addr uint64, dst []byte) error {
	for len(dst) > 0 {
		n, err := unix.ProcessVMReadv(sp.pid, []unix.Iovec{{Base: &dst[0], Len: uint64(len(dst))}},
			[]unix.RemoteIovec{{Base: uintptr(addr), Len: len(dst)}}, 0)
		if err != nil {
			return err
		}
		if n <= 0 {
			return io.ErrUnexpectedEOF
		}
		dst, addr = dst[n:], addr+uint64(n)
	}
	return nil
}

func (sp *shmPeer) recvMsg(ctx context.Context, ch int, want Tag, dst []byte) error {
	r := sp.rx[ch]
	r.mu.Lock()
	defer r.mu.Unlock()
	w := shmWait{sp: sp, ctx: ctx}
	if r.gone {
		return sp.fail(&w, "recv", ch, want, errClosed)
	}
	if err := r.get(&w, r.hdr[:], 0); err != nil {
		return sp.fail(&w, "recv", ch, want, err)
	}
	magic := binary.LittleEndian.Uint32(r.hdr[0:])
	if magic != frameMagic && magic != shmCMAMagic {
		return &PeerError{Self: sp.self, Peer: sp.peer, Host: sp.host, Op: "recv",
			Err: fmt.Errorf("garbage on shared-memory channel %d (bad frame header %08x): the ring is out of step", ch, magic)}
	}
	got, n := parseHeader(r.hdr[:])
	if magic == shmCMAMagic {
		var a [8]byte
		if err := r.get(&w, a[:], 0); err != nil {
			return sp.fail(&w, "recv", ch, want, err)
		}
		sp.count.recv.Add(uint64(headerBytes + n))
		if !r.claim.CompareAndSwap(0, 1) {
			return &PeerError{Self: sp.self, Peer: sp.peer, Host: sp.host, Op: "recv",
				Err: fmt.Errorf("rank %d gave up sending this message (shared-memory channel %d, %v)", sp.peer, ch, got)}
		}
		if got != want || n != len(dst) {
			r.ackc.Store(0)
			r.ack.Add(1)
			return &MismatchError{Self: sp.self, Peer: sp.peer, Channel: ch, Want: want, Got: got, WantLen: len(dst), GotLen: n}
		}
		err := sp.readAddress(binary.LittleEndian.Uint64(a[:]), dst)
		if err == nil {
			r.ackc.Store(0)
			r.ack.Add(1)
			return nil
		}
		if errors.Is(err, unix.ESRCH) {
			sp.dead.Store(true)
			return sp.fail(&w, "recv", ch, want, errShmPeerDied)
		}
		// Not allowed after all (or the sender's memory changed under
		// us): ask for the payload through the ring.
		r.ackc.Store(1)
		r.ack.Add(1)
		if err := r.get(&w, dst, 0); err != nil {
			return sp.fail(&w, "recv", ch, want, err)
		}
		return nil
	}
	if got != want || n != len(dst) {
		if n > 0 {
			if err := r.get(&w, nil, n); err != nil {
				return sp.fail(&w, "recv", ch, want, err)
			}
		}
		sp.count.recv.Add(uint64(headerBytes + n))
		return &MismatchError{Self: sp.self, Peer: sp.peer, Channel: ch, Want: want, Got: got, WantLen: len(dst), GotLen: n}
	}
	if n > 0 {
		if err := r.get(&w, dst, 0); err != nil {
			return sp.fail(&w, "recv", ch, want, err)
		}
	}
	sp.count.recv.Add(uint64(headerBytes + n))
	return nil
}
