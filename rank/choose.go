package rank

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/rank/choice"
)

// How "auto" (the default transport) chooses between QUIC and TLS/TCP.
//
// Both are connected to every peer, with the same job-secret
// authentication. When all ranks share one host, QUIC carries what shared
// memory does not. When the job spans hosts, rank 0 and the lowest rank on
// another host measure each transport over all channels, both directions
// at once (up to probeBytes each way or probeTime, whichever comes first;
// QUIC, TLS/TCP, QUIC, TLS/TCP, the better round of each, so that neither
// is judged on its cold start alone), and rank 0 tells every rank its
// choice: TLS/TCP when it moved more than choice.AutoTCPMargin times what
// QUIC moved, else QUIC (package choice holds the rule, for package plan
// too). Where both fill the link they measure alike, and QUIC
// filled it better in allreduces (96 % of a 1 Gbit/s link against 88-94 %
// for TLS/TCP, whose tree at np 2 lost most: TestAllreduceShapedLink). The other transport's TCP
// connections close; its QUIC connections stay open in any case, because
// their keep-alives tell a live peer from a frozen one (stall.go) whichever
// transport carries the data.
//
// On the test hosts of docs/multihost.md QUIC moved 0.2-0.3 GB/s per peer
// pair on 2 cores where TLS/TCP moved 0.5-0.8 (docs/performance.md): above
// about 1 Gbit/s the probe picks TLS/TCP; at 1 Gbit/s both fill the link.

// TransportChoice is which transport this mesh's socket lanes use, and why.
func (m *Mesh) TransportChoice() choice.Choice {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.choice
	if c.Transport != "tcp" {
		c.Receive = m.quicReceive
		return c
	}
	var names []string
	for _, ls := range m.sets[viaTCP] {
		for _, l := range ls {
			if l == nil {
				continue
			}
			if sc, ok := l.c.(*sealedConn); ok && !slices.Contains(names, sc.out.cipher.name) {
				names = append(names, sc.out.cipher.name)
			}
		}
	}
	slices.Sort(names)
	c.Cipher = strings.Join(names, " and ")
	return c
}

// The transports a mesh can connect, as indexes of Mesh.sets.
const (
	viaQUIC = 0
	viaTCP  = 1
)

var viaNames = [2]string{"quic", "tcp"}

func viaOf(name string) int {
	if name == "tcp" {
		return viaTCP
	}
	return viaQUIC
}

const (
	chooseKind = 0xFFF1 // tags the probe's and the decision's messages (no collective uses it)
	probeBytes = 64 << 20
	probeMsg   = 1 << 20
	probeTime  = 500 * time.Millisecond
	probeRuns  = 2 // rounds per transport
)

// probePeer is the lowest rank on another host than rank 0's, or -1.
func probePeer(hosts []string) int {
	for p := 1; p < len(hosts); p++ {
		if hosts[p] != hosts[0] {
			return p
		}
	}
	return -1
}

// choose runs auto's choice on every rank (after the lanes of both
// transports and shared memory are up) and makes the chosen lanes the ones
// Send and Recv use.
func (m *Mesh) choose(ctx context.Context) error {
	p := probePeer(m.hosts)
	if p < 0 {
		m.use(choice.Choice{Transport: "quic", Peer: -1, Why: "auto: all ranks on one host"})
		return nil
	}
	var rates [2]float64
	if me := m.id.Rank; me == 0 || me == p {
		other := p
		if me == p {
			other = 0
		}
		for round := 0; round < probeRuns; round++ {
			for v := range m.sets {
				r, err := m.probe(ctx, v, other, round)
				if err != nil {
					return fmt.Errorf("rank %d: transport probe with rank %d over %s: %w", me, other, choice.Label(viaNames[v]), err)
				}
				rates[v] = max(rates[v], r)
			}
		}
	}
	// rank 0's rates go to every rank, which decides from them as rank 0
	// does: the same bits, the same choice
	tag := Tag{Kind: chooseKind, Aux: 2} // not a probe's (Aux: the transport probed)
	var msg [16]byte
	if m.id.Rank == 0 {
		binary.LittleEndian.PutUint64(msg[0:], math.Float64bits(rates[viaQUIC]))
		binary.LittleEndian.PutUint64(msg[8:], math.Float64bits(rates[viaTCP]))
		for r := 1; r < m.id.Size; r++ {
			if err := m.Send(ctx, r, 0, tag, msg[:]); err != nil {
				return fmt.Errorf("rank 0: telling rank %d the probe's rates: %w", r, err)
			}
		}
	} else if err := m.Recv(ctx, 0, 0, tag, msg[:]); err != nil {
		return fmt.Errorf("rank %d: waiting for rank 0's probe of the transports: %w", m.id.Rank, err)
	}
	m.use(choice.Decide(p, m.names[p], math.Float64frombits(binary.LittleEndian.Uint64(msg[0:])), math.Float64frombits(binary.LittleEndian.Uint64(msg[8:]))))
	return nil
}

// use makes c's lanes carry the data and closes the TCP lanes if they lost.
func (m *Mesh) use(c choice.Choice) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.choice = c
	m.lanes = m.sets[viaOf(c.Transport)]
	if c.Transport == "tcp" || m.sets[viaTCP] == nil {
		return
	}
	for _, ls := range m.sets[viaTCP] {
		for _, l := range ls {
			if l != nil {
				l.c.Close()
			}
		}
	}
	m.sets[viaTCP] = nil
}

// probe measures transport v with peer (round: which time): every channel sends probeMsg
// messages and receives the peer's at the same time, until probeBytes
// went each way or probeTime passed; it returns the GB/s received. A
// message's first byte is 1 on the last one.
func (m *Mesh) probe(ctx context.Context, v, peer, round int) (float64, error) {
	nch := m.opt.Channels
	perCh := max(1, probeBytes/probeMsg/nch)
	start := time.Now()
	var mu sync.Mutex
	var firstErr error
	var received int
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for ch := 0; ch < nch; ch++ {
		l := m.sets[v][peer][ch]
		wg.Add(2)
		go func() {
			defer wg.Done()
			buf := make([]byte, probeMsg)
			for i := 0; i < perCh; i++ {
				last := i == perCh-1 || time.Since(start) > probeTime
				buf[0] = 0
				if last {
					buf[0] = 1
				}
				if err := m.sendOn(ctx, l, peer, ch, Tag{Kind: chooseKind, Aux: uint16(v), Seq: uint64(round), Chunk: uint32(i)}, buf, false); err != nil {
					fail(err)
					return
				}
				if last {
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			buf := make([]byte, probeMsg)
			for i := 0; ; i++ {
				if err := m.recvOn(ctx, l, peer, ch, Tag{Kind: chooseKind, Aux: uint16(v), Seq: uint64(round), Chunk: uint32(i)}, buf); err != nil {
					fail(err)
					return
				}
				mu.Lock()
				received += len(buf)
				mu.Unlock()
				if buf[0] == 1 {
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(received) / time.Since(start).Seconds() / 1e9, nil
}
