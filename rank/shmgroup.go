//go:build linux

package rank

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/rank/internal/waitctx"
)

// A LocalGroup is one shared-memory segment mapped by every rank of a host
// (docs/shm.md, "Group segment"), for collectives that work on shared
// buffers instead of messages (collective's shared-memory allreduce).
//
// The host's lowest rank creates it during the pair handshakes (it is the
// lower rank of every local pair, so its offer to each local peer carries
// the group's name too); each peer maps it, unlinks it and says so in its
// answer; the creator unlinks it again once every answer is in and writes
// whether every peer mapped it. Each member then writes its vote: 1 when
// it shares memory with every other member (so a dead or closed member is
// noticed through the pair segment's pidfd and closed flag), 2 when not.
// Mesh.LocalGroup waits for the creator's word and the votes, so every
// member reaches the same answer.
//
// Layout: a header page (magic, version, members, slot size, the creator's
// word), a control block of GroupWords+1 64-bit words per member (the
// last one is the vote), then a data slot of GroupSlotBytes per member.

const (
	grpMagic     = 0x31304d5247524700 // "\x00GRGRM01"
	grpVersion   = 1
	grpCtrlBytes = 128
	// GroupWords is how many 64-bit control words each member of a
	// LocalGroup has for its collectives (Word).
	GroupWords = 15
	// GroupSlotBytes is the size of each member's data slot (Slot).
	GroupSlotBytes = 2 << 20
	grpOffState    = 64 // u32 written by the creator: 1 every peer mapped it, 2 not
)

// LocalGroup is this rank's view of its host's group segment.
type LocalGroup struct {
	m       *Mesh
	seg     []byte
	ranks   []int // global ranks of the members, ascending
	idx     int   // this rank's index in ranks
	dataOff int
	path    string // the creator's path, to unlink after the handshake

	mu      sync.Mutex // held between Enter and Leave; Close takes it to unmap
	closing atomic.Bool
	gone    bool
	claims  int
}

func grpLayout(n int) (dataOff, size int) {
	dataOff = (shmPage + n*grpCtrlBytes + shmPage - 1) / shmPage * shmPage
	return dataOff, dataOff + n*GroupSlotBytes
}

// grpCreate makes and maps a fresh group segment in dir for n members led
// by rank leader.
func grpCreate(dir, job string, leader, n int) (*LocalGroup, string, error) {
	// Pair names are gorun-JOB-LO-HI-HEX with HI > LO; a group uses HI = 0.
	name, err := shmName(job, leader, 0)
	if err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	dataOff, size := grpLayout(n)
	if err := shmReserve(f, size); err != nil {
		os.Remove(path)
		return nil, "", err
	}
	seg, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, "", fmt.Errorf("mmap %s: %w", path, err)
	}
	binary.LittleEndian.PutUint32(seg[8:], grpVersion)
	binary.LittleEndian.PutUint32(seg[12:], uint32(n))
	binary.LittleEndian.PutUint64(seg[16:], GroupSlotBytes)
	binary.LittleEndian.PutUint32(seg[24:], uint32(leader))
	u64At(seg, 0).Store(grpMagic)
	return &LocalGroup{seg: seg, dataOff: dataOff, path: path}, name, nil
}

// grpOpen maps the group segment the leader created in dir and checks it.
func grpOpen(dir, name string, leader, n int) (*LocalGroup, error) {
	// Not unlinked here: other members still have to open it. The leader
	// unlinks it once every member has answered (or failed to).
	dataOff, size := grpLayout(n)
	seg, path, err := shmMap(dir, name, size, false)
	if err != nil {
		return nil, err
	}
	if u64At(seg, 0).Load() != grpMagic || binary.LittleEndian.Uint32(seg[8:]) != grpVersion ||
		binary.LittleEndian.Uint32(seg[12:]) != uint32(n) || binary.LittleEndian.Uint64(seg[16:]) != GroupSlotBytes ||
		binary.LittleEndian.Uint32(seg[24:]) != uint32(leader) {
		unix.Munmap(seg)
		return nil, fmt.Errorf("%s: not a gorun group segment of %d ranks led by rank %d", path, n, leader)
	}
	return &LocalGroup{seg: seg, dataOff: dataOff}, nil
}

