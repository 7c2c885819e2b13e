//go:build linux

package rank

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The shared-memory handshake between two ranks of one host, over
// channel 0 of their socket lanes.

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

// probeAddr is what this rank offers its peers to read (shmProbe's
// address), or 0 without single copies (Options.SingleCopy).
func probeAddr(singleCopy bool) uint64 {
	if !singleCopy {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&shmProbe[0])))
}

// canRead reports whether process_vm_readv of pid works (same user, no
// seccomp or LSM in the way) by reading its probe; never without single
// copies on this side.
func canRead(pid int, addr uint64, singleCopy bool) bool {
	if addr == 0 || !singleCopy {
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
	if want && local[0] == m.id.Rank && !m.opt.NoGroup {
		g, name, err := grpCreate(m.opt.ShmDir, m.id.JobID, m.id.Rank, len(local))
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
	for p, sp := range shm {
		if sp != nil {
			m.links[p] = sp
		}
	}
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
	off := shmOffer{Pid: os.Getpid(), PidNS: pidNS(), Channels: m.opt.Channels, RingBytes: shmRingBytes, Probe: probeAddr(m.opt.SingleCopy)}
	var seg []byte
	var path string
	if !want {
		off.Why = fmt.Sprintf("rank %d has %s off", m.id.Rank, EnvShm)
	} else {
		name, s, err := shmCreate(m.opt.ShmDir, m.id.JobID, m.id.Rank, p, m.opt.Channels)
		if err != nil {
			off.Why = fmt.Sprintf("rank %d cannot create a segment: %v", m.id.Rank, err)
		} else {
			off.Name, seg, path = name, s, filepath.Join(m.opt.ShmDir, name)
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
	if canRead(sp.pid, ans.Probe, m.opt.SingleCopy) {
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
	ans := shmAnswer{Pid: os.Getpid(), Probe: probeAddr(m.opt.SingleCopy)}
	var seg []byte
	var grp *LocalGroup
	switch {
	case !want:
		ans.Why = fmt.Sprintf("rank %d has %s off", m.id.Rank, EnvShm)
		if shmNameRE.MatchString(off.Name) {
			os.Remove(filepath.Join(m.opt.ShmDir, off.Name))
		}
	case off.PidNS != pidNS():
		ans.Why = "the ranks are in different pid namespaces"
	case off.Channels != m.opt.Channels || off.RingBytes != shmRingBytes:
		ans.Why = fmt.Sprintf("rank %d has %d channels and %d-byte rings, rank %d %d and %d", p, off.Channels, off.RingBytes, m.id.Rank, m.opt.Channels, shmRingBytes)
	default:
		s, err := shmOpen(m.opt.ShmDir, off.Name, p, m.id.Rank, m.opt.Channels)
		if err != nil {
			ans.Why = fmt.Sprintf("rank %d cannot map rank %d's segment: %v", m.id.Rank, p, err)
		} else {
			seg, ans.OK = s, true
			if canRead(off.Pid, off.Probe, m.opt.SingleCopy) {
				u32At(seg, shmOffCMA).Store(1) // before the answer: the lower rank may send at once
			}
			if off.Group != "" {
				if g, err := grpOpen(m.opt.ShmDir, off.Group, p, off.GroupN); err == nil {
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
