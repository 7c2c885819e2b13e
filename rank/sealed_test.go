package rank

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"strings"
	"testing"
	"time"
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
// client's connection under its sealed lane.
func sealedPair(t *testing.T, clientRaw func(net.Conn) net.Conn) (cli, srv *sealedConn, first []byte) {
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
func TestSealedLaneCarriesBytes(t *testing.T) {
	cli, srv, first := sealedPair(t, nil)
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
			cli, srv, first := sealedPair(t, func(raw net.Conn) net.Conn { h = &heldConn{Conn: raw}; return h })
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
	cli, srv, first := sealedPair(t, nil)
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
	cli, srv, first = sealedPair(t, func(raw net.Conn) net.Conn { h = &heldConn{Conn: raw}; return h })
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
