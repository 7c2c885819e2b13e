package rank

import (
	"context"
	"errors"
	"math/rand"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParsePortRange(t *testing.T) {
	for in, want := range map[string]PortRange{"": {}, "29500-29503": {29500, 29503}, " 1-65535 ": {1, 65535}, "7000-7000": {7000, 7000}} {
		got, err := ParsePortRange(in)
		if err != nil || got != want {
			t.Errorf("ParsePortRange(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"29500":       `"29500": want LO-HI, such as 29500-29531`,
		"a-b":         `"a-b": want LO-HI`,
		"29503-29500": `"29503-29500": 29503 is above 29500 (want LO-HI with LO <= HI)`,
		"0-10":        `"0-10": ports go from 1 to 65535`,
		"60000-65536": `"60000-65536": ports go from 1 to 65535`,
		"-5-10":       `"-5-10": want LO-HI`,
	} {
		if _, err := ParsePortRange(in); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("ParsePortRange(%q): %v; want %q", in, err, want)
		}
	}
	if r := (PortRange{29500, 29503}); r.Size() != 4 || r.String() != "29500-29503" || (PortRange{}).Size() != 0 {
		t.Errorf("Size/String: %d %q", r.Size(), r.String())
	}
}

// freePorts returns n consecutive ports that are free for UDP and TCP on
// 127.0.0.1 now, below the kernel's range of ephemeral ports.
func freePorts(t *testing.T, n int) PortRange {
	t.Helper()
	for try := 0; try < 100; try++ {
		lo := 20000 + rand.Intn(10000)
		r := PortRange{lo, lo + n - 1}
		var held []interface{ Close() error }
		ok := true
		for p := r.Lo; p <= r.Hi && ok; p++ {
			a := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
			u, err := net.ListenPacket("udp", a)
			if err != nil {
				ok = false
				break
			}
			held = append(held, u)
			l, err := net.Listen("tcp", a)
			if err != nil {
				ok = false
				break
			}
			held = append(held, l)
		}
		for _, h := range held {
			h.Close()
		}
		if ok {
			return r
		}
	}
	t.Fatal("no free port range")
	return PortRange{}
}

// hold takes every port of r for proto ("udp", "tcp" or both) on
// 127.0.0.1 until the test ends, as other programs would.
func hold(t *testing.T, r PortRange, protos ...string) {
	t.Helper()
	for p := r.Lo; p <= r.Hi; p++ {
		a := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		for _, proto := range protos {
			var c interface{ Close() error }
			var err error
			if proto == "udp" {
				c, err = net.ListenPacket("udp", a)
			} else {
				c, err = net.Listen("tcp", a)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
		}
	}
}

func portOf(t *testing.T, addr net.Addr) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr.String())
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// TestMeshPortRange: the ranks' UDP and TCP listeners take the first free
// ports of the range, several ranks on one host each their own; the
// rendezvous too; and a range with no free port left is one error that
// names the rank, its host and the range.
func TestMeshPortRange(t *testing.T) {
	r := freePorts(t, 2)
	g := group(t, 2, Options{Ports: r, Timeout: 10 * time.Second})
	udp, tcp := map[int]bool{}, map[int]bool{}
	for _, tr := range g {
		m := tr.(*Mesh)
		udp[portOf(t, m.udp.LocalAddr())] = true
		tcp[portOf(t, m.tln.Addr())] = true
	}
	want := map[int]bool{r.Lo: true, r.Hi: true}
	if len(udp) != 2 || len(tcp) != 2 || !udp[r.Lo] || !udp[r.Hi] || !tcp[r.Lo] || !tcp[r.Hi] {
		t.Errorf("range %s: UDP ports %v, TCP ports %v; want %v each", r, udp, tcp, want)
	}
	ctx := context.Background()
	if err := g[0].Send(ctx, 1, 0, Tag{Kind: 1}, []byte("over the range")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 14)
	if err := g[1].Recv(ctx, 0, 0, Tag{Kind: 1}, buf); err != nil || string(buf) != "over the range" {
		t.Fatalf("recv: %q %v", buf, err)
	}

	rr := freePorts(t, 1)
	rdv, err := ListenRendezvousIn("127.0.0.1", rr, 1, make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	defer rdv.Close()
	if rdv.Addr() != "127.0.0.1:"+strconv.Itoa(rr.Lo) {
		t.Errorf("rendezvous on %s, want port %d", rdv.Addr(), rr.Lo)
	}
	if _, err := ListenRendezvousIn("127.0.0.1", rr, 1, make([]byte, 32)); err == nil ||
		err.Error() != "rendezvous on 127.0.0.1: no free UDP port in "+rr.String()+" (1 port, taken): widen --port-range (GORUN_PORT_RANGE)" {
		t.Errorf("rendezvous in a taken range: %v", err)
	}

	for _, c := range []struct {
		transport string
		protos    []string
		proto     string
	}{{"quic", []string{"udp"}, "UDP"}, {"tcp", []string{"tcp"}, "TCP"}, {"auto", []string{"tcp"}, "TCP"}} {
		r := freePorts(t, 3)
		hold(t, r, c.protos...)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := loopbackGroup(ctx, 2, Options{Transport: c.transport, Ports: r, Timeout: 10 * time.Second})
		cancel()
		re := regexp.MustCompile(`^rank [01] on localhost: no free ` + c.proto + ` port in ` + r.String() + ` \(3 ports, all taken\): widen --port-range \(GORUN_PORT_RANGE\)$`)
		var taken *PortsTakenError
		if err == nil || !re.MatchString(err.Error()) || !errors.As(err, &taken) || taken.Range != r {
			t.Errorf("%s with every %s port of %s taken: %v", c.transport, c.proto, r, err)
		}
	}
}
