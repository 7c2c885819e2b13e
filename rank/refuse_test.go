package rank

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// Each side's refusal on its own: a client that trusts the server (it has
// the job's CA) but cannot prove it holds the job secret is refused by the
// server, which records why; a server that cannot prove it is refused by
// the client, whose error says why. The reasons: no certificate, a
// certificate of another job (another secret), one from an unknown
// authority, and a job certificate naming the wrong peer.

// foreignCert is a certificate named label from a CA of its own making
// ("intruder CA"), not derived from any job secret.
func foreignCert(t *testing.T, label string) tls.Certificate {
	t.Helper()
	caPub, caKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "intruder CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caPub, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: label}, DNSNames: []string{serverName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func jobCert(t *testing.T, secret []byte, label string) tls.Certificate {
	t.Helper()
	a, err := newJobAuth(secret, label)
	if err != nil {
		t.Fatal(err)
	}
	return a.leaf
}

// knock is a client's credentials and the refusal the server must record.
type knock struct {
	name   string
	cert   *tls.Certificate // nil: none
	reason string
	says   string // in the server's refusal
}

// knocks are the clients a rank (or the rendezvous, as rank 0) must refuse:
// each trusts the server; claim is the rank its certificate names.
func knocks(t *testing.T, secret []byte, claim int, wrongPeer knock) []knock {
	other := jobCert(t, secretBytes(t), rankLabel(claim))
	foreign := foreignCert(t, rankLabel(claim))
	label := fmt.Sprintf("%q", rankLabel(claim))
	return []knock{
		{name: "no certificate", reason: noCertificate, says: "it presented no certificate"},
		{name: "another job", cert: &other, reason: otherJob, says: "its certificate (" + label + ") is from another gorun job: it holds a different job secret"},
		{name: "unknown authority", cert: &foreign, reason: unknownAuthority, says: "its certificate (" + label + `, issued by "intruder CA") is from an unknown authority`},
		wrongPeer,
	}
}

// trustingClient trusts the job's CA (so the client accepts the server)
// and presents cert whatever the server asks (nothing if nil).
func trustingClient(t *testing.T, secret []byte, cert *tls.Certificate) *tls.Config {
	t.Helper()
	a, err := newJobAuth(secret, "test client")
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13, RootCAs: a.pool, ServerName: serverName, NextProtos: []string{ALPN},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if cert == nil {
				return &tls.Certificate{}, nil
			}
			return cert, nil
		},
	}
}

// knockQUIC connects to addr, writes payload on a stream and reads. It
// returns its own address and the error that ended the attempt, or the
// bytes the server answered (a server that takes the payload and says
// nothing leaves the read to time out: an error, but not a refusal).
func knockQUIC(t *testing.T, addr string, cfg *tls.Config, payload []byte) (local string, answer []byte, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: udp}
	defer udp.Close()
	defer tr.Close()
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	local = udp.LocalAddr().String()
	c, err := tr.Dial(ctx, ua, cfg, quicConfig(5*time.Second))
	if err != nil {
		return local, nil, err
	}
	defer c.CloseWithError(0, "")
	st, err := c.OpenStreamSync(ctx)
	if err != nil {
		return local, nil, err
	}
	if _, err := st.Write(payload); err != nil {
		return local, nil, err
	}
	st.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	n, err := st.Read(buf)
	return local, buf[:n], err
}

// knockTCP is knockQUIC over TLS/TCP, but it reads before it writes: a
// server that refuses does so unasked (during the handshake, or right
// after it when the certificate names the wrong rank), and bytes it has
// not read when it closes would turn its alert or FIN into a reset. The
// payload goes out only if nothing came.
func knockTCP(t *testing.T, addr string, cfg *tls.Config, payload []byte) (local string, answer []byte, err error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local = c.LocalAddr().String()
	tc := tls.Client(c, cfg)
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		return local, nil, err
	}
	buf := make([]byte, 4096)
	n, err := tc.Read(buf)
	if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		return local, buf[:n], err
	}
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := tc.Write(payload); err != nil {
		return local, nil, err
	}
	n, err = tc.Read(buf)
	return local, buf[:n], err
}

// helloAndFrame is what a rank sends first on a lane: its hello, then a
// message.
func helloAndFrame(from int) []byte {
	var b strings.Builder
	writeHello(&b, from, 0)
	h := make([]byte, headerBytes)
	putHeader(h, Tag{Seq: 1}, 5)
	return []byte(b.String() + string(h) + "hello")
}