func (g *LocalGroup) state() *atomic.Uint32 { return u32At(g.seg, grpOffState) }
func (g *LocalGroup) vote(i int) *atomic.Uint64 {
	return u64At(g.seg, shmPage+i*grpCtrlBytes+GroupWords*8)
}

// Size is the number of members; Index this rank's place among them;
// Ranks their global ranks in ascending order.
func (g *LocalGroup) Size() int    { return len(g.ranks) }
func (g *LocalGroup) Index() int   { return g.idx }
func (g *LocalGroup) Ranks() []int { return append([]int(nil), g.ranks...) }

// Word is control word k (0 <= k < GroupWords) of member i, zero at first.
// Only use it between Enter and Leave.
func (g *LocalGroup) Word(i, k int) *atomic.Uint64 {
	if k < 0 || k >= GroupWords {
		panic("rank: LocalGroup word out of range")
	}
	return u64At(g.seg, shmPage+i*grpCtrlBytes+k*8)
}

// Slot is member i's data area (GroupSlotBytes). Only use it between
// Enter and Leave.
func (g *LocalGroup) Slot(i int) []byte {
	off := g.dataOff + i*GroupSlotBytes
	return g.seg[off : off+GroupSlotBytes : off+GroupSlotBytes]
}

// Count adds to the byte counters of member i (PeerStats.GroupSent and
// GroupRecv): sent bytes this rank wrote into the segment that i reads,
// recv bytes it read of what i wrote.
func (g *LocalGroup) Count(i, sent, recv int) {
	c := &g.m.count[g.ranks[i]]
	c.groupSent.Add(uint64(sent))
	c.groupRecv.Add(uint64(recv))
}

// Claim returns 1 on its first call on this rank, 2 on the next, and so
// on. A collective layer calls it once per communicator, in the same order
// on every member, to tell its communicators' control words apart.
func (g *LocalGroup) Claim() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.claims++
	return g.claims
}

// Enter must precede any use of Word and Slot, Leave follow it: the mesh's
// Close waits for Leave before unmapping the segment (Wait fails at once
// once Close has begun).
func (g *LocalGroup) Enter() error {
	g.mu.Lock()
	if g.gone {
		g.mu.Unlock()
		return &PeerError{Self: g.m.id.Rank, Peer: g.m.id.Rank, Op: "shared-memory group", Err: errClosed}
	}
	return nil
}

// Leave ends what Enter began.
func (g *LocalGroup) Leave() { g.mu.Unlock() }

// Wait returns once cond() holds. It spins, then yields the processor for
// up to GroupYieldFor (ranks of a host often outnumber its cores: the rank
// it waits for needs this core), then sleeps in growing naps; while it
// waits it calls check (when not nil), whose error it returns, and it fails
// with a *PeerError naming member i when i's process dies or closes its
// mesh, when this rank's mesh closes, when ctx ends, or when cond has not
// held for the timeout (the mesh's, or WithTimeout's) and i is stopped, or
// for twice the timeout while i runs (stall.go). Call it between Enter and
// Leave.
func (g *LocalGroup) Wait(ctx context.Context, i int, cond func() bool, check func() error) error {
	for k := 0; k < grpSpins; k++ {
		if cond() {
			return nil
		}
	}
	p := g.ranks[i]
	sp := g.m.shmPeer(p)
	fail := func(err error) *PeerError {
		return &PeerError{Self: g.m.id.Rank, Peer: p, Host: sp.host, Op: "shared-memory group", Err: err}
	}
	// gone ends the wait for a peer that closed its mesh or died, after one
	// more look: what it did before (arrived, posted an abort) counts.
	gone := func(err error) error {
		if cond() {
			return nil
		}
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		return fail(err)
	}
	start := time.Now()
	nextLive := start.Add(shmLiveCheck)
	timeout := waitctx.From(ctx, sp.timeout)
	nextJudge := start.Add(timeout)
	nap := shmNapMin
	for k := 0; !cond(); k++ {
		if g.closing.Load() || sp.closing.Load() {
			return fail(errClosed)
		}
		if sp.peerClosed.Load() != 0 {
			return gone(fmt.Errorf("rank %d closed its connection", p))
		}
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		now := time.Now()
		waited := now.Sub(start)
		switch {
		case waited < GroupYieldFor:
			// sched_yield lets the other processes of the host run;
			// runtime.Gosched only now and then (it hands the goroutine to
			// the Go scheduler, which wakes idle threads to steal it: with
			// several ranks per core that cost more than it gave).
			if k&255 == 255 {
				runtime.Gosched()
			} else {
				unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			}
			continue // the checks below are for longer waits
		case waited < shmNapFor:
			ts := unix.NsecToTimespec(int64(nap))
			unix.Nanosleep(&ts, nil)
			nap = min(2*nap, shmNapMax)
		default:
			time.Sleep(shmSleep)
		}
		if now.After(nextLive) {
			nextLive = now.Add(shmLiveCheck)
			if !sp.alive() {
				return gone(fmt.Errorf("rank %d (pid %d) died", p, sp.pid))
			}
		}
		if now.After(nextJudge) {
			next, err := g.m.judge(p, waited, timeout)
			if err != nil {
				pe := fail(err)
				pe.Waited = waited
				return pe
			}
			nextJudge = now.Add(next)
		}
	}
	return nil
}

