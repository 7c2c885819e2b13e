package rank

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/aegis"
)

// Options configures a Mesh. The zero value picks the defaults.
type Options struct {
	// Transport is what carries messages between ranks that shared memory
	// does not connect: "auto" (default), "quic" or "tcp" (TLS over TCP).
	// Both are encrypted and authenticated with the job secret. "auto"
	// connects both; when the job spans hosts, a start-up probe between
	// rank 0 and the first rank on another host measures each, and the
	// faster carries the data (choose.go); on one host it is QUIC. Every
	// rank of a job must use the same setting. Env: GORUN_TRANSPORT.
	Transport string
	// Iface is the address (or interface name, or list: IfaceSpec) to
	// listen on and advertise. Default: the local address that routes to
	// the rendezvous. Env: GORUN_IFACE.
	Iface string
	// Ports is where the UDP (QUIC) and TCP (TLS/TCP) ports are taken
	// from, the first free of each. (The rendezvous that rank 0 serves
	// under a foreign launcher is on the port its address names.)
	// Default: any free port. Env: GORUN_PORT_RANGE.
	Ports PortRange
	// ConnsPerPeer stripes the channels to one peer over this many QUIC
	// connections (one quic-go connection is driven by one goroutine and
	// tops out near 0.3 GB/s here; more connections use more cores).
	// Env: GORUN_CONNS_PER_PEER. Default 2.
	ConnsPerPeer int
	// Channels is the number of independent ordered lanes per peer.
	// Default: max(2, ConnsPerPeer).
	Channels int
	// Timeout bounds every wait: rendezvous, connecting, and each Send or
	// Recv that makes no progress (a wait for a live peer lasts up to twice
	// as long; stall.go). It also sets the QUIC keep-alive period (an
	// eighth of it, at most 2s) and idle timeout (three times it). Env:
	// GORUN_TIMEOUT (Go duration). Default 60s.
	Timeout time.Duration
	// SharedMemory: ranks on the same host exchange messages through
	// shared-memory rings instead of sockets (docs/shm.md). "" or "auto"
	// follows GORUN_SHM (default on); "on" or "off" overrides it.
	// LoopbackGroup turns it off unless asked, to keep testing sockets.
	SharedMemory string
	// TCPCipher seals the TLS/TCP lanes' records: "auto" (default)
	// seals with AEGIS-128X4 between two ranks whose CPUs have VAES on
	// AVX-512, else with AES-128-GCM; "aes-gcm" always with AES-128-GCM
	// (sealed.go). Ranks may differ: each lane takes what both ends
	// offer. Env: GORUN_TCP_CIPHER.
	TCPCipher string
	// QUICGRO: "auto" (default) receives QUIC's datagrams with UDP_GRO
	// where the kernel has it (gro.go: a run of datagrams from one sender
	// comes in one buffer); "off" reads them one by one, as quic-go does
	// on its own. Ranks may differ. Env: GORUN_QUIC_GRO.
	QUICGRO string
}

// autoOr sets an option left empty from the environment variable env, or
// to "auto", and refuses anything but "auto" and other.
func autoOr(v *string, env, other string) error {
	if *v == "" {
		*v = os.Getenv(env)
	}
	if *v == "" {
		*v = "auto"
	}
	if *v != "auto" && *v != other {
		return fmt.Errorf("%s=%q: want auto or %s", env, *v, other)
	}
	return nil
}

