package rank

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/gorun/gorun/rank/choice"
)

// The Mesh: a rank's connections to every other rank, the link (lane.go)
// that carries the messages to each peer, and closing them.

// peerCounters are the byte counters of one peer (PeerStats).
type peerCounters struct {
	sent, recv           atomic.Uint64
	groupSent, groupRecv atomic.Uint64
}

// Mesh connects this rank with every other rank of the job. It implements
// Transport.
type Mesh struct {
	id      Identity
	opt     Options
	lanes   [][]*lane     // [peer][channel]: the lanes that carry data (one of sets)
	sets    [2][][]*lane  // [viaQUIC or viaTCP][peer][channel]; nil for a transport not connected
	choice  choice.Choice // which transport the lanes are, and why
	ready   chan struct{}
	pending int
	mu      sync.Mutex
	count   []peerCounters
	hosts   []string
	names   []string
	addrs   []string

	udp net.PacketConn
	qtr *quic.Transport
	// quicReceive says how udp takes datagrams in (choice.Choice.Receive).
	quicReceive string
	qln         *quic.Listener
	tln         net.Listener
	conns       []*quic.Conn
	pconns      [][]*quic.Conn // [peer]: the QUIC connections with it
	live        []peerLive     // [peer]: when it was last heard from (QUIC; stall.go)
	tcpConns    []net.Conn
	rdv         *RendezvousServer
	closed      chan struct{}
	once        sync.Once
	links       []link      // [peer]: what carries the messages to it (nil for this rank)
	grp         *LocalGroup // this host's group segment, if mapped (shmgroup.go)
	grpMu       sync.Mutex
	grpDone     bool
	grpOK       *LocalGroup
	refused     refusals // connections the accept loop turned away
}

// Rank is this process's rank.
func (m *Mesh) Rank() int { return m.id.Rank }

// Size is the number of ranks in the job.
func (m *Mesh) Size() int { return m.id.Size }

// Channels is the number of lanes to each peer.
func (m *Mesh) Channels() int { return m.opt.Channels }

// Identity returns the identity the mesh was built from.
func (m *Mesh) Identity() Identity { return m.id }

// localRanks are the ranks on this rank's host (itself included), ascending.
func (m *Mesh) localRanks() []int {
	var l []int
	for p := range m.hosts {
		if m.hosts[p] == m.hosts[m.id.Rank] && m.hosts[p] != "" {
			l = append(l, p)
		}
	}
	return l
}

// Hosts returns a key per rank that is equal for ranks on the same machine
// (same machine id and network namespace).
func (m *Mesh) Hosts() []string { return append([]string(nil), m.hosts...) }

// HostNames returns each rank's host name, for messages.
func (m *Mesh) HostNames() []string { return append([]string(nil), m.names...) }

// Stats returns the bytes exchanged with each peer so far: messages
// (over the peer's transport, PeerTransport) and the group segment's.
func (m *Mesh) Stats() []PeerStats {
	s := make([]PeerStats, len(m.count))
	for i := range m.count {
		c := &m.count[i]
		s[i] = PeerStats{BytesSent: c.sent.Load(), BytesRecv: c.recv.Load(), GroupSent: c.groupSent.Load(), GroupRecv: c.groupRecv.Load()}
	}
	return s
}

