package rank

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
)

// EnvPortRange pins the ports a job listens on to LO-HI (gorun's
// --port-range): every rank's UDP (QUIC) and TCP (TLS/TCP) port, and the
// rendezvous that gorun or rank 0 serves, so that a firewall between hosts
// can be opened for a known range.
const EnvPortRange = "GORUN_PORT_RANGE"

// PortRange is the ports LO..HI, both included; the zero value is any free
// port the kernel picks.
type PortRange struct{ Lo, Hi int }

// ParsePortRange reads "LO-HI" (1 <= LO <= HI <= 65535; one port is
// P-P); "" is the zero range.
func ParsePortRange(s string) (PortRange, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return PortRange{}, nil
	}
	lo, hi, _ := strings.Cut(s, "-")
	a, errA := strconv.Atoi(strings.TrimSpace(lo))
	b, errB := strconv.Atoi(strings.TrimSpace(hi))
	switch {
	case errA != nil || errB != nil:
		return PortRange{}, fmt.Errorf("%q: want LO-HI, such as 29500-29531", s)
	case a < 1 || b > 65535:
		return PortRange{}, fmt.Errorf("%q: ports go from 1 to 65535", s)
	case a > b:
		return PortRange{}, fmt.Errorf("%q: %d is above %d (want LO-HI with LO <= HI)", s, a, b)
	}
	return PortRange{a, b}, nil
}

// IsZero reports whether r is "any free port".
func (r PortRange) IsZero() bool { return r == PortRange{} }

// Size is the number of ports in r (0 for the zero range).
func (r PortRange) Size() int {
	if r.IsZero() {
		return 0
	}
	return r.Hi - r.Lo + 1
}

func (r PortRange) String() string {
	if r.IsZero() {
		return ""
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

// PortsTakenError says that every port of a range was in use.
type PortsTakenError struct {
	Proto string // "UDP" or "TCP"
	Range PortRange
}

func (e *PortsTakenError) Error() string {
	ports := "ports, all taken"
	if e.Range.Size() == 1 {
		ports = "port, taken"
	}
	return fmt.Sprintf("no free %s port in %s (%d %s)", e.Proto, e.Range, e.Range.Size(), ports)
}

// ListenUDP opens a UDP socket on ip at the first free port of r, in
// order (any free port for the zero range). Several processes on one host
// each get their own port: a port in use is skipped, any other failure is
// returned at once.
func (r PortRange) ListenUDP(ip string) (net.PacketConn, error) {
	var c net.PacketConn
	err := r.each("UDP", func(port string) (err error) {
		c, err = net.ListenPacket("udp", net.JoinHostPort(ip, port))
		return err
	})
	return c, err
}

// ListenTCP is ListenUDP for a TCP listener made by lc.
func (r PortRange) ListenTCP(ctx context.Context, lc net.ListenConfig, ip string) (net.Listener, error) {
	var l net.Listener
	err := r.each("TCP", func(port string) (err error) {
		l, err = lc.Listen(ctx, "tcp", net.JoinHostPort(ip, port))
		return err
	})
	return l, err
}

// each calls listen with each port of r until one is not in use.
func (r PortRange) each(proto string, listen func(port string) error) error {
	if r.IsZero() {
		return listen("0")
	}
	for p := r.Lo; p <= r.Hi; p++ {
		err := listen(strconv.Itoa(p))
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return err
		}
	}
	return &PortsTakenError{Proto: proto, Range: r}
}