func (o Options) withDefaults() (Options, error) {
	if o.Transport == "" {
		o.Transport = os.Getenv(EnvTransport)
	}
	if o.Transport == "" {
		o.Transport = "auto"
	}
	if o.Transport != "auto" && o.Transport != "quic" && o.Transport != "tcp" {
		return o, fmt.Errorf("unknown transport %q (want auto, quic or tcp; from %s or options)", o.Transport, EnvTransport)
	}
	if o.Iface == "" {
		o.Iface = os.Getenv(EnvIface)
	}
	if o.Ports.IsZero() {
		pr, err := ParsePortRange(os.Getenv(EnvPortRange))
		if err != nil {
			return o, fmt.Errorf("%s=%w", EnvPortRange, err)
		}
		o.Ports = pr
	}
	if err := autoOr(&o.TCPCipher, EnvTCPCipher, "aes-gcm"); err != nil {
		return o, err
	}
	if err := autoOr(&o.QUICGRO, EnvQUICGRO, "off"); err != nil {
		return o, err
	}
	if o.ConnsPerPeer == 0 {
		if v := os.Getenv(EnvConns); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 64 {
				return o, fmt.Errorf("%s=%q: want an integer from 1 to 64", EnvConns, v)
			}
			o.ConnsPerPeer = n
		}
	}
	if o.ConnsPerPeer <= 0 {
		o.ConnsPerPeer = 2
	}
	if o.Channels <= 0 {
		o.Channels = max(2, o.ConnsPerPeer)
	}
	if o.Channels > 256 {
		return o, fmt.Errorf("%d channels per peer is too many (max 256)", o.Channels)
	}
	if o.Timeout == 0 {
		if v := os.Getenv(EnvTimeout); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return o, fmt.Errorf("%s=%q: want a positive Go duration such as 60s", EnvTimeout, v)
			}
			o.Timeout = d
		}
	}
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
	if _, err := shmEnabled(o.SharedMemory); err != nil {
		return o, err
	}
	return o, nil
}

// frame header: magic, seq, kind, aux, chunk, length.
const (
	frameMagic  = 0x4752554e // "GRUN"
	headerBytes = 24
	helloMagic  = 0x47524c4f // "GRLO"
	maxFrame    = 1 << 31
)

// laneConn is one ordered duplex byte stream to a peer (a QUIC stream or a
// TLS-over-TCP connection).
type laneConn interface {
	io.Reader
	io.Writer
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
	Close() error
}

type lane struct {
	c    laneConn
	rmu  sync.Mutex
	wmu  sync.Mutex
	dmu  sync.Mutex   // orders deadline changes: a wait's extension, a cancelled context's and Close's cut
	rw   laneWait     // the Recv in progress (under rmu)
	ww   laneWait     // the Send in progress (under wmu)
	cut  [2]laneCut   // [write]: the cut armed on the latest wait's context (under dmu)
	dl   [2]time.Time // [write]: the deadline last set (under dmu)
	rh   [headerBytes]byte
	wh   [headerBytes]byte
	wbuf []byte // header and a small payload, written at once
}

// laneCut cuts one direction's wait short when its context is done. It
// is armed once per context (context.AfterFunc), not once per wait: a
// collective's call sends and receives all its messages under one, and
// arming and disarming for each message was 2-3 % of a rank's CPU at 1
// MiB, np 2 (docs/performance.md). It stays armed after the wait, until
// a wait under another context replaces it; when its context ends
// between waits it cuts nothing.
type laneCut struct {
	done <-chan struct{} // the context's Done: contexts that share it end together
	stop func() bool
	busy bool // a wait under it is in progress
}

// coalesceBytes is the largest payload that Send copies behind its header
// into one write: one QUIC packet or TLS record, and one wake-up of the
// connection's sender, instead of two for the header and the payload.
// Larger payloads are written from the caller's buffer, where a separate
// 24-byte header costs nothing measurable.
const coalesceBytes = 16 << 10

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
	lanes   [][]*lane       // [peer][channel]: the lanes that carry data (one of sets)
	sets    [2][][]*lane    // [viaQUIC or viaTCP][peer][channel]; nil for a transport not connected
	choice  TransportChoice // which transport the lanes are, and why
	ready   chan struct{}
	pending int
	mu      sync.Mutex
	count   []peerCounters
	hosts   []string
	names   []string
	addrs   []string

	udp net.PacketConn
	qtr *quic.Transport
	// quicReceive says how udp takes datagrams in (TransportChoice.Receive).
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
	shm         []*shmPeer  // [peer]: non-nil for peers reached through shared memory
	grp         *LocalGroup // this host's group segment, if mapped (shmgroup.go)
	grpMu       sync.Mutex
	grpDone     bool
	grpOK       *LocalGroup
	refused     refusals // connections the accept loop turned away
}

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
			return nil, fmt.Errorf("rank 0 serves the rendezvous: %v", err)
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
		return fail(fmt.Errorf("rank %d: %v", id.Rank, err))
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
	m.choice = TransportChoice{Transport: opt.Transport, Peer: -1, Why: "set with " + EnvTransport}
	if opt.Transport == "auto" {
		m.choice = TransportChoice{Transport: "quic", Peer: -1, Why: "auto: not chosen yet"} // until choose
	}
	m.lanes = m.sets[viaOf(m.choice.Transport)]
	m.pconns = make([][]*quic.Conn, id.Size)
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
	s := rankList(miss)
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
					case errc <- fmt.Errorf("rank %d: %v", m.id.Rank, err):
					default:
					}
					return
				}
			}
		}()
	}
}

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
				case errc <- fmt.Errorf("rank %d: %v", m.id.Rank, err):
				default:
				}
			}
		}()
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

