package rank

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
)

// registration is what a rank tells the rendezvous.
type registration struct {
	Rank int    `json:"rank"`
	Size int    `json:"size"`
	Addr string `json:"addr"` // where its mesh listens
	Host string `json:"host"` // host key: equal for ranks on one machine
	Name string `json:"name"` // host name, for messages
	Job  string `json:"job"`
}

// table is what every rank receives back.
type table struct {
	Addrs []string `json:"addrs"`
	Hosts []string `json:"hosts"`
	Names []string `json:"names"`
}

type rdvReply struct {
	Waiting []int  `json:"waiting,omitempty"`
	Table   *table `json:"table,omitempty"`
	Error   string `json:"error,omitempty"`
}

// RendezvousServer collects every rank's address and hands the table to all
// of them. gorun serves it for the jobs it launches; under a foreign launcher
// rank 0 serves it. Only holders of the job secret can complete a handshake.
type RendezvousServer struct {
	size int
	tr   *quic.Transport
	ln   *quic.Listener
	addr string

	mu      sync.Mutex
	regs    map[int]registration
	waiters map[int]chan rdvReply
	done    chan struct{}
	closed  chan struct{}
	once    sync.Once
	refused refusals // connections the handshake or the registration turned away
}

// ListenRendezvous starts a rendezvous for a job of size ranks on addr
// ("host:port"; port 0 picks a free one).
func ListenRendezvous(addr string, size int, secret []byte) (*RendezvousServer, error) {
	if size < 1 {
		return nil, fmt.Errorf("rendezvous: job size %d < 1", size)
	}
	udp, err := net.ListenPacket("udp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			if h := boundHolder(addr); h != nil {
				return nil, fmt.Errorf("rendezvous: cannot listen on %s: UDP port %d is held by %s: another job on the same port? give this job another one", addr, h.port, h)
			}
		}
		return nil, fmt.Errorf("rendezvous: cannot listen on %s: %w", addr, err)
	}
	return serveRendezvous(udp, size, secret)
}

// ListenRendezvousIn starts a rendezvous on host at the first free port of
// ports (GORUN_PORT_RANGE; any free port for the zero range).
func ListenRendezvousIn(host string, ports PortRange, size int, secret []byte) (*RendezvousServer, error) {
	if size < 1 {
		return nil, fmt.Errorf("rendezvous: job size %d < 1", size)
	}
	udp, err := ports.ListenUDP(host)
	if err != nil {
		var taken *PortsTakenError
		if errors.As(err, &taken) {
			return nil, fmt.Errorf("rendezvous on %s: %w: widen --port-range (%s)", host, err, EnvPortRange)
		}
		return nil, fmt.Errorf("rendezvous: cannot listen on %s: %w", host, err)
	}
	return serveRendezvous(udp, size, secret)
}

