//go:build linux

package rank

import (
	"encoding/binary"
	"net"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// groBatch is how many coalesced datagrams one recvmmsg takes; groBuffer is
// the most one of them holds (the kernel coalesces up to 64 KiB).
const (
	groBatch  = 8
	groBuffer = 1 << 16
)

// groConn is the UDP socket quic-go reads through, receiving with UDP_GRO:
// the kernel hands over a run of same-sized datagrams from one sender (one
// GSO send of quic-go's, up to 20 KiB, or what the NIC coalesced) as one
// buffer, so a system call and the kernel's per-datagram work carry up to
// 64 KiB instead of one 1452-byte packet. ReadBatch, which quic-go calls in
// place of its own recvmmsg when the conn has it, cuts the buffers back into
// datagrams. quic-go itself reads without GRO (quic-go issue 3838).
//
// quic-go calls ReadBatch from one goroutine only (its Transport's read
// loop), so the state below needs no lock.
type groConn struct {
	*net.UDPConn
	pc   *ipv4.PacketConn
	msgs []ipv4.Message
	n    int // datagrams the last recvmmsg returned
	i    int // the one being cut
	off  int // where its next segment starts
	seg  int // its segment size
}

// quicConn returns the conn for quic-go's Transport, a groConn when gro
// is set and the kernel takes UDP_GRO, else udp itself, and says which
// (choice.Choice.Receive).
func quicConn(udp net.PacketConn, gro bool) (net.PacketConn, string) {
	if !gro {
		return udp, oneByOne + EnvQUICGRO + "=off"
	}
	u, ok := udp.(*net.UDPConn)
	if !ok {
		return udp, oneByOne + "not a UDP socket"
	}
	raw, err := u.SyscallConn()
	if err != nil {
		return udp, oneByOne + err.Error()
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_GRO, 1)
	}); err != nil || serr != nil {
		return udp, oneByOne + "this kernel has no UDP_GRO"
	}
	c := &groConn{UDPConn: u, pc: ipv4.NewPacketConn(u), msgs: make([]ipv4.Message, groBatch)}
	for k := range c.msgs {
		c.msgs[k].Buffers = [][]byte{make([]byte, groBuffer)}
		c.msgs[k].OOB = make([]byte, 128)
	}
	return c, "datagrams received with UDP_GRO"
}

// ReadBatch fills ms with the next datagrams, each one segment of a
// coalesced buffer, reading the socket only when every buffer of the last
// read has been handed out. Each segment carries its buffer's control
// messages (ECN and packet info; quic-go skips the UDP_GRO one).
func (c *groConn) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	if c.i == c.n {
		n, err := c.pc.ReadBatch(c.msgs, flags)
		if n == 0 || err != nil {
			return 0, err
		}
		c.n, c.i, c.off = n, 0, 0
		c.seg = segmentSize(&c.msgs[0])
	}
	k := 0
	for k < len(ms) && c.i < c.n {
		m, d := &c.msgs[c.i], &ms[k]
		end := min(c.off+c.seg, m.N)
		d.N = copy(d.Buffers[0], m.Buffers[0][c.off:end])
		d.NN = copy(d.OOB, m.OOB[:m.NN])
		d.Addr, d.Flags = m.Addr, m.Flags
		k++
		c.off = end
		if c.off >= m.N {
			c.i, c.off = c.i+1, 0
			if c.i < c.n {
				c.seg = segmentSize(&c.msgs[c.i])
			}
		}
	}
	return k, nil
}

// segmentSize is the size of each datagram coalesced in m (the UDP_GRO
// control message), or m's whole length when the kernel did not coalesce.
func segmentSize(m *ipv4.Message) int {
	oob := m.OOB[:m.NN]
	for len(oob) > 0 {
		h, body, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			break
		}
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(body) >= 4 {
			if s := int(int32(binary.NativeEndian.Uint32(body))); s > 0 {
				return s
			}
		}
		oob = rest
	}
	return max(m.N, 1)
}
