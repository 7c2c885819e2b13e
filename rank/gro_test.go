//go:build linux

package rank

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// TestGROConnCutsDatagrams sends runs of datagrams with UDP_SEGMENT (one
// system call each, as quic-go sends) and single datagrams to a socket
// read through quicConn, and checks that ReadBatch returns every datagram
// whole, in order, with its sender, in batches smaller than a run.
func TestGROConnCutsDatagrams(t *testing.T) {
	for _, c := range []struct {
		net string
		ip  net.IP
	}{{"udp4", net.IPv4(127, 0, 0, 1)}, {"udp6", net.IPv6loopback}} {
		t.Run(c.net, func(t *testing.T) { testGROConn(t, c.net, c.ip) })
	}
}

func testGROConn(t *testing.T, network string, ip net.IP) {
	udp, err := net.ListenUDP(network, &net.UDPAddr{IP: ip})
	if err != nil {
		t.Skipf("no %s loopback here: %v", network, err)
	}
	defer udp.Close()
	c, _ := quicConn(udp, true)
	gc, ok := c.(*groConn)
	if !ok {
		t.Skip("this kernel does not take UDP_GRO")
	}
	tx, err := net.ListenUDP(network, &net.UDPAddr{IP: ip})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()

	// Each datagram's bytes say which datagram it is and where in it they
	// lie, so a cut in the wrong place or a lost or repeated one shows.
	var want [][]byte
	datagram := func(size int) []byte {
		d := make([]byte, size)
		for i := range d {
			d[i] = byte(len(want)*7 + i)
		}
		want = append(want, d)
		return d
	}
	send := func(seg int, sizes ...int) {
		var b []byte
		for _, s := range sizes {
			b = append(b, datagram(s)...)
		}
		var oob []byte
		if seg > 0 {
			oob = make([]byte, unix.CmsgSpace(2))
			h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
			h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
			h.SetLen(unix.CmsgLen(2))
			binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], uint16(seg))
		}
		if _, _, err := tx.WriteMsgUDP(b, oob, udp.LocalAddr().(*net.UDPAddr)); err != nil {
			t.Fatalf("send %d bytes in segments of %d: %v", len(b), seg, err)
		}
	}
	send(1000, 1000, 1000, 1000, 1000, 1000, 500) // a run with a short last datagram
	send(0, 300)                                  // one datagram, not coalesced
	run := make([]int, 14)
	for i := range run {
		run[i] = 1452
	}
	send(1452, run...) // one of quic-go's GSO sends
	send(0, 1452)
	send(0, 0) // an empty datagram

	ms := make([]ipv4.Message, 3)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, 1452)}
		ms[i].OOB = make([]byte, 128)
	}
	udp.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got [][]byte
	coalesced := false
	for len(got) < len(want) {
		n, err := gc.ReadBatch(ms, 0)
		if err != nil {
			t.Fatalf("after %d of %d datagrams: %v", len(got), len(want), err)
		}
		if n < 1 || n > len(ms) {
			t.Fatalf("ReadBatch returned %d messages for a batch of %d", n, len(ms))
		}
		for _, m := range gc.msgs[:gc.n] {
			coalesced = coalesced || m.N > 1452
		}
		for _, m := range ms[:n] {
			if m.Addr.String() != tx.LocalAddr().String() {
				t.Fatalf("datagram %d from %v, want %v", len(got), m.Addr, tx.LocalAddr())
			}
			got = append(got, append([]byte(nil), m.Buffers[0][:m.N]...))
		}
	}
	if !coalesced {
		t.Error("the kernel never coalesced a run: the test did not exercise the cutting")
	}
	for i := range want {
		if g, w := fmt.Sprintf("%x", got[i]), fmt.Sprintf("%x", want[i]); g != w {
			t.Errorf("datagram %d: got %d bytes, want %d (or the bytes differ)", i, len(got[i]), len(want[i]))
		}
	}
}

// TestQUICGROOption checks Options.QUICGRO (GORUN_QUIC_GRO): "off" gives
// quic-go the socket itself, anything but "auto" or "off" is refused with
// the variable named.
func TestQUICGROOption(t *testing.T) {
	for _, c := range []struct{ env, want, err string }{
		{"", "auto", ""}, {"auto", "auto", ""}, {"off", "off", ""}, {"on", "", "GORUN_QUIC_GRO=\"on\": want auto or off"},
	} {
		o, err := Options{QUICGRO: c.env}.withDefaults()
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("GORUN_QUIC_GRO=%q: error %v, want %q", c.env, err, c.err)
			}
			continue
		}
		if err != nil || o.QUICGRO != c.want {
			t.Errorf("GORUN_QUIC_GRO=%q: %q, %v; want %q", c.env, o.QUICGRO, err, c.want)
		}
	}
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	if c, _ := quicConn(udp, false); c != net.PacketConn(udp) {
		t.Fatalf("GRO off: quicConn returned %T, want the socket", c)
	}
	gc, _ := quicConn(udp, true)
	_, kernelGRO := gc.(*groConn)

	// The transport line says how QUIC receives, and only when QUIC
	// carries the data.
	for _, c := range []struct{ transport, gro, want string }{
		{"quic", "auto", "; datagrams received with UDP_GRO)"},
		{"quic", "off", "; datagrams received one at a time: GORUN_QUIC_GRO=off)"},
		{"tcp", "auto", ""},
	} {
		if c.gro == "auto" && c.transport == "quic" && !kernelGRO {
			c.want = "; datagrams received one at a time: this kernel has no UDP_GRO)"
		}
		for _, tr := range group(t, 2, Options{Transport: c.transport, QUICGRO: c.gro, Timeout: 10 * time.Second}) {
			line := tr.(*Mesh).TransportChoice().String()
			if c.want == "" && strings.Contains(line, "datagrams") || c.want != "" && !strings.HasSuffix(line, c.want) {
				t.Errorf("transport %s, GRO %s: %q, want it to end %q", c.transport, c.gro, line, c.want)
			}
		}
	}
}