// link is what carries the messages to peer on channel ch, after
// checking both; op names the call in errors.
func (m *Mesh) link(peer, ch int, op string) (link, error) {
	if peer < 0 || peer >= m.id.Size || peer == m.id.Rank {
		return nil, fmt.Errorf("rank %d: %s: invalid peer %d (job size %d)", m.id.Rank, op, peer, m.id.Size)
	}
	if ch < 0 || ch >= m.opt.Channels {
		return nil, fmt.Errorf("rank %d: %s: invalid channel %d (have %d)", m.id.Rank, op, ch, m.opt.Channels)
	}
	select {
	case <-m.closed:
		return nil, &PeerError{Self: m.id.Rank, Peer: peer, Host: m.names[peer], Op: op, Err: errClosed}
	default:
	}
	return m.links[peer], nil
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

// shmPeer is the shared-memory segment with peer, or nil when sockets
// carry its messages.
func (m *Mesh) shmPeer(peer int) *shmPeer {
	sp, _ := m.links[peer].(*shmPeer)
	return sp
}

// Send implements Transport.
func (m *Mesh) Send(ctx context.Context, peer, ch int, tag Tag, payload []byte) error {
	return m.send(ctx, peer, ch, tag, payload, false)
}

// SendMore implements MoreSender: on a TLS/TCP lane the message's records
// stay gathered behind the next message's, and both go out in one write
// (larger writes, fewer TCP segments: docs/performance.md).
func (m *Mesh) SendMore(ctx context.Context, peer, ch int, tag Tag, payload []byte) error {
	return m.send(ctx, peer, ch, tag, payload, true)
}

func (m *Mesh) send(ctx context.Context, peer, ch int, tag Tag, payload []byte, more bool) error {
	l, err := m.link(peer, ch, "send")
	if err != nil {
		return err
	}
	if len(payload) >= maxFrame {
		return fmt.Errorf("rank %d: send to rank %d: message of %d bytes exceeds the 2 GiB frame limit", m.id.Rank, peer, len(payload))
	}
	return l.send(ctx, ch, tag, payload, more)
}

// Recv implements Transport.
func (m *Mesh) Recv(ctx context.Context, peer, ch int, want Tag, dst []byte) error {
	l, err := m.link(peer, ch, "recv")
	if err != nil {
		return err
	}
	return l.recv(ctx, ch, want, dst)
}

// closeLinger bounds how long Close waits for peers to read what this rank
// sent and to close their side.
const closeLinger = 3 * time.Second

// Close tears the mesh down; blocked Sends and Recvs fail. It first closes
// the sending side of every lane and waits (at most closeLinger) for each
// peer to close its side, so that messages sent just before Close are
// delivered, not cut off.
func (m *Mesh) Close() error {
	m.once.Do(func() {
		close(m.closed)
		m.closeGroup() // before the pair segments its waiters read
		m.closeShm()
		m.mu.Lock()
		conns, tcs := m.conns, m.tcpConns
		var lanes []*lane
		for p, ls := range m.lanes {
			if m.shmPeer(p) != nil {
				continue // its socket lanes carried only the handshake: nothing to linger for
			}
			for _, l := range ls {
				if l != nil {
					lanes = append(lanes, l)
				}
			}
		}
		m.mu.Unlock()
		var wg sync.WaitGroup
		for _, l := range lanes {
			wg.Add(1)
			go func(l *lane) {
				defer wg.Done()
				l.dmu.Lock()
				setDeadline(l, false, time.Unix(1, 0)) // abort Recvs in flight
				l.dmu.Unlock()
				l.wmu.Lock()
				if cw, ok := l.c.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite()
				} else {
					l.c.Close() // a QUIC stream's Close ends its sending side
				}
				l.wmu.Unlock()
				l.rmu.Lock()
				l.dmu.Lock()
				setDeadline(l, false, time.Now().Add(closeLinger))
				l.dmu.Unlock()
				io.Copy(io.Discard, l.c)
				l.rmu.Unlock()
			}(l)
		}
		wg.Wait()
		for _, c := range conns {
			c.CloseWithError(0, fmt.Sprintf("rank %d closed its mesh", m.id.Rank))
		}
		for _, c := range tcs {
			c.Close()
		}
		if m.qln != nil {
			m.qln.Close()
		}
		if m.qtr != nil {
			m.qtr.Close()
		}
		if m.udp != nil {
			m.udp.Close()
		}
		if m.tln != nil {
			m.tln.Close()
		}
		if m.rdv != nil {
			m.rdv.Close()
		}
	})
	return nil
}

// Done is closed when Close has been called.
func (m *Mesh) Done() <-chan struct{} { return m.closed }
