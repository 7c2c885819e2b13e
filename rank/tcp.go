package rank

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// TLS over TCP: accepting and dialing a peer's lanes (a connection per
// channel, its records sealed after the TLS handshake: sealed.go), and
// their socket buffers.

func (m *Mesh) acceptTCP(auth *jobAuth, errc chan<- error) {
	cfg := auth.serverTLS(&m.refused)
	for {
		c, err := m.tln.Accept()
		if err != nil {
			return
		}
		go func() {
			tc := tls.Server(&recordReader{Conn: c}, cfg)
			tc.SetDeadline(time.Now().Add(10 * time.Second))
			if err := tc.Handshake(); err != nil {
				c.Close()
				return
			}
			tc.SetDeadline(time.Time{})
			label := peerLabel(tc.ConnectionState())
			peer := labelRank(label)
			if peer < 0 || peer >= m.id.Rank {
				m.refuseWrongPeer(c.RemoteAddr().String(), label)
				c.Close()
				return
			}
			r, ch, err := readHello(tc)
			if err != nil || r != peer {
				c.Close()
				return
			}
			sc, err := sealLane(tc, c, false)
			if err != nil {
				c.Close()
				return
			}
			m.mu.Lock()
			m.tcpConns = append(m.tcpConns, c)
			m.mu.Unlock()
			if err := m.addLane(viaTCP, r, ch, sc); err != nil {
				select {
				case errc <- fmt.Errorf("rank %d: %w", m.id.Rank, err):
				default:
				}
			}
		}()
	}
}

// dialTCP opens p's TLS/TCP lanes.
func (m *Mesh) dialTCP(ctx context.Context, auth *jobAuth, p int, who, ta string) error {
	for ch := 0; ch < m.opt.Channels; ch++ {
		d := net.Dialer{Control: sizeTCPBuffers}
		c, err := d.DialContext(ctx, "tcp", ta)
		if err != nil {
			return fmt.Errorf("rank %d: cannot connect to %s at %s: %w", m.id.Rank, who, ta, err)
		}
		tc := tls.Client(&recordReader{Conn: c}, auth.clientTLS())
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return fmt.Errorf("rank %d: cannot connect to %s at %s: %w", m.id.Rank, who, ta, explainHandshake(err))
		}
		if got := labelRank(peerLabel(tc.ConnectionState())); got != p {
			tc.Close()
			return fmt.Errorf("rank %d: cannot connect to %s at %s: it holds this job's secret but its certificate names %q", m.id.Rank, who, ta, peerLabel(tc.ConnectionState()))
		}
		if err := writeHello(tc, m.id.Rank, ch); err != nil {
			tc.Close()
			return fmt.Errorf("rank %d: opening channel %d to %s: %w", m.id.Rank, ch, who, err)
		}
		sc, err := sealLane(tc, c, true)
		if err != nil {
			c.Close()
			return fmt.Errorf("rank %d: opening channel %d to %s: %w", m.id.Rank, ch, who, err)
		}
		m.mu.Lock()
		m.tcpConns = append(m.tcpConns, c)
		m.sets[viaTCP][p][ch] = &lane{c: sc}
		m.mu.Unlock()
	}
	return nil
}

// tcpBufferBytes is the send and receive buffer asked for on every
// TLS/TCP lane. The kernel grants twice the smaller of it and
// net.core.wmem_max or rmem_max (416 KiB on a stock Debian): enough for
// the two unread 64 KiB messages the direct allreduce may leave on a link
// (collective/direct.go). At 10 Gbit/s between two test hosts fixed 8 MiB
// buffers moved about 10 % more than the kernel's autotuning
// (docs/multihost.md).
const tcpBufferBytes = 4 << 20

// sizeTCPBuffers, a net.Dialer's and net.ListenConfig's Control, sets
// a socket's buffers before connect(2) or listen(2), where tcp(7) says they
// take effect. Set on an accepted connection after its handshake (as they
// once were), Linux 6.18 kept advertising an 82 KiB receive window: a tree
// allreduce at np 2 filled 85 % of a 1 Gbit/s link instead of 96 %.
func sizeTCPBuffers(network, address string, c syscall.RawConn) error {
	var err error
	cerr := c.Control(func(fd uintptr) {
		for _, opt := range []int{unix.SO_RCVBUF, unix.SO_SNDBUF} {
			if err == nil {
				err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, tcpBufferBytes)
			}
		}
	})
	if cerr != nil {
		return cerr
	}
	if err != nil {
		return fmt.Errorf("socket buffers: %w", err)
	}
	return nil
}