// checkRefusal checks that rec holds one refusal more than before, by who,
// of the client at local, for k's reason.
func checkRefusal(t *testing.T, rec *refusals, before int, who, local string, k knock) {
	t.Helper()
	l, n := rec.list()
	if n != before+1 {
		t.Fatalf("%s recorded %d refusals, want %d: %v", who, n-before, 1, l)
	}
	e := l[len(l)-1]
	if e.reason != k.reason || e.by != who || e.from != local || !strings.Contains(e.Error(), k.says) {
		t.Fatalf("%s's refusal of %s is %q (reason %q, by %q, from %q); want reason %q, by %q, from %s, saying %q",
			who, k.name, e.Error(), e.reason, e.by, e.from, k.reason, who, local, k.says)
	}
	if !strings.HasPrefix(e.Error(), who+" refused a connection from "+local+": ") {
		t.Errorf("refusal does not name the endpoint and the client first: %q", e.Error())
	}
}

// TestMeshRefusesClients: rank 1 of a running job (QUIC, TLS/TCP) turns
// away clients that trust it but present no certificate, another job's,
// a foreign one, or a job certificate that names a rank which does not
// connect to rank 1. Each refusal is the server's own (recorded with the
// reason and the client's address, the client seeing the server's alert
// or close), nothing reaches the mesh (over QUIC the client sends a hello
// and a message first), and the job goes on.
func TestMeshRefusesClients(t *testing.T) {
	for _, tr := range []string{"quic", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			testMeshRefusesClients(t, Options{Transport: tr, SharedMemory: "off", Timeout: 10 * time.Second})
		})
	}
}

func testMeshRefusesClients(t *testing.T, opt Options) {
	secret := secretBytes(t)
	id := func(r int) Identity {
		return Identity{Rank: r, Size: 2, LocalRank: r, LocalSize: 2, Secret: secret, Launcher: "test", Host: "localhost"}
	}
	ms := connectPair(t, secret, id, opt)
	m := ms[1]
	if want := map[string]string{"on": "shm", "off": opt.Transport}[opt.SharedMemory]; want != "" && m.PeerTransport(0) != want {
		t.Fatalf("rank 1 reaches rank 0 over %s, want %s", m.PeerTransport(0), want)
	}
	addr := m.addrs[1][strings.Index(m.addrs[1], "://")+3:]
	lanes := append([]*lane(nil), m.lanes[0]...)
	statsBefore := m.Stats()[0]
	// The only ranks that connect to rank 1 are below it: rank 0. A job
	// certificate for rank 1 itself is the wrong peer.
	self := jobCert(t, secret, rankLabel(1))
	wrong := knock{name: "wrong peer", cert: &self, reason: wrongPeer,
		says: `it holds this job's secret but its certificate names "rank 1", not one of the ranks that connect to rank 1`}
	for _, k := range knocks(t, secret, 0, wrong) {
		t.Run(strings.ReplaceAll(k.name, " ", "-"), func(t *testing.T) {
			_, before := m.refused.list()
			knockFn := knockQUIC
			if opt.Transport == "tcp" {
				knockFn = knockTCP
			}
			local, answer, err := knockFn(t, addr, trustingClient(t, secret, k.cert), helloAndFrame(0))
			if len(answer) > 0 || err == nil {
				t.Fatalf("rank 1 answered a client with %s: %q (%v)", k.name, answer, err)
			}
			// the client was refused by the server (not by a timeout)
			var want string
			switch {
			case k.reason == wrongPeer && opt.Transport == "quic":
				want = "unexpected peer" // the connection is closed with this reason
			case k.reason == wrongPeer:
				want = "EOF" // the server hangs up after the handshake
			default:
				want = "refused this process's certificate"
			}
			if e := explainHandshake(err); !strings.Contains(e.Error(), want) {
				t.Errorf("the client's error does not say %q: %v", want, e)
			}
			t.Logf("client: %v", explainHandshake(err))
			checkRefusal(t, &m.refused, before, "rank 1", local, k)
		})
	}
	// Nothing the clients sent reached the mesh: same lanes, no bytes.
	for ch, l := range m.lanes[0] {
		if l != lanes[ch] {
			t.Errorf("channel %d from rank 0 was replaced", ch)
		}
	}
	if s := m.Stats()[0]; s != statsBefore {
		t.Errorf("bytes counted from rank 0 changed: %+v -> %+v", statsBefore, s)
	}
	checkPairWorks(t, ms)
}

// connectPair connects ranks 0 and 1 of a job through a fresh rendezvous.
func connectPair(t *testing.T, secret []byte, id func(int) Identity, opt Options) []*Mesh {
	t.Helper()
	rdv, err := ListenRendezvous("127.0.0.1:0", 2, secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rdv.Close()
	return connectVia(t, rdv.Addr(), id, opt)
}

// connectVia connects ranks 0 and 1 of a job through the rendezvous at
// addr; the meshes close when the test ends.
func connectVia(t *testing.T, addr string, id func(int) Identity, opt Options) []*Mesh {
	t.Helper()
	ms := make([]*Mesh, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			i := id(r)
			i.Rendezvous = addr
			ms[r], errs[r] = Connect(context.Background(), i, opt)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll([]Transport{ms[0], ms[1]}) })
	return ms
}

