package rank

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/aegis"
)

// heldConn is a TCP connection whose writes are held in a buffer instead
// of sent, so that a test can send them whole, in pieces or altered.
type heldConn struct {
	net.Conn
	held bytes.Buffer
}

func (h *heldConn) Write(p []byte) (int, error) { return h.held.Write(p) }

// sealedPair runs the job's TLS handshake over a loopback TCP connection
// and returns both ends as sealed lanes. The client writes its hello and
// then, before the server reads the hello, a first sealed message: the
// server's handshake must leave that message on the socket
// (recordReader), or it fails to open. clientRaw, if set, wraps the
// client's connection under its sealed lane. Both ends offer protos
// (laneOffers).
func sealedPair(t *testing.T, protos []string, clientRaw func(net.Conn) net.Conn) (cli, srv *sealedConn, first []byte) {
	t.Helper()
	return sealedPairOffering(t, protos, protos, clientRaw)
}

// laneOffers are the offers of a mesh with GORUN_TCP_CIPHER=aes-gcm and,
// where this CPU runs AEGIS-128X4, of one with auto; the subtest of the
// other is skipped with its reason.
func laneOffers(t *testing.T, run func(t *testing.T, protos []string)) {
	t.Run("AES-128-GCM", func(t *testing.T) { run(t, []string{ALPN}) })
	t.Run("AEGIS-128X4", func(t *testing.T) {
		if !aegis.Available() {
			t.Skip("this CPU has no VAES on AVX-512: a mesh here never offers AEGIS-128X4")
		}
		run(t, []string{ALPNAegis, ALPN})
	})
}

func sealedPairOffering(t *testing.T, server, client []string, clientRaw func(net.Conn) net.Conn) (cli, srv *sealedConn, first []byte) {
	t.Helper()
	secret := secretBytes(t)
	sa, err := newJobAuth(secret, rankLabel(1))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := newJobAuth(secret, rankLabel(0))
	if err != nil {
		t.Fatal(err)
	}
	sa.protos, ca.protos = server, client
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type end struct {
		tc  *tls.Conn
		raw net.Conn
		err error
	}
	accepted := make(chan end, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- end{err: err}
			return
		}
		tc := tls.Server(&recordReader{Conn: c}, sa.serverTLS(&refusals{}))
		accepted <- end{tc, c, tc.Handshake()}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	tc := tls.Client(&recordReader{Conn: raw}, ca.clientTLS())
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := writeHello(tc, 0, 3); err != nil {
		t.Fatal(err)
	}
	under := raw
	if clientRaw != nil {
		under = clientRaw(raw)
	}
	if cli, err = sealLane(tc, under, true); err != nil {
		t.Fatal(err)
	}
	first = bytes.Repeat([]byte("first "), 5000)
	if _, err := cli.Write(first); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Flush(); err != nil {
		t.Fatal(err)
	}
	e := <-accepted
	if e.err != nil {
		t.Fatal(e.err)
	}
	t.Cleanup(func() { e.raw.Close() })
	time.Sleep(10 * time.Millisecond) // the hello and the sealed message are both on the socket
	if r, ch, err := readHello(e.tc); err != nil || r != 0 || ch != 3 {
		t.Fatalf("hello: rank %d channel %d, %v", r, ch, err)
	}
	if srv, err = sealLane(e.tc, e.raw, false); err != nil {
		t.Fatal(err)
	}
	return cli, srv, first
}

// readAll reads len(want) bytes from c in reads of at most step bytes
// (0: all at once) and compares them with want.
func readAll(t *testing.T, c *sealedConn, want []byte, step int) {
	t.Helper()
	if err := readCheck(c, want, step); err != nil {
		t.Fatal(err)
	}
}

func readCheck(c *sealedConn, want []byte, step int) error {
	c.SetReadDeadline(time.Now().Add(20 * time.Second)) // a lost or extra byte fails, not hangs
	defer c.SetReadDeadline(time.Time{})
	got := make([]byte, len(want))
	for off := 0; off < len(got); {
		end := len(got)
		if step > 0 {
			end = min(end, off+step)
		}
		n, err := c.Read(got[off:end])
		if err != nil {
			return fmt.Errorf("read at %d of %d: %v", off, len(want), err)
		}
		off += n
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%d bytes read differ from those written", len(want))
	}
	return nil
}

// TestSealedLaneCarriesBytes: messages of every size against the record
// size cross both ways at once, read whole, then in small pieces and in
// pieces that straddle records, over key epochs of 3 records (a side
// that took the wrong key fails to open).
func TestSealedLaneCarriesBytes(t *testing.T) { laneOffers(t, sealedLaneCarriesBytes) }