func (m *Mesh) dialQUIC(ctx context.Context, auth *jobAuth, p int, who, addr string) error {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return fmt.Errorf("rank %d: address of %s: %v", m.id.Rank, who, err)
	}
	conns := make([]*quic.Conn, m.opt.ConnsPerPeer)
	for k := range conns {
		c, err := m.qtr.Dial(ctx, ua, auth.clientTLS(), quicConfig(m.opt.Timeout))
		if err != nil {
			return fmt.Errorf("rank %d: cannot connect to %s at %s: %v", m.id.Rank, who, ua, explainHandshake(err))
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
			return fmt.Errorf("rank %d: opening channel %d to %s: %v", m.id.Rank, ch, who, err)
		}
		if err := writeHello(st, m.id.Rank, ch); err != nil {
			return fmt.Errorf("rank %d: opening channel %d to %s: %v", m.id.Rank, ch, who, err)
		}
		m.mu.Lock()
		m.sets[viaQUIC][p][ch] = &lane{c: st}
		m.mu.Unlock()
	}
	return nil
}

// dialTCP opens p's TLS/TCP lanes.
func (m *Mesh) dialTCP(ctx context.Context, auth *jobAuth, p int, who, ta string) error {
	for ch := 0; ch < m.opt.Channels; ch++ {
		d := net.Dialer{Control: sizeTCPBuffers}
		c, err := d.DialContext(ctx, "tcp", ta)
		if err != nil {
			return fmt.Errorf("rank %d: cannot connect to %s at %s: %v", m.id.Rank, who, ta, err)
		}
		tc := tls.Client(&recordReader{Conn: c}, auth.clientTLS())
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return fmt.Errorf("rank %d: cannot connect to %s at %s: %v", m.id.Rank, who, ta, explainHandshake(err))
		}
		if got := labelRank(peerLabel(tc.ConnectionState())); got != p {
			tc.Close()
			return fmt.Errorf("rank %d: cannot connect to %s at %s: it holds this job's secret but its certificate names %q", m.id.Rank, who, ta, peerLabel(tc.ConnectionState()))
		}
		if err := writeHello(tc, m.id.Rank, ch); err != nil {
			tc.Close()
			return fmt.Errorf("rank %d: opening channel %d to %s: %v", m.id.Rank, ch, who, err)
		}
		sc, err := sealLane(tc, c, true)
		if err != nil {
			c.Close()
			return fmt.Errorf("rank %d: opening channel %d to %s: %v", m.id.Rank, ch, who, err)
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
		return fmt.Errorf("socket buffers: %v", err)
	}
	return nil
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

func (m *Mesh) lane(peer, ch int, op string) (*lane, error) {
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
	return m.lanes[peer][ch], nil
}

// laneWait runs the deadlines of one Send or Recv on a socket lane: while
// bytes move the deadline moves with them; when none have moved for the
// timeout, judge (stall.go) decides whether the wait goes on.
type laneWait struct {
	m       *Mesh
	l       *lane
	ctx     context.Context
	peer    int
	write   bool
	timeout time.Duration
	last    time.Time // the last progress (or the start)
	cut     *laneCut
}

// startWait begins a Send's or Recv's wait on l; w.end ends it.
func (m *Mesh) startWait(ctx context.Context, l *lane, peer int, write bool) *laneWait {
	w, c := &l.rw, &l.cut[side(write)]
	if write {
		w = &l.ww
	}
	*w = laneWait{m: m, l: l, ctx: ctx, peer: peer, write: write, timeout: timeoutFrom(ctx, m.opt.Timeout), last: time.Now(), cut: c}
	done := ctx.Done()
	l.dmu.Lock()
	if c.done != done {
		if c.stop != nil {
			c.stop()
		}
		*c = laneCut{done: done}
		if done != nil {
			c.stop = context.AfterFunc(ctx, func() {
				l.dmu.Lock()
				if c.done == done && c.busy { // a wait under this context, not another's
					setDeadline(l, write, time.Unix(1, 0))
				}
				l.dmu.Unlock()
			})
		}
	}
	c.busy = true
	l.dmu.Unlock()
	w.extend(w.last.Add(w.timeout), true)
	return w
}

// end ends the wait: a cut for its context no longer touches the lane.
func (w *laneWait) end() {
	w.l.dmu.Lock()
	w.cut.busy = false
	w.l.dmu.Unlock()
}

// side indexes a lane's per-direction state: 0 receiving, 1 sending.
func side(write bool) int {
	if write {
		return 1
	}
	return 0
}

// setDeadline sets a direction's deadline; the caller holds l.dmu.
func setDeadline(l *lane, write bool, t time.Time) {
	l.dl[side(write)] = t
	if write {
		l.c.SetWriteDeadline(t)
	} else {
		l.c.SetReadDeadline(t)
	}
}

// extend sets the deadline to t, unless the context is done or the mesh
// closed (whose cut it must not undo); it reports whether it did. With
// keep (a wait's start), a deadline an earlier wait set at most a
// sixteenth of the timeout before t stays: when it passes, expired
// extends it (without keep). Setting it for every message cost about 1 %
// of a rank's CPU at 1 MiB.
func (w *laneWait) extend(t time.Time, keep bool) bool {
	w.l.dmu.Lock()
	defer w.l.dmu.Unlock()
	ok := w.ctx.Err() == nil
	select {
	case <-w.m.closed:
		ok = false
	default:
	}
	if !ok {
		t = time.Unix(1, 0)
	}
	d := w.l.dl[side(w.write)]
	if keep && ok && !d.After(t) && t.Sub(d) < w.timeout/16 {
		return true
	}
	setDeadline(w.l, w.write, t)
	return ok
}

// expired handles err from a Read or Write: nil if the wait goes on.
func (w *laneWait) expired(err error) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) || w.ctx.Err() != nil {
		return err
	}
	idle := time.Since(w.last)
	next, serr := w.m.judge(w.peer, idle, w.timeout)
	if serr != nil {
		return serr
	}
	if !w.extend(time.Now().Add(next), false) {
		return err
	}
	return nil
}