// checkPairWorks sends a message each way on every channel.
func checkPairWorks(t *testing.T, ms []*Mesh) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for ch := 0; ch < ms[0].Channels(); ch++ {
		for from := 0; from < 2; from++ {
			to := 1 - from
			errc := make(chan error, 1)
			go func() { errc <- ms[from].Send(ctx, to, ch, Tag{Seq: 7}, []byte("still here")) }()
			b := make([]byte, 10)
			if err := ms[to].Recv(ctx, from, ch, Tag{Seq: 7}, b); err != nil || string(b) != "still here" {
				t.Fatalf("the job is broken after the refusals: rank %d from rank %d, channel %d: %q %v", to, from, ch, b, err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestRendezvousRefusesClients: the rendezvous turns away clients that
// trust it but present no certificate, another job's or a foreign one
// (all claiming rank 0), and a job certificate of rank 1 registering as
// rank 0; the registrations take no place: the ranks then form the job.
func TestRendezvousRefusesClients(t *testing.T) {
	secret := secretBytes(t)
	rdv, err := ListenRendezvous("127.0.0.1:0", 2, secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rdv.Close()
	reg, _ := json.Marshal(registration{Rank: 0, Size: 2, Addr: "quic://127.0.0.1:1"})
	one := jobCert(t, secret, rankLabel(1))
	wrong := knock{name: "wrong peer", cert: &one, reason: wrongPeer,
		says: `it holds this job's secret but registers as rank 0 with a certificate for "rank 1"`}
	for _, k := range knocks(t, secret, 0, wrong) {
		t.Run(strings.ReplaceAll(k.name, " ", "-"), func(t *testing.T) {
			_, before := rdv.refused.list()
			local, answer, err := knockQUIC(t, rdv.Addr(), trustingClient(t, secret, k.cert), append(reg, '\n'))
			if k.reason == wrongPeer {
				// a holder of the secret is told why
				var rep rdvReply
				if jerr := json.Unmarshal(answer, &rep); jerr != nil || !strings.Contains(rep.Error, "registration claims rank 0") || rep.Table != nil {
					t.Fatalf("want the refusal as the answer, got %q (%v)", answer, err)
				}
			} else {
				if len(answer) > 0 || err == nil {
					t.Fatalf("the rendezvous answered a client with %s: %q (%v)", k.name, answer, err)
				}
				if e := explainHandshake(err); !strings.Contains(e.Error(), "refused this process's certificate") {
					t.Errorf("the client's error does not say that the server refused it: %v", e)
				}
			}
			checkRefusal(t, &rdv.refused, before, "the rendezvous", local, k)
		})
	}
	// no refused client holds a place: both ranks register and connect
	ms := connectVia(t, rdv.Addr(), func(r int) Identity {
		return Identity{Rank: r, Size: 2, Secret: secret, Launcher: "test"}
	}, Options{Timeout: 10 * time.Second})
	checkPairWorks(t, ms)
}

// impostor serves addr's handshakes with cert (a rank's or rendezvous'
// port taken over by a process without the job secret) over QUIC or TLS/TCP;
// it counts the handshakes that completed on its side.
type impostor struct {
	addr      string
	completed chan struct{}
	close     func()
}

func startImpostor(t *testing.T, transport string, cert tls.Certificate) *impostor {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, NextProtos: []string{ALPN},
		ClientAuth: tls.RequestClientCert}
	im := &impostor{completed: make(chan struct{}, 100)}
	switch transport {
	case "quic":
		udp, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tr := &quic.Transport{Conn: udp}
		ln, err := tr.Listen(cfg, quicConfig(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := ln.Accept(context.Background())
				if err != nil {
					return
				}
				im.completed <- struct{}{}
				c.CloseWithError(0, "")
			}
		}()
		im.addr = udp.LocalAddr().String()
		im.close = func() { ln.Close(); tr.Close(); udp.Close() }
	case "tcp":
		ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if c.(*tls.Conn).Handshake() == nil {
					im.completed <- struct{}{}
				}
				c.Close()
			}
		}()
		im.addr = ln.Addr().String()
		im.close = func() { ln.Close() }
	}
	t.Cleanup(im.close)
	return im
}

// TestClientRefusesServer: rank 0 dials rank 1's address, where a server
// without the job secret answers (another job's certificate, a foreign
// one) or one of the job that is not rank 1; rank 0 refuses it, and its
// error names rank 1, the address and the reason. Over QUIC and TLS/TCP.
func TestClientRefusesServer(t *testing.T) {
	secret := secretBytes(t)
	for _, tr := range []string{"quic", "tcp"} {
		for _, k := range []struct {
			name string
			cert tls.Certificate
			says string
		}{
			{"another job", jobCert(t, secretBytes(t), rankLabel(1)), `authentication failed: its certificate ("rank 1") is from another gorun job: it holds a different job secret`},
			{"unknown authority", foreignCert(t, rankLabel(1)), `authentication failed: its certificate ("rank 1", issued by "intruder CA") is from an unknown authority`},
			{"wrong peer", jobCert(t, secret, rankLabel(2)), `it holds this job's secret but its certificate names "rank 2"`},
		} {
			t.Run(tr+"/"+strings.ReplaceAll(k.name, " ", "-"), func(t *testing.T) {
				im := startImpostor(t, tr, k.cert)
				rdv, err := ListenRendezvous("127.0.0.1:0", 2, secret)
				if err != nil {
					t.Fatal(err)
				}
				defer rdv.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				// a holder of the secret registers the impostor's address as rank 1's
				one, err := newJobAuth(secret, rankLabel(1))
				if err != nil {
					t.Fatal(err)
				}
				go register(ctx, rdv.Addr(), one, registration{Rank: 1, Size: 2, Addr: tr + "://" + im.addr, Name: "impostor-host"}, 10*time.Second)
				_, err = Connect(ctx, Identity{Rank: 0, Size: 2, Rendezvous: rdv.Addr(), Secret: secret, Launcher: "test"}, Options{Transport: tr, Timeout: 10 * time.Second})
				want := "rank 0: cannot connect to rank 1 (impostor-host) at " + im.addr + ": "
				if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), k.says) {
					t.Fatalf("want an error starting %q and saying %q, got %v", want, k.says, err)
				}
				t.Logf("%v", err)
				if k.name != "wrong peer" && len(im.completed) > 0 {
					t.Errorf("the impostor completed a handshake with rank 0")
				}
			})
		}
	}
}