func sealedLaneCarriesBytes(t *testing.T, protos []string) {
	cli, srv, first := sealedPair(t, protos, nil)
	readAll(t, srv, first, 0)
	for _, c := range []*sealedConn{cli, srv} {
		c.out.epoch, c.in.epoch = 3, 3
	}
	r := rand.New(rand.NewSource(1))
	sizes := []int{1, 24, 1000, sealRecord - 1, sealRecord, sealRecord + 17, 3*sealRecord + 5}
	msgs := make([][]byte, len(sizes))
	var all []byte
	for i, n := range sizes {
		msgs[i] = make([]byte, n)
		r.Read(msgs[i])
		all = append(all, msgs[i]...)
	}
	send := func(w *sealedConn) error {
		for _, m := range msgs {
			if n, err := w.Write(m); n != len(m) || err != nil {
				return fmt.Errorf("write of %d: %d, %v", len(m), n, err)
			}
			if _, err := w.Flush(); err != nil {
				return err
			}
		}
		return nil
	}
	for _, step := range []int{0, 7, sealRecord/2 + 3} {
		errs := make(chan error, 3)
		go func() { errs <- send(cli) }()
		go func() { errs <- send(srv) }()
		go func() { errs <- readCheck(srv, all, step) }()
		if err := readCheck(cli, all, step); err != nil {
			t.Fatalf("pieces of %d: %v", step, err)
		}
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatalf("pieces of %d: %v", step, err)
			}
		}
	}
	if cli.out.seq < 3*cli.out.epoch {
		t.Fatalf("only %d records: the test crosses too few key epochs", cli.out.seq)
	}
	// A close between records is io.EOF.
	cli.CloseWrite()
	if n, err := srv.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Fatalf("after the peer closed: %d, %v; want io.EOF", n, err)
	}
}

// TestSealedLaneRefusesAlteredRecords: a flipped bit, a record sent twice
// and a length no record has each end the stream with an error that says
// so, and the error stays.
func TestSealedLaneRefusesAlteredRecords(t *testing.T) {
	laneOffers(t, sealedLaneRefusesAlteredRecords)
}

func sealedLaneRefusesAlteredRecords(t *testing.T, protos []string) {
	for _, c := range []struct {
		name  string
		alter func(rec []byte) []byte
		want  string
	}{
		{"flipped bit", func(rec []byte) []byte { rec[len(rec)/2] ^= 1; return rec }, "failed authentication"},
		{"replayed", func(rec []byte) []byte { return append(rec, rec...) }, "failed authentication"},
		{"bad length", func(rec []byte) []byte { return append([]byte{0xff, 0xff, 0xff, 0x7f}, rec...) }, "garbage on the connection"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var h *heldConn
			cli, srv, first := sealedPair(t, protos, func(raw net.Conn) net.Conn { h = &heldConn{Conn: raw}; return h })
			h.Conn.Write(h.held.Bytes()) // the first message, as it was
			readAll(t, srv, first, 0)
			h.held.Reset()
			msg := []byte("a message of the job")
			cli.Write(msg)
			cli.Flush()
			h.Conn.Write(c.alter(h.held.Bytes()))
			buf := make([]byte, len(msg))
			if c.name == "replayed" {
				readAll(t, srv, msg, 0)
			}
			for range 2 {
				if _, err := io.ReadFull(srv, buf); err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("read: %v, want an error saying %q", err, c.want)
				}
			}
		})
	}
}

// TestSealedLaneResumes: a write cut off by its deadline, and a read cut
// off inside a record, carry on where they stopped; the read carries on
// into another buffer.
func TestSealedLaneResumes(t *testing.T) {
	cli, srv, first := sealedPair(t, []string{ALPN}, nil)
	readAll(t, srv, first, 0)
	big := make([]byte, 64<<20) // more than both socket buffers hold
	rand.New(rand.NewSource(2)).Read(big)
	cli.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := cli.Write(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n >= len(big) {
		t.Fatalf("write with nobody reading: %d of %d, %v; want a deadline", n, len(big), err)
	}
	cli.SetWriteDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := cli.Write(big[n:])
		if err == nil {
			_, err = cli.Flush()
		}
		done <- err
	}()
	readAll(t, srv, big, 0)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	var h *heldConn
	cli, srv, first = sealedPair(t, []string{ALPN}, func(raw net.Conn) net.Conn { h = &heldConn{Conn: raw}; return h })
	h.Conn.Write(h.held.Bytes())
	readAll(t, srv, first, 0)
	h.held.Reset()
	msg := big[:sealRecord]
	cli.Write(msg)
	cli.Flush()
	rec := h.held.Bytes()
	h.Conn.Write(rec[:len(rec)/2])
	into := make([]byte, len(msg)+tagBytes) // room for the record: read in place
	srv.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := srv.Read(into); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("half a record: %d, %v; want nothing and a deadline", n, err)
	}
	srv.SetReadDeadline(time.Time{})
	h.Conn.Write(rec[len(rec)/2:])
	readAll(t, srv, msg, 0) // another buffer
}

