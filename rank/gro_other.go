//go:build !linux

package rank

import "net"

// quicConn returns udp: UDP_GRO is Linux's.
func quicConn(udp net.PacketConn, gro bool) (net.PacketConn, string) {
	if !gro {
		return udp, oneByOne + EnvQUICGRO + "=off"
	}
	return udp, oneByOne + "UDP_GRO is Linux's"
}
