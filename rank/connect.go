package rank

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/gorun/gorun/internal/aegis"
	"github.com/gorun/gorun/rank/choice"
)

// Joining the job: Connect registers with the rendezvous, listens, accepts
// the lanes of the lower ranks and dials those of the higher ones (each
// lane opens with a hello: its rank and channel), then sets up shared
// memory (shm_setup.go) and auto's choice (choose.go).

// Connect joins the job described by id: it registers with the rendezvous
// (serving it if id.ServeRendezvous), then connects to every other rank.
// A job of size 1 needs no network at all.
func Connect(ctx context.Context, id Identity, opt Options) (*Mesh, error) {
	opt, err := opt.withDefaults()
	if err != nil {
		return nil, err
	}
	m := newMesh(id, opt)
	if id.Size == 1 {
		close(m.ready)
		return m, nil
	}
	if len(id.Secret) == 0 {
		return nil, fmt.Errorf("rank %d: no job secret (set %s)", id.Rank, EnvSecret)
	}
	if id.Rendezvous == "" {
		return nil, fmt.Errorf("rank %d of %d: no rendezvous address (set %s)", id.Rank, id.Size, EnvRendezvous)
	}
	if id.InsecureSecret && id.Rank == 0 {
		fmt.Fprintf(os.Stderr, "gorun: warning: %s is not set; the %s job's peers authenticate with a secret derived from public job information (export %s to every rank for real protection)\n", EnvSecret, id.Launcher, EnvSecret)
	}
	if opt.Transport != "tcp" {
		// quic-go's own buffer warning comes from every process;
		// warnUDPBuffers says it once, where QUIC carries data
		os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	}
	auth, err := newJobAuth(id.Secret, rankLabel(id.Rank))
	if err != nil {
		return nil, err
	}
	if opt.TCPCipher == "auto" && aegis.Available() {
		auth.protos = []string{ALPNAegis, ALPN}
	}
	ctx, cancel := context.WithTimeout(ctx, opt.Timeout)
	defer cancel()

	if id.ServeRendezvous {
		rdvHost, port, _ := net.SplitHostPort(id.Rendezvous)
		listen := net.JoinHostPort("", port)
		if isLoopbackHost(rdvHost) {
			listen = net.JoinHostPort(rdvHost, port)
		}
		m.rdv, err = ListenRendezvous(listen, id.Size, id.Secret)
		if err != nil {
			return nil, fmt.Errorf("rank 0 serves the rendezvous: %w", err)
		}
	}
	fail := func(err error) (*Mesh, error) {
		m.Close()
		return nil, err
	}
	ip, err := listenIP(opt.Iface, id.Rendezvous)
	if err != nil {
		return fail(fmt.Errorf("rank %d on %s: %w", id.Rank, m.names[id.Rank], err))
	}
	addr, err := m.listen(ctx, auth, ip)
	if err != nil {
		return fail(err)
	}
	// Lanes this rank accepts: from every lower rank.
	m.pending = id.Rank
	if m.pending == 0 {
		close(m.ready)
	}
	acceptErr := make(chan error, 1)
	m.acceptLoop(auth, acceptErr)

	tbl, err := register(ctx, id.Rendezvous, auth, registration{
		Rank: id.Rank, Size: id.Size, Addr: addr, Host: m.hosts[id.Rank], Name: m.names[id.Rank], Job: id.JobID,
	}, opt.Timeout)
	if err != nil {
		return fail(fmt.Errorf("rank %d: %w", id.Rank, err))
	}
	m.addrs = tbl.Addrs
	copy(m.hosts, tbl.Hosts)
	copy(m.names, tbl.Names)
	scheme := opt.Transport + "://"
	for r, a := range tbl.Addrs {
		if !strings.HasPrefix(a, scheme) {
			return fail(fmt.Errorf("rank %d uses transport %s but rank %d uses %s: set %s the same on every rank", id.Rank, opt.Transport, r, strings.SplitN(a, ":", 2)[0], EnvTransport))
		}
	}
	if err := m.dialHigher(ctx, auth); err != nil {
		return fail(err)
	}
	select {
	case <-m.ready:
	case err := <-acceptErr:
		return fail(err)
	case <-ctx.Done():
		return fail(fmt.Errorf("rank %d: %s did not connect within %s%s", id.Rank, m.describeMissing(), opt.Timeout, m.refused.summary()))
	}
	if err := m.setupShm(ctx); err != nil {
		return fail(err)
	}
	if m.qtr != nil {
		m.startLiveness()
	}
	if opt.Transport == "auto" {
		if err := m.choose(ctx); err != nil {
			return fail(err)
		}
	}
	m.warnUDPBuffers()
	return m, nil
}