// TestLaneCipherNegotiation: a lane seals with AEGIS-128X4 only when both
// ends offer it; when either offers AES-GCM alone, both ends seal with
// AES-128-GCM; either way the bytes cross.
func TestLaneCipherNegotiation(t *testing.T) {
	both, gcm := []string{ALPNAegis, ALPN}, []string{ALPN}
	for _, c := range []struct {
		name           string
		server, client []string
		want           string
	}{
		{"both offer AEGIS", both, both, "AEGIS-128X4"},
		{"the server does not", gcm, both, "AES-128-GCM"},
		{"the client does not", both, gcm, "AES-128-GCM"},
		{"neither does", gcm, gcm, "AES-128-GCM"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.want == "AEGIS-128X4" && !aegis.Available() {
				t.Skip("this CPU has no VAES on AVX-512: a mesh here never offers AEGIS-128X4")
			}
			cli, srv, first := sealedPairOffering(t, c.server, c.client, nil)
			for _, s := range []*sealer{&cli.out, &cli.in, &srv.out, &srv.in} {
				if s.cipher.name != c.want {
					t.Fatalf("an end seals with %s, want %s", s.cipher.name, c.want)
				}
			}
			readAll(t, srv, first, 0)
			msg := []byte("back the other way")
			go func() { cli.Write(msg); cli.Flush(); srv.Write(msg); srv.Flush() }()
			readAll(t, srv, msg, 0)
			readAll(t, cli, msg, 0)
		})
	}
}

// TestMeshTCPCipher: three ranks over TLS/TCP, rank 1 set to aes-gcm. Its
// lanes, both ways, seal with AES-128-GCM; those between ranks 0 and 2
// with AEGIS-128X4 where this CPU runs it. Messages cross every pair, and
// TransportChoice names what seals each rank's lanes.
func TestMeshTCPCipher(t *testing.T) {
	secret := secretBytes(t)
	rdv, err := ListenRendezvous("127.0.0.1:0", 3, secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rdv.Close()
	set := []string{"auto", "aes-gcm", "auto"}
	ms := make([]*Mesh, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r := range ms {
		wg.Go(func() {
			ms[r], errs[r] = Connect(context.Background(), Identity{Rank: r, Size: 3, Rendezvous: rdv.Addr(), Secret: secret, Launcher: "gorun"},
				Options{Transport: "tcp", TCPCipher: set[r], SharedMemory: "off", Timeout: 10 * time.Second})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	defer closeAll([]Transport{ms[0], ms[1], ms[2]})
	fast := "AES-128-GCM"
	if aegis.Available() {
		fast = "AEGIS-128X4"
	}
	for r, m := range ms {
		for p := range ms {
			if p == r {
				continue
			}
			want := fast
			if r == 1 || p == 1 {
				want = "AES-128-GCM"
			}
			for ch, l := range m.sets[viaTCP][p] {
				if got := l.c.(*sealedConn).out.cipher.name; got != want {
					t.Errorf("rank %d's channel %d to rank %d seals with %s, want %s", r, ch, p, got, want)
				}
			}
			msg := fmt.Appendf(nil, "from %d to %d", r, p)
			errc := make(chan error, 1)
			go func() { errc <- m.Send(context.Background(), p, 0, Tag{Seq: 7}, msg) }()
			got := make([]byte, len(msg))
			if err := ms[p].Recv(context.Background(), r, 0, Tag{Seq: 7}, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("rank %d to %d: %q, %v", r, p, got, err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		}
	}
	want := []string{fast + " and AES-128-GCM", "AES-128-GCM", fast + " and AES-128-GCM"}
	if fast == "AES-128-GCM" {
		want = []string{fast, fast, fast}
	}
	for r, m := range ms {
		c := m.TransportChoice()
		if c.Cipher != want[r] || !strings.Contains(c.String(), "records sealed with "+want[r]) {
			t.Errorf("rank %d: cipher %q (%v), want %q", r, c.Cipher, c, want[r])
		}
	}
	if _, err := (Options{TCPCipher: "chacha"}).withDefaults(); err == nil || err.Error() != `GORUN_TCP_CIPHER="chacha": want auto or aes-gcm` {
		t.Errorf("an unknown cipher: %v", err)
	}
}