func (w *laneWait) readFull(b []byte) error { return w.whole(b, w.l.c.Read) }

func (w *laneWait) writeAll(b []byte) error { return w.whole(b, w.l.c.Write) }

// whole reads or writes all of b, each byte moved extending the wait.
func (w *laneWait) whole(b []byte, move func([]byte) (int, error)) error {
	for len(b) > 0 {
		n, err := move(b)
		if n > 0 {
			b = b[n:]
			w.last = time.Now()
		}
		if err != nil && len(b) > 0 {
			if err = w.expired(err); err != nil {
				return err
			}
		}
	}
	return nil
}

// flusher is a lane connection that gathers writes until Flush
// (sealedConn).
type flusher interface {
	Flush() (bool, error)
}

// flush is writeAll for what a gathering lane holds.
func (w *laneWait) flush(f flusher) error {
	for {
		moved, err := f.Flush()
		if moved {
			w.last = time.Now()
		}
		if err == nil {
			return nil
		}
		if err = w.expired(err); err != nil {
			return err
		}
	}
}

// discard reads and drops n bytes.
func (w *laneWait) discard(n int) error {
	buf := make([]byte, min(n, 64<<10))
	for n > 0 {
		k := min(n, len(buf))
		if err := w.readFull(buf[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

func (m *Mesh) ioError(ctx context.Context, op string, peer, ch int, tag Tag, err error, w *laneWait) error {
	pe := &PeerError{Self: m.id.Rank, Peer: peer, Host: m.names[peer], Op: op}
	closed := false
	select {
	case <-m.closed:
		closed = true
	default:
	}
	var se *stallError
	var it *quic.IdleTimeoutError
	switch {
	case ctx.Err() != nil:
		err = ctx.Err()
	case errors.As(err, &se):
		pe.Waited = se.waited
		err = fmt.Errorf("%w (channel %d, %v)", se, ch, tag)
	case closed:
		err = errClosed
	case errors.As(err, &it):
		// The connection itself gave up: nothing came from the peer, not
		// even an answer to a keep-alive, for the QUIC idle timeout.
		pe.Waited = time.Since(w.last)
		err = &stallError{waited: pe.Waited, msg: fmt.Sprintf("waited %s (timeout %s): rank %d sent nothing for %s, not even keep-alives, and the QUIC connection timed out (stopped, dead or cut off; channel %d, %v)",
			round(pe.Waited), w.timeout, peer, quicIdleTimeout(m.opt.Timeout), ch, tag)}
	case errors.Is(err, os.ErrDeadlineExceeded):
		pe.Waited = time.Since(w.last)
		err = fmt.Errorf("%w (channel %d, %v)", unknownStall(pe.Waited, w.timeout), ch, tag)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		err = fmt.Errorf("rank %d closed the connection (channel %d, %v)", peer, ch, tag)
	default:
		err = fmt.Errorf("%v (channel %d, %v)", err, ch, tag)
	}
	pe.Err = err
	return pe
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
	l, err := m.lane(peer, ch, "send")
	if err != nil {
		return err
	}
	if len(payload) >= maxFrame {
		return fmt.Errorf("rank %d: send to rank %d: message of %d bytes exceeds the 2 GiB frame limit", m.id.Rank, peer, len(payload))
	}
	if sp := m.shmPeer(peer); sp != nil {
		return sp.send(ctx, ch, tag, payload)
	}
	return m.sendOn(ctx, l, peer, ch, tag, payload, more)
}

// sendOn writes one framed message on the socket lane l to peer; with
// more, what the lane gathers (sealedConn) is left for the next.
func (m *Mesh) sendOn(ctx context.Context, l *lane, peer, ch int, tag Tag, payload []byte, more bool) (err error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	putHeader(l.wh[:], tag, len(payload))
	w := m.startWait(ctx, l, peer, true)
	defer w.end()
	if len(payload) <= coalesceBytes {
		l.wbuf = append(append(l.wbuf[:0], l.wh[:]...), payload...)
		err = w.writeAll(l.wbuf)
	} else if err = w.writeAll(l.wh[:]); err == nil {
		err = w.writeAll(payload)
	}
	if f, ok := l.c.(flusher); ok && err == nil && !more {
		err = w.flush(f)
	}
	if err != nil {
		return m.ioError(ctx, "send", peer, ch, tag, err, w)
	}
	m.count[peer].sent.Add(uint64(headerBytes + len(payload)))
	return nil
}

// Recv implements Transport.
func (m *Mesh) Recv(ctx context.Context, peer, ch int, want Tag, dst []byte) error {
	l, err := m.lane(peer, ch, "recv")
	if err != nil {
		return err
	}
	if sp := m.shmPeer(peer); sp != nil {
		return sp.recvMsg(ctx, ch, want, dst)
	}
	return m.recvOn(ctx, l, peer, ch, want, dst)
}

// recvOn reads one framed message from the socket lane l of peer.
func (m *Mesh) recvOn(ctx context.Context, l *lane, peer, ch int, want Tag, dst []byte) error {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	w := m.startWait(ctx, l, peer, false)
	defer w.end()
	if err := w.readFull(l.rh[:]); err != nil {
		return m.ioError(ctx, "recv", peer, ch, want, err, w)
	}
	magic := binary.LittleEndian.Uint32(l.rh[0:])
	if magic != frameMagic {
		return &PeerError{Self: m.id.Rank, Peer: peer, Host: m.names[peer], Op: "recv",
			Err: fmt.Errorf("garbage on channel %d (bad frame header %08x): the stream is out of step", ch, magic)}
	}
	got, n := parseHeader(l.rh[:])
	if got != want || n != len(dst) {
		// Consume the payload so the lane stays framed, then report.
		if err := w.discard(n); err != nil {
			return m.ioError(ctx, "recv", peer, ch, want, err, w)
		}
		m.count[peer].recv.Add(uint64(headerBytes + n))
		return &MismatchError{Self: m.id.Rank, Peer: peer, Channel: ch, Want: want, Got: got, WantLen: len(dst), GotLen: n}
	}
	if n > 0 {
		if err := w.readFull(dst); err != nil {
			return m.ioError(ctx, "recv", peer, ch, want, err, w)
		}
	}
	m.count[peer].recv.Add(uint64(headerBytes + n))
	return nil
}

func putHeader(b []byte, t Tag, n int) {
	binary.LittleEndian.PutUint32(b[0:], frameMagic)
	binary.LittleEndian.PutUint64(b[4:], t.Seq)
	binary.LittleEndian.PutUint16(b[12:], t.Kind)
	binary.LittleEndian.PutUint16(b[14:], t.Aux)
	binary.LittleEndian.PutUint32(b[16:], t.Chunk)
	binary.LittleEndian.PutUint32(b[20:], uint32(n))
}

func parseHeader(b []byte) (Tag, int) {
	return Tag{
		Seq:   binary.LittleEndian.Uint64(b[4:]),
		Kind:  binary.LittleEndian.Uint16(b[12:]),
		Aux:   binary.LittleEndian.Uint16(b[14:]),
		Chunk: binary.LittleEndian.Uint32(b[16:]),
	}, int(binary.LittleEndian.Uint32(b[20:]))
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

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// listenIP picks the address to listen on: the one iface names (an
// IfaceSpec, resolved on this host), else the local address that routes
// to the rendezvous.
func listenIP(iface, rendezvous string) (string, error) {
	route := func() (string, error) { return routeIP(rendezvous) }
	if iface == "" {
		return route()
	}
	spec, err := ParseIfaceSpec(iface)
	if err != nil {
		return "", fmt.Errorf("%s=%w", EnvIface, err)
	}
	ip, err := spec.Resolve(route)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", EnvIface, iface, err)
	}
	return ip, nil
}

// routeIP is the local address that routes to the rendezvous (its own
// address when it is on loopback).
func routeIP(rendezvous string) (string, error) {
	host, _, err := net.SplitHostPort(rendezvous)
	if err != nil {
		return "", err
	}
	if isLoopbackHost(host) {
		if host == "localhost" {
			return "127.0.0.1", nil
		}
		return host, nil
	}
	c, err := net.Dial("udp", net.JoinHostPort(host, "9"))
	if err != nil {
		return "", fmt.Errorf("no route to the rendezvous host %s: %v", host, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// hostKey identifies this machine and network namespace.
func hostKey() string {
	mid, _ := os.ReadFile("/etc/machine-id")
	ns, _ := os.Readlink("/proc/self/ns/net")
	h, _ := os.Hostname()
	return strings.TrimSpace(string(mid)) + "/" + h + "/" + ns
}

func hostName(id Identity) string {
	if id.Host != "" {
		return id.Host
	}
	h, _ := os.Hostname()
	return h
}

// oneByOne begins TransportChoice.Receive when the QUIC socket reads one
// datagram at a time; the reason follows.
const oneByOne = "datagrams received one at a time: "