// newMesh is a mesh not yet connected: its lane tables for the transports
// opt allows, and the transport it starts on.
func newMesh(id Identity, opt Options) *Mesh {
	m := &Mesh{
		id: id, opt: opt, ready: make(chan struct{}), closed: make(chan struct{}),
		count: make([]peerCounters, id.Size),
	}
	for v, name := range viaNames {
		if opt.Transport == "auto" || opt.Transport == name {
			m.sets[v] = make([][]*lane, id.Size)
			for p := range m.sets[v] {
				m.sets[v][p] = make([]*lane, opt.Channels)
			}
		}
	}
	m.choice = choice.Choice{Transport: opt.Transport, Peer: -1, Why: "set with " + EnvTransport}
	if opt.Transport == "auto" {
		m.choice = choice.Choice{Transport: "quic", Peer: -1, Why: "auto: not chosen yet"} // until choose
	}
	m.lanes = m.sets[viaOf(m.choice.Transport)]
	m.pconns = make([][]*quic.Conn, id.Size)
	m.links = make([]link, id.Size)
	for p := range m.links {
		if p != id.Rank {
			m.links[p] = sockets{m: m, peer: p}
		}
	}
	m.hosts = make([]string, id.Size)
	m.names = make([]string, id.Size)
	m.hosts[id.Rank] = hostKey()
	m.names[id.Rank] = hostName(id)
	return m
}

// listen opens the UDP port (QUIC) and the TCP port (TLS/TCP) of the
// transports the mesh may use, on ip, and returns the address this rank
// registers: quic://udp, tcp://tcp or auto://udp,tcp.
func (m *Mesh) listen(ctx context.Context, auth *jobAuth, ip string) (string, error) {
	var addrs []string
	var err error
	if m.sets[viaQUIC] != nil {
		m.udp, err = m.opt.Ports.ListenUDP(ip)
		if err != nil {
			return "", m.listenError(ip, err)
		}
		var conn net.PacketConn
		conn, m.quicReceive = quicConn(m.udp, m.opt.QUICGRO == "auto")
		m.qtr = &quic.Transport{Conn: conn}
		m.qln, err = m.qtr.Listen(auth.serverTLS(&m.refused), quicConfig(m.opt.Timeout))
		if err != nil {
			return "", err
		}
		addrs = append(addrs, m.udp.LocalAddr().String())
	}
	if m.sets[viaTCP] != nil {
		lc := net.ListenConfig{Control: sizeTCPBuffers} // accepted connections inherit them
		m.tln, err = m.opt.Ports.ListenTCP(ctx, lc, ip)
		if err != nil {
			return "", m.listenError(ip, err)
		}
		addrs = append(addrs, m.tln.Addr().String())
	}
	return m.opt.Transport + "://" + strings.Join(addrs, ","), nil
}

// listenError is a failure to listen, naming the rank and its host; a
// range with no free port says to widen it.
func (m *Mesh) listenError(ip string, err error) error {
	var taken *PortsTakenError
	if errors.As(err, &taken) {
		return fmt.Errorf("rank %d on %s: %w: widen --port-range (%s)", m.id.Rank, m.names[m.id.Rank], err, EnvPortRange)
	}
	return fmt.Errorf("rank %d on %s: cannot listen on %s: %w", m.id.Rank, m.names[m.id.Rank], ip, err)
}

