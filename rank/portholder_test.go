package rank

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

func needProcNetUDP(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/proc/net/udp"); err != nil {
		t.Skip("no /proc/net/udp (not Linux): a port's holder cannot be found")
	}
}

func udpPort(t *testing.T, c net.PacketConn) int {
	t.Helper()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// udpHolder finds the socket bound to a port where datagrams to an
// address would go, and the process that holds it.
func TestUDPHolder(t *testing.T) {
	needProcNetUDP(t)
	lo, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lo.Close()
	all, err := net.ListenPacket("udp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	conn, err := net.DialUDP("udp", nil, lo.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	loopback := net.ParseIP("127.0.0.1")
	for _, c := range []struct {
		what  string
		ip    net.IP
		port  int
		found bool
	}{
		{"bound to the address", loopback, udpPort(t, lo), true},
		{"bound to another address", net.ParseIP("127.0.0.2"), udpPort(t, lo), false},
		{"bound to every address", loopback, udpPort(t, all), true},
		{"a connected socket", loopback, conn.LocalAddr().(*net.UDPAddr).Port, false},
	} {
		h := udpHolder(c.ip, c.port)
		if (h != nil) != c.found {
			t.Errorf("%s: holder %v, want found %v", c.what, h, c.found)
			continue
		}
		if h != nil && (h.pid != os.Getpid() || !strings.HasPrefix(h.String(), "this process (")) {
			t.Errorf("%s: holder %+v (%s), want this process, %d", c.what, h, h, os.Getpid())
		}
	}
	if ip6, err := net.ListenPacket("udp6", "[::1]:0"); err == nil {
		defer ip6.Close()
		if h := udpHolder(net.ParseIP("::1"), udpPort(t, ip6)); h == nil || h.pid != os.Getpid() {
			t.Errorf("[::1]: holder %v", h)
		}
	}
}

// connectWithin runs Connect and gives up after guard (a hang guard, far
// above what the test expects and far below opt.Timeout).
func connectWithin(t *testing.T, id Identity, opt Options, guard time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		m, err := Connect(ctx, id, opt)
		if m != nil {
			m.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(guard):
		cancel()
		<-done
		t.Fatalf("rank %d still waiting after %s of a %s timeout", id.Rank, guard, opt.Timeout)
		return nil
	}
}

// A torchrun-style job whose MASTER_PORT another process holds (bound,
// never answering: to QUIC's dial it looks like a rank 0 not started yet)
// fails at once on rank 0, which cannot bind it, and within seconds on the
// other ranks, not at the end of their timeout: both name the port and the
// process that holds it, in one line.
func TestRendezvousPortHeldBySilentProcess(t *testing.T) {
	needProcNetUDP(t)
	hold, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close() // bound, never read: silent
	port := strconv.Itoa(udpPort(t, hold))
	addr := "127.0.0.1:" + port
	opt := Options{Timeout: 2 * time.Minute}
	for _, c := range []struct {
		rank int
		want string
	}{
		{0, fmt.Sprintf("rendezvous: cannot listen on %s: UDP port %s is held by this process (%d, ", addr, port, os.Getpid())},
		{1, fmt.Sprintf("rank 1: no gorun rendezvous answers at %s: UDP port %s there is held by this process (%d, ", addr, port, os.Getpid())},
	} {
		id, err := fromEnv(envOf("RANK", strconv.Itoa(c.rank), "WORLD_SIZE", "2", "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", port, "TORCHELASTIC_RUN_ID", "held"))
		if err != nil {
			t.Fatal(err)
		}
		err = connectWithin(t, id, opt, time.Minute)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("rank %d: got %v\nwant one line containing %q", c.rank, err, c.want)
		}
	}
}

// The rendezvous is QUIC, over UDP: a TCP listener on MASTER_PORT (as
// torchrun's own store is) is no obstacle.
func TestRendezvousBesideTCPListener(t *testing.T) {
	port := testenv.FreeUDPPort(t)
	tcp, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Skipf("TCP port %s is taken: %v", port, err)
	}
	defer tcp.Close()
	ms := make([]*Mesh, 2)
	errs := make(chan error, 2)
	for r := range ms {
		go func() {
			id, err := fromEnv(envOf("RANK", strconv.Itoa(r), "WORLD_SIZE", "2", "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", port, "TORCHELASTIC_RUN_ID", "beside-tcp"))
			if err == nil {
				ms[r], err = Connect(context.Background(), id, Options{Timeout: 20 * time.Second})
			}
			errs <- err
		}()
	}
	for range ms {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	for _, m := range ms {
		if m != nil {
			defer m.Close()
		}
	}
	if !t.Failed() {
		checkPairWorks(t, ms)
	}
}

// A rank started before rank 0, with nothing on the rendezvous port yet,
// keeps waiting (more dials than a silent holder is allowed) and joins
// when rank 0 comes.
func TestRankBeforeRankZero(t *testing.T) {
	port := testenv.FreeUDPPort(t)
	ident := func(r int) Identity {
		id, err := fromEnv(envOf("RANK", strconv.Itoa(r), "WORLD_SIZE", "2", "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", port, "TORCHELASTIC_RUN_ID", "late"))
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	type result struct {
		m   *Mesh
		err error
	}
	one := make(chan result, 1)
	id1 := ident(1)
	go func() {
		m, err := Connect(context.Background(), id1, Options{Timeout: 30 * time.Second})
		one <- result{m, err}
	}()
	time.Sleep(time.Duration(silentDials+1) * 2200 * time.Millisecond) // more unanswered dials than silentDials
	m0, err := Connect(context.Background(), ident(0), Options{Timeout: 30 * time.Second})
	r := <-one
	if err != nil || r.err != nil {
		t.Fatalf("rank 0: %v; rank 1: %v", err, r.err)
	}
	defer closeAll([]Transport{m0, r.m})
	checkPairWorks(t, []*Mesh{m0, r.m})
}