// grpSpins is how many times Wait re-checks before it yields.
const grpSpins = 2000

// GroupYieldFor is how long LocalGroup.Wait yields before it sleeps.
var GroupYieldFor = 500 * time.Microsecond

// close stops waiters, waits for the user to Leave, and unmaps.
func (g *LocalGroup) close() {
	if g.closing.Swap(true) {
		return
	}
	g.mu.Lock()
	g.gone = true
	unix.Munmap(g.seg)
	g.mu.Unlock()
}

// finishGroup runs at the end of setupShm: the creator records whether
// every peer mapped the segment, every member votes.
func (m *Mesh) finishGroup(g *LocalGroup, allMapped bool) {
	if g == nil {
		return
	}
	g.m = m
	g.ranks = m.localRanks()
	for i, r := range g.ranks {
		if r == m.id.Rank {
			g.idx = i
		}
	}
	if g.path != "" {
		os.Remove(g.path)
		st := uint32(2)
		if allMapped {
			st = 1
		}
		g.state().Store(st)
	}
	v := uint64(1)
	for _, r := range g.ranks {
		if r != m.id.Rank && m.shmPeer(r) == nil {
			v = 2
		}
	}
	g.vote(g.idx).Store(v)
	m.grp = g
}

// LocalGroup returns the group segment shared by every rank of this host,
// or nil when there is none (shared memory off, a single local rank, a
// member that could not map it or lacks shared memory with another). Every
// member gets the same answer. It waits (within ctx and the mesh's
// timeout) for the other members to finish their handshakes.
func (m *Mesh) LocalGroup(ctx context.Context) (*LocalGroup, error) {
	m.grpMu.Lock()
	defer m.grpMu.Unlock()
	if m.grpDone {
		return m.grpOK, nil
	}
	g := m.grp
	if g == nil {
		m.grpDone = true
		return nil, nil
	}
	if err := g.Enter(); err != nil {
		return nil, err
	}
	ok, err := g.settle(ctx)
	g.Leave()
	if err != nil {
		return nil, err
	}
	m.grpDone = true
	if ok {
		m.grpOK = g
	}
	return m.grpOK, nil
}

func (g *LocalGroup) settle(ctx context.Context) (bool, error) {
	if g.vote(g.idx).Load() != 1 {
		return false, nil
	}
	if err := g.Wait(ctx, 0, func() bool { return g.state().Load() != 0 }, nil); err != nil {
		return false, err
	}
	if g.state().Load() != 1 {
		return false, nil
	}
	for i := range g.ranks {
		if i == g.idx {
			continue // voted 1 above
		}
		if err := g.Wait(ctx, i, func() bool { return g.vote(i).Load() != 0 }, nil); err != nil {
			return false, err
		}
		if g.vote(i).Load() != 1 {
			return false, nil
		}
	}
	return true, nil
}

func (m *Mesh) closeGroup() {
	if m.grp != nil {
		m.grp.close()
	}
}