// serveRendezvous serves the rendezvous on udp, which it then owns.
func serveRendezvous(udp net.PacketConn, size int, secret []byte) (*RendezvousServer, error) {
	auth, err := newJobAuth(secret, "rendezvous")
	if err != nil {
		udp.Close()
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	tr := &quic.Transport{Conn: udp}
	s := &RendezvousServer{
		size: size, tr: tr, addr: udp.LocalAddr().String(),
		regs: map[int]registration{}, waiters: map[int]chan rdvReply{},
		done: make(chan struct{}), closed: make(chan struct{}),
	}
	ln, err := tr.Listen(auth.serverTLS(&s.refused), quicConfig(30*time.Second))
	if err != nil {
		udp.Close()
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	s.ln = ln
	go s.acceptLoop()
	return s, nil
}

// Addr is the address the server is bound to.
func (s *RendezvousServer) Addr() string { return s.addr }

// Done is closed once every rank has received the address table.
func (s *RendezvousServer) Done() <-chan struct{} { return s.done }

// Close stops the server.
func (s *RendezvousServer) Close() error {
	s.once.Do(func() {
		close(s.closed)
		s.ln.Close()
		s.tr.Close()
		s.tr.Conn.Close()
	})
	return nil
}

func (s *RendezvousServer) acceptLoop() {
	for {
		conn, err := s.ln.Accept(context.Background())
		if err != nil {
			return
		}
		go s.handle(conn)
	}
}

func (s *RendezvousServer) missing() []int {
	var m []int
	for r := 0; r < s.size; r++ {
		if _, ok := s.regs[r]; !ok {
			m = append(m, r)
		}
	}
	return m
}

func (s *RendezvousServer) handle(conn *quic.Conn) {
	defer conn.CloseWithError(0, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	st, err := conn.AcceptStream(ctx)
	cancel()
	if err != nil {
		return
	}
	enc := json.NewEncoder(st)
	fail := func(msg string) {
		_ = enc.Encode(rdvReply{Error: msg})
		st.Close()
		time.Sleep(100 * time.Millisecond) // let the reply leave before the close
	}
	var reg registration
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := json.NewDecoder(bufio.NewReader(st)).Decode(&reg); err != nil {
		fail("malformed registration: " + err.Error())
		return
	}
	if got := labelRank(peerLabel(conn.ConnectionState().TLS)); got != reg.Rank {
		label := peerLabel(conn.ConnectionState().TLS)
		s.refused.add(&authError{by: "the rendezvous", from: conn.RemoteAddr().String(), reason: wrongPeer,
			msg: fmt.Sprintf("it holds this job's secret but registers as rank %d with a certificate for %q", reg.Rank, label)})
		fail(fmt.Sprintf("certificate names %q but registration claims rank %d", label, reg.Rank))
		return
	}
	ch := make(chan rdvReply, 4)
	s.mu.Lock()
	switch {
	case reg.Size != s.size:
		s.mu.Unlock()
		fail(fmt.Sprintf("rank %d says the job has %d ranks, the rendezvous expects %d", reg.Rank, reg.Size, s.size))
		return
	case reg.Rank < 0 || reg.Rank >= s.size:
		s.mu.Unlock()
		fail(fmt.Sprintf("rank %d is out of range for a job of %d ranks", reg.Rank, s.size))
		return
	}
	if old, dup := s.regs[reg.Rank]; dup {
		s.mu.Unlock()
		fail(fmt.Sprintf("rank %d registered twice (first from %s, now from %s)", reg.Rank, old.Addr, reg.Addr))
		return
	}
	s.regs[reg.Rank] = reg
	s.waiters[reg.Rank] = ch
	if len(s.regs) == s.size {
		t := &table{Addrs: make([]string, s.size), Hosts: make([]string, s.size), Names: make([]string, s.size)}
		for r, g := range s.regs {
			t.Addrs[r], t.Hosts[r], t.Names[r] = g.Addr, g.Host, g.Name
		}
		for _, w := range s.waiters {
			w <- rdvReply{Table: t}
		}
		select {
		case <-s.done:
		default:
			close(s.done)
		}
	}
	missing := s.missing()
	s.mu.Unlock()
	if len(missing) > 0 { // who is missing, at once and then every second
		if err := enc.Encode(rdvReply{Waiting: missing}); err != nil {
			return
		}
	}

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case r := <-ch:
			_ = enc.Encode(r)
			st.Close()
			// Wait for the client to read the table and hang up.
			select {
			case <-conn.Context().Done():
			case <-time.After(10 * time.Second):
			case <-s.closed:
			}
			return
		case <-tick.C:
			s.mu.Lock()
			m := s.missing()
			s.mu.Unlock()
			if len(m) > 0 {
				if err := enc.Encode(rdvReply{Waiting: m}); err != nil {
					return
				}
			}
		case <-conn.Context().Done():
			// The rank went away before the table was complete; forget it
			// so that a restarted rank can register again.
			s.mu.Lock()
			if len(s.regs) < s.size {
				delete(s.regs, reg.Rank)
				delete(s.waiters, reg.Rank)
			}
			s.mu.Unlock()
			return
		case <-s.closed:
			return
		}
	}
}

// silentDials is how many dials in a row a socket bound to the
// rendezvous' port on this host may leave unanswered before a rank gives
// up on it: a gorun rendezvous answers the first (rank 0 binds the port
// and serves it at once), so two are a margin for a loaded machine.
const silentDials = 2

// register sends reg to the rendezvous at addr and waits for the table.
//
// A dial that nothing answers is retried until the timeout: rank 0 may not
// have started yet. But where the rendezvous is on this host and a socket
// is bound to its port that leaves silentDials dials in a row unanswered,
// the port is held by something that is not a gorun rendezvous, and
// register fails at once, naming it (portholder.go).
func register(ctx context.Context, addr string, auth *jobAuth, reg registration, timeout time.Duration) (*table, error) {
	var conn *quic.Conn
	silent, holder := 0, holderCheck(addr)
	for {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := quic.DialAddr(dctx, addr, auth.clientTLS(), quicConfig(30*time.Second))
		unanswered := dctx.Err() != nil
		cancel()
		if err == nil {
			conn = c
			break
		}
		e := explainHandshake(err)
		if e != err { // authentication or protocol: retrying will not help
			return nil, fmt.Errorf("rendezvous at %s: %w", addr, e)
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, fmt.Errorf("rendezvous at %s: stopped while waiting for it to answer", addr)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("rendezvous at %s did not answer within %s (is the launcher or rank 0 running, and is the address reachable?)", addr, timeout)
		}
		if unanswered {
			if h := holder(); h != nil {
				if silent++; silent >= silentDials {
					return nil, fmt.Errorf("no gorun rendezvous answers at %s: UDP port %d there is held by %s, which does not answer: another program on this port? give the job another one (MASTER_PORT or %s)", addr, h.port, h, EnvRendezvous)
				}
			} else {
				silent = 0 // nobody there yet
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	defer conn.CloseWithError(0, "")
	st, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return nil, fmt.Errorf("rendezvous at %s: %w", addr, err)
	}
	if err := json.NewEncoder(st).Encode(reg); err != nil {
		return nil, fmt.Errorf("rendezvous at %s: %w", addr, err)
	}
	stop := context.AfterFunc(ctx, func() { st.SetReadDeadline(time.Now()) })
	defer stop()
	dec := json.NewDecoder(bufio.NewReader(st))
	var waiting []int
	for {
		var rep rdvReply
		if err := dec.Decode(&rep); err != nil {
			if ctx.Err() != nil {
				what := "the table of ranks"
				if len(waiting) > 0 {
					what = List(waiting) + " to register"
				}
				if errors.Is(ctx.Err(), context.Canceled) {
					return nil, fmt.Errorf("rendezvous at %s: stopped while waiting for %s", addr, what)
				}
				return nil, fmt.Errorf("rendezvous at %s: still waiting for %s after %s", addr, what, timeout)
			}
			return nil, fmt.Errorf("rendezvous at %s: connection lost: %w", addr, err)
		}
		switch {
		case rep.Error != "":
			return nil, fmt.Errorf("rendezvous at %s refused rank %d: %s", addr, reg.Rank, rep.Error)
		case rep.Table != nil:
			if len(rep.Table.Addrs) != reg.Size {
				return nil, fmt.Errorf("rendezvous at %s sent a table of %d ranks, want %d", addr, len(rep.Table.Addrs), reg.Size)
			}
			return rep.Table, nil
		default:
			waiting = rep.Waiting
		}
	}
}

// List names ranks for a message: "rank 3", "ranks 0, 1, 2" in order,
// the ninth and later as "and N more". rs is not changed.
func List(rs []int) string {
	rs = slices.Sorted(slices.Values(rs))
	parts := make([]string, 0, len(rs))
	for i, r := range rs {
		if i == 8 {
			parts = append(parts, fmt.Sprintf("and %d more", len(rs)-8))
			break
		}
		parts = append(parts, fmt.Sprint(r))
	}
	if len(rs) == 1 {
		return "rank " + parts[0]
	}
	return "ranks " + strings.Join(parts, ", ")
}

var errClosed = errors.New("mesh closed")