// TestClientRefusesRendezvous: a rank whose rendezvous address is served
// without the job secret (another job's rendezvous, a foreign certificate)
// refuses it at once and says why; the impostor never sees the rank's
// certificate, so the refusal is the client's own.
func TestClientRefusesRendezvous(t *testing.T) {
	secret := secretBytes(t)
	other, err := ListenRendezvous("127.0.0.1:0", 2, secretBytes(t))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	foreign := startImpostor(t, "quic", foreignCert(t, "rendezvous"))
	for _, k := range []struct {
		name, addr, says string
	}{
		{"another job", other.Addr(), `authentication failed: its certificate ("rendezvous") is from another gorun job: it holds a different job secret`},
		{"unknown authority", foreign.addr, `authentication failed: its certificate ("rendezvous", issued by "intruder CA") is from an unknown authority`},
	} {
		t.Run(strings.ReplaceAll(k.name, " ", "-"), func(t *testing.T) {
			_, err := Connect(context.Background(), Identity{Rank: 1, Size: 2, Rendezvous: k.addr, Secret: secret, Launcher: "test"}, Options{Timeout: 10 * time.Second})
			want := "rank 1: rendezvous at " + k.addr + ": " + k.says
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Fatalf("want an error starting %q, got %v", want, err)
			}
		})
	}
	if l, n := other.refused.list(); n != 0 {
		t.Errorf("the other job's rendezvous saw the rank's certificate: %v", l)
	}
	if len(foreign.completed) > 0 {
		t.Errorf("the impostor completed a handshake")
	}
}

// TestMissingRankCitesRefusal: a rank whose peer never connects, while a
// client of another job was refused, says so in its error: the reason the
// server saw is not only in its records.
func TestMissingRankCitesRefusal(t *testing.T) {
	secret := secretBytes(t)
	rdv, err := ListenRendezvous("127.0.0.1:0", 2, secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rdv.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := Connect(context.Background(), Identity{Rank: 1, Size: 2, Rendezvous: rdv.Addr(), Secret: secret, Launcher: "test"}, Options{Timeout: 3 * time.Second})
		errc <- err
	}()
	// rank 0 registers (learning rank 1's address) but never connects;
	// a client of another job knocks at rank 1 instead
	zero, err := newJobAuth(secret, rankLabel(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tbl, err := register(ctx, rdv.Addr(), zero, registration{Rank: 0, Size: 2, Addr: "auto://127.0.0.1:1,127.0.0.1:2"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other := jobCert(t, secretBytes(t), rankLabel(0))
	local, _, _ := knockQUIC(t, strings.Split(strings.TrimPrefix(tbl.Addrs[1], "auto://"), ",")[0], trustingClient(t, secret, &other), helloAndFrame(0))
	err = <-errc
	want := "rank 1: rank 0 did not connect within 3s; it refused a connection: rank 1 refused a connection from " + local +
		`: its certificate ("rank 0") is from another gorun job: it holds a different job secret`
	if err == nil || err.Error() != want {
		t.Fatalf("want %q, got %v", want, err)
	}
}