// dialHigher connects to every higher rank at once and returns the first
// failure.
func (m *Mesh) dialHigher(ctx context.Context, auth *jobAuth) error {
	var wg sync.WaitGroup
	errs := make(chan error, m.id.Size)
	for p := m.id.Rank + 1; p < m.id.Size; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			if err := m.dialPeer(ctx, auth, p); err != nil {
				errs <- err
			}
		}(p)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (m *Mesh) describeMissing() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var miss []int
	for p := 0; p < m.id.Rank; p++ {
		for _, l := range m.lanes[p] {
			if l == nil {
				miss = append(miss, p)
				break
			}
		}
	}
	if len(miss) == 0 {
		return "no rank"
	}
	s := List(miss)
	if len(miss) == 1 && m.names[miss[0]] != "" {
		s += " (" + m.names[miss[0]] + ")"
	}
	return s
}

// addLane records an incoming lane of transport v; when it completes the
// lanes from a lower rank (every channel of every transport connected), it
// counts that peer as connected.
func (m *Mesh) addLane(v, peer, ch int, c laneConn) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if peer < 0 || peer >= m.id.Size || ch < 0 || ch >= m.opt.Channels {
		return fmt.Errorf("peer %d channel %d out of range", peer, ch)
	}
	if m.sets[v] == nil {
		return fmt.Errorf("rank %d opened a %s lane after the transport was chosen", peer, viaNames[v])
	}
	if m.sets[v][peer][ch] != nil {
		return fmt.Errorf("rank %d opened %s channel %d twice", peer, viaNames[v], ch)
	}
	m.sets[v][peer][ch] = &lane{c: c}
	if peer < m.id.Rank {
		full := true
		for _, set := range m.sets {
			if set == nil {
				continue
			}
			for _, l := range set[peer] {
				if l == nil {
					full = false
				}
			}
		}
		if full {
			m.pending--
			if m.pending == 0 {
				close(m.ready)
			}
		}
	}
	return nil
}

func writeHello(w io.Writer, rank, ch int) error {
	var b [8]byte
	binary.LittleEndian.PutUint32(b[0:], helloMagic)
	binary.LittleEndian.PutUint16(b[4:], uint16(rank))
	binary.LittleEndian.PutUint16(b[6:], uint16(ch))
	_, err := w.Write(b[:])
	return err
}

func readHello(r laneConn) (rank, ch int, err error) {
	var b [8]byte
	r.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, 0, err
	}
	r.SetReadDeadline(time.Time{})
	if binary.LittleEndian.Uint32(b[0:]) != helloMagic {
		return 0, 0, errors.New("bad hello")
	}
	return int(binary.LittleEndian.Uint16(b[4:])), int(binary.LittleEndian.Uint16(b[6:])), nil
}

// acceptLoop accepts the lanes of lower ranks on every listener.
func (m *Mesh) acceptLoop(auth *jobAuth, errc chan<- error) {
	if m.qln != nil {
		go m.acceptQUIC(errc)
	}
	if m.tln != nil {
		go m.acceptTCP(auth, errc)
	}
}

// refuseWrongPeer records a connection from a holder of the job secret
// that is not a rank that connects to this one (the ranks below it do).
func (m *Mesh) refuseWrongPeer(from, label string) {
	m.refused.add(&authError{by: rankLabel(m.id.Rank), from: from, reason: wrongPeer,
		msg: fmt.Sprintf("it holds this job's secret but its certificate names %q, not one of the ranks that connect to rank %d (those below it)", label, m.id.Rank)})
}

// dialPeer opens every lane of every transport to the higher rank p.
func (m *Mesh) dialPeer(ctx context.Context, auth *jobAuth, p int) error {
	addrs := strings.Split(m.addrs[p][strings.Index(m.addrs[p], "://")+3:], ",")
	if len(addrs) != m.transports() {
		return fmt.Errorf("rank %d: rank %d registered %q: want %d addresses", m.id.Rank, p, m.addrs[p], m.transports())
	}
	who := fmt.Sprintf("rank %d (%s)", p, m.names[p])
	if m.sets[viaQUIC] != nil {
		if err := m.dialQUIC(ctx, auth, p, who, addrs[0]); err != nil {
			return err
		}
		addrs = addrs[1:]
	}
	if m.sets[viaTCP] != nil {
		return m.dialTCP(ctx, auth, p, who, addrs[0])
	}
	return nil
}

// transports is how many transports this mesh connects (auto: two).
func (m *Mesh) transports() int {
	n := 0
	for _, set := range m.sets {
		if set != nil {
			n++
		}
	}
	return n
}
