package rank

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
)

// QUIC: accepting and dialing a peer's connections and their streams,
// quic-go's configuration, and the warning about small UDP buffers.

func (m *Mesh) acceptQUIC(errc chan<- error) {
	for {
		conn, err := m.qln.Accept(context.Background())
		if err != nil {
			return
		}
		label := peerLabel(conn.ConnectionState().TLS)
		peer := labelRank(label)
		if peer < 0 || peer >= m.id.Rank {
			m.refuseWrongPeer(conn.RemoteAddr().String(), label)
			conn.CloseWithError(1, "unexpected peer")
			continue
		}
		m.mu.Lock()
		m.conns = append(m.conns, conn)
		m.pconns[peer] = append(m.pconns[peer], conn)
		m.mu.Unlock()
		go func() {
			for {
				st, err := conn.AcceptStream(context.Background())
				if err != nil {
					return
				}
				r, ch, err := readHello(st)
				if err != nil || r != peer {
					conn.CloseWithError(2, "bad hello")
					return
				}
				if err := m.addLane(viaQUIC, r, ch, st); err != nil {
					select {
					case errc <- fmt.Errorf("rank %d: %w", m.id.Rank, err):
					default:
					}
					return
				}
			}
		}()
	}
}

func (m *Mesh) dialQUIC(ctx context.Context, auth *jobAuth, p int, who, addr string) error {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return fmt.Errorf("rank %d: address of %s: %w", m.id.Rank, who, err)
	}
	conns := make([]*quic.Conn, m.opt.ConnsPerPeer)
	for k := range conns {
		c, err := m.qtr.Dial(ctx, ua, auth.clientTLS(), quicConfig(m.opt.Timeout))
		if err != nil {
			return fmt.Errorf("rank %d: cannot connect to %s at %s: %w", m.id.Rank, who, ua, explainHandshake(err))
		}
		if got := labelRank(peerLabel(c.ConnectionState().TLS)); got != p {
			c.CloseWithError(1, "wrong peer")
			return fmt.Errorf("rank %d: cannot connect to %s at %s: it holds this job's secret but its certificate names %q", m.id.Rank, who, ua, peerLabel(c.ConnectionState().TLS))
		}
		conns[k] = c
		m.mu.Lock()
		m.conns = append(m.conns, c)
		m.pconns[p] = append(m.pconns[p], c)
		m.mu.Unlock()
	}
	for ch := 0; ch < m.opt.Channels; ch++ {
		st, err := conns[ch%len(conns)].OpenStreamSync(ctx)
		if err != nil {
			return fmt.Errorf("rank %d: opening channel %d to %s: %w", m.id.Rank, ch, who, err)
		}
		if err := writeHello(st, m.id.Rank, ch); err != nil {
			return fmt.Errorf("rank %d: opening channel %d to %s: %w", m.id.Rank, ch, who, err)
		}
		m.mu.Lock()
		m.sets[viaQUIC][p][ch] = &lane{c: st}
		m.mu.Unlock()
	}
	return nil
}

// quicIdleTimeout is how long a QUIC connection lasts with nothing at all
// from the peer: three times the timeout, past any wait (stall.go), so that
// the waits decide. A live peer answers keep-alives and is never idle.
func quicIdleTimeout(timeout time.Duration) time.Duration { return 3 * timeout }

func quicConfig(timeout time.Duration) *quic.Config {
	return &quic.Config{
		HandshakeIdleTimeout:           min(timeout, 10*time.Second),
		MaxIdleTimeout:                 quicIdleTimeout(timeout),
		KeepAlivePeriod:                keepAlivePeriod(timeout),
		InitialStreamReceiveWindow:     4 << 20,
		MaxStreamReceiveWindow:         32 << 20,
		InitialConnectionReceiveWindow: 8 << 20,
		MaxConnectionReceiveWindow:     128 << 20,
		MaxIncomingStreams:             1024,
	}
}

var udpWarnOnce sync.Once

// quicBufferBytes is the UDP receive buffer quic-go asks for (its own
// warning's figure): below it, bulk QUIC transfers run slower.
const quicBufferBytes = 7500000

// warnUDPBuffers prints udpWarning once per process, with this host's
// net.core.rmem_max.
func (m *Mesh) warnUDPBuffers() {
	b, err := os.ReadFile("/proc/sys/net/core/rmem_max")
	if err != nil {
		return
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return
	}
	if w := m.udpWarning(n); w != "" {
		udpWarnOnce.Do(func() { fmt.Fprintln(os.Stderr, w) })
	}
}

// udpWarning is how to fix small UDP buffers, or "" when it does not
// matter: only a rank that exchanges data with some peer over QUIC (a
// rank on another host, or on this one without shared memory) says it,
// and of those only the lowest rank of its host, where rmem_max is below
// what quic-go asks for. (quic-go's own warning, one from every process,
// is turned off.)
func (m *Mesh) udpWarning(rmemMax int) string {
	if rmemMax >= quicBufferBytes {
		return ""
	}
	quic := false
	for p := range m.id.Size {
		quic = quic || m.PeerTransport(p) == "quic"
	}
	if local := m.localRanks(); !quic || len(local) == 0 || local[0] != m.id.Rank {
		return ""
	}
	return fmt.Sprintf("gorun: warning: rank %d: net.core.rmem_max is %d on %s; QUIC runs slower with UDP buffers under 7.5 MB: sysctl -w net.core.rmem_max=%d net.core.wmem_max=%d",
		m.id.Rank, rmemMax, m.names[m.id.Rank], quicBufferBytes, quicBufferBytes)
}

// oneByOne begins choice.Choice.Receive when the QUIC socket reads one
// datagram at a time; the reason follows.
const oneByOne = "datagrams received one at a time: "
