// Package choice is the rule by which auto, the default transport, chooses
// what carries a job's messages between hosts (QUIC or TLS/TCP), and the
// record of the choice a mesh made. Package rank applies the rule at start
// (rank/choose.go: a probe of both); package plan predicts with it. It
// holds no transport code, so that the planner depends on none.
package choice

import (
	"fmt"
	"strings"
)

// AutoTCPMargin is how many times QUIC's probed rate TLS/TCP must move for
// auto to choose it.
const AutoTCPMargin = 1.1

// TCPWins is the rule: TLS/TCP carries the data when it moves more than
// AutoTCPMargin times what QUIC moves (rates in any one unit), else QUIC.
func TCPWins(quicRate, tcpRate float64) bool { return tcpRate > AutoTCPMargin*quicRate }

// Choice says which transport carries the messages between ranks that
// shared memory does not connect, and why.
type Choice struct {
	Transport string // "quic" or "tcp"
	Why       string
	// auto's start-up probe: the rank that rank 0 measured with (-1: no
	// probe), and GB/s each way with both directions busy.
	Peer            int
	QUICGBs, TCPGBs float64
	// Cipher: what seals this rank's TLS/TCP lanes ("AEGIS-128X4",
	// "AES-128-GCM", or both joined with " and " where peers differ);
	// empty unless TLS/TCP carries the data to some peer.
	Cipher string
	// Receive: how this rank's QUIC socket takes datagrams in ("datagrams
	// received with UDP_GRO", or one at a time and why); empty unless QUIC
	// carries the data.
	Receive string
}

func (c Choice) String() string {
	parts := []string{c.Why}
	if c.Cipher != "" {
		parts = append(parts, "records sealed with "+c.Cipher)
	}
	if c.Receive != "" {
		parts = append(parts, c.Receive)
	}
	return fmt.Sprintf("transport %s (%s)", Label(c.Transport), strings.Join(parts, "; "))
}

// Label is a transport's name as messages print it: "TLS/TCP" for "tcp",
// else "QUIC".
func Label(t string) string {
	if t == "tcp" {
		return "TLS/TCP"
	}
	return "QUIC"
}

// Decide is rank 0's choice from the probe with peer (named peerName) and
// its rates each way: TLS/TCP when TCPWins, else QUIC.
func Decide(peer int, peerName string, quicGBs, tcpGBs float64) Choice {
	c := Choice{Transport: "quic", Peer: peer, QUICGBs: quicGBs, TCPGBs: tcpGBs}
	verdict := fmt.Sprintf("within %.0f %% of each other: QUIC", 100*(AutoTCPMargin-1))
	if TCPWins(quicGBs, tcpGBs) {
		c.Transport = "tcp"
		verdict = fmt.Sprintf("TLS/TCP is faster by more than %.0f %%", 100*(AutoTCPMargin-1))
	} else if quicGBs > AutoTCPMargin*tcpGBs {
		verdict = "QUIC is faster"
	}
	c.Why = fmt.Sprintf("auto: start-up probe rank 0 <-> rank %d (%s): TLS/TCP %.3f GB/s, QUIC %.3f GB/s each way; %s",
		peer, peerName, tcpGBs, quicGBs, verdict)
	return c
}
