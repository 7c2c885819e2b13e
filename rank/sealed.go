package rank

import (
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/aegis"
	"github.com/gorun/gorun/internal/aesgcm"
)

// A TLS/TCP lane authenticates with a TLS 1.3 handshake (the job's
// certificates, auth.go) and then carries its bytes in records of its own,
// sealed under keys exported from that handshake (RFC 8446 section 7.5)
// with the AEAD the handshake's application protocol names: AEGIS-128X4
// (ALPNAegis; package aegis, about three times AES-GCM's rate) where both
// ends' CPUs have VAES on AVX-512, else AES-128-GCM (package aesgcm, four
// blocks per instruction where the CPU has VAES on AVX-512, two to three
// times crypto/cipher's rate). crypto/tls caps a record at 16 KiB, copies every byte it sends
// into the record before sealing it and every byte it receives out of its
// buffer after opening it; at 10 Gbit/s on one core those copies, not the
// network, were what a large Send cost (docs/performance.md). A sealed
// record holds up to sealRecord bytes, is sealed straight from the
// caller's buffer and opened in place in the receiver's.
//
// On the wire a record is a 4-byte little-endian length (of what
// follows), the ciphertext and the 16-byte GCM tag. The length is the
// additional data; the nonce is the record's number in its direction,
// which both sides count, so a record dropped, repeated, reordered or
// altered fails to open (AES-GCM's 12-byte nonce and AEGIS's 16-byte one
// both end in the record's number, big-endian, after zeros). Each
// direction has its own exported secret and takes a fresh key from it
// (HKDF-SHA256) every epochRecords records: at most 64 GiB under one key,
// far inside GCM's limits for 96-bit counter nonces.
const (
	sealRecord   = 256 << 10 // the most plaintext one record carries
	tagBytes     = 16
	lenBytes     = 4
	epochRecords = 1 << 18
	exportLabel  = "EXPORTER-gorun-lane-keys"
)

// laneCipher is an AEAD that seals a lane's records.
type laneCipher struct {
	name string // for messages: "AES-128-GCM", "AEGIS-128X4"
	new  func(key []byte) (cipher.AEAD, error)
}

var (
	cipherGCM   = laneCipher{"AES-128-GCM", aesgcm.New}
	cipherAegis = laneCipher{"AEGIS-128X4", aegis.New}
)

// sealer is one direction's keys and record count.
type sealer struct {
	cipher laneCipher
	secret []byte
	epoch  uint64 // records per key (epochRecords; smaller in tests)
	seq    uint64 // records sealed or opened so far
	aead   cipher.AEAD
	nonce  [16]byte // the record's number in the last 8 bytes of the AEAD's nonce
}

// next returns the AEAD and nonce for the next record, taking the next
// epoch's key when one begins.
func (s *sealer) next() (cipher.AEAD, []byte, error) {
	if s.seq%s.epoch == 0 {
		key, err := hkdf.Expand(sha256.New, s.secret, "gorun lane key "+strconv.FormatUint(s.seq/s.epoch, 10), 16)
		if err != nil {
			return nil, nil, err
		}
		if s.aead, err = s.cipher.new(key); err != nil {
			return nil, nil, err
		}
	}
	nonce := s.nonce[:s.aead.NonceSize()]
	binary.BigEndian.PutUint64(nonce[len(nonce)-8:], s.seq)
	s.seq++
	return s.aead, nonce, nil
}

// sealedConn is a lane over TCP whose bytes go in sealed records. Writes
// gather into one buffer of records that goes out when full and at
// Flush (the end of a Send); a write cut off by its deadline keeps what
// it did not write for the next call, so unlike a TLS connection the
// lane stays usable. Reads open a record in the caller's buffer when it
// has room for the record and its tag, else in the connection's own.
// Writes, and reads, each come from one goroutine at a time (a lane's
// wmu and rmu).
type sealedConn struct {
	net.Conn // the TCP connection: deadlines, Close

	out, in sealer

	wbuf []byte // sealed records not yet written (made at the first Write)
	woff int    // how much of wbuf is written

	rh     [lenBytes]byte // the length of the record being read
	rhn    int            // how much of rh has come
	rrec   []byte         // where its ciphertext is being read
	rown   bool           // rrec is in rbuf (else in the caller's buffer)
	rgot   int            // how much of it has come
	rbuf   []byte         // the connection's own room for one record (made when first needed)
	rplain []byte         // opened bytes in rbuf not yet read
	rerr   error          // a record that failed: the stream is unusable

	sock   syscall.RawConn       // the TCP socket, read with readv(2) (nil: plain reads)
	ahead  []byte                // bytes it read past what was asked for (in abuf)
	abuf   []byte                // aheadBytes of room for them (made when first needed)
	iov    [2][]byte             // the buffers of the readv in progress
	got    int                   // what it read
	gotErr error                 // and its error
	readv  func(fd uintptr) bool // s.readvOnce, made once
}

// aheadBytes is how much a read from the connection takes beyond what was
// asked for, when it has come: a read of a record reads the next record's
// length too, and when that record is a message's frame header, it and
// the payload record's length behind it. One system call a message where
// there were four (docs/performance.md).
const aheadBytes = 4 << 10

// errTampered is a record that does not open: altered on the way, or the
// stream is out of step.
var errTampered = errors.New("a record failed authentication (altered on the way, or the stream is out of step)")

// sealLane turns the TCP connection raw, on which the TLS handshake tc
// has just completed, into a sealedConn. Nothing may be read from or
// written to tc after it: the handshake must have read exactly its own
// records from raw (recordReader), and neither side sends TLS records
// after its last (the server sends no session tickets).
func sealLane(tc *tls.Conn, raw net.Conn, client bool) (*sealedConn, error) {
	cs := tc.ConnectionState()
	km, err := cs.ExportKeyingMaterial(exportLabel, nil, 64)
	if err != nil {
		return nil, fmt.Errorf("exporting lane keys: %w", err)
	}
	toServer, toClient := km[:32], km[32:]
	c := cipherGCM
	if cs.NegotiatedProtocol == ALPNAegis {
		c = cipherAegis
	}
	s := &sealedConn{Conn: raw}
	if sc, ok := raw.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			s.sock, s.readv = rc, s.readvOnce
		}
	}
	s.out = sealer{cipher: c, secret: toServer, epoch: epochRecords}
	s.in = sealer{cipher: c, secret: toClient, epoch: epochRecords}
	if !client {
		s.out.secret, s.in.secret = toClient, toServer
	}
	return s, nil
}

// Write seals p into records (sealRecord bytes at most each) behind what
// is gathered, writing the gathered records whenever the next would not
// fit. It reports the bytes sealed: they go out by the next Write or
// Flush, even after an error.
func (s *sealedConn) Write(p []byte) (int, error) {
	if s.wbuf == nil { // lanes to peers reached through shared memory never write
		s.wbuf = make([]byte, 0, sealRecord+2*(lenBytes+tagBytes)+headerBytes)
	}
	done := 0
	for len(p) > 0 {
		k := min(len(p), sealRecord)
		if len(s.wbuf)+lenBytes+k+tagBytes > cap(s.wbuf) {
			if _, err := s.drain(); err != nil {
				return done, err
			}
		}
		aead, nonce, err := s.out.next()
		if err != nil {
			return done, err
		}
		at := len(s.wbuf)
		s.wbuf = binary.LittleEndian.AppendUint32(s.wbuf, uint32(k+tagBytes))
		s.wbuf = aead.Seal(s.wbuf, nonce, p[:k], s.wbuf[at:at+lenBytes])
		p = p[k:]
		done += k
	}
	return done, nil
}

// Flush writes the gathered records. It reports whether any byte went out
// (the peer still takes data); after an error it may be called again.
func (s *sealedConn) Flush() (bool, error) { return s.drain() }

func (s *sealedConn) drain() (bool, error) {
	moved := false
	for s.woff < len(s.wbuf) {
		n, err := s.Conn.Write(s.wbuf[s.woff:])
		s.woff += n
		moved = moved || n > 0
		if err != nil {
			return moved, err
		}
	}
	s.wbuf, s.woff = s.wbuf[:0], 0
	return moved, nil
}

// CloseWrite ends the sending side (a TCP FIN). The mesh flushes every
// Send before it returns; records a SendMore gathered are left behind
// only when no next Send came, that is when the caller's pipeline failed.
func (s *sealedConn) CloseWrite() error {
	if cw, ok := s.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return s.Conn.Close()
}

// Read reads opened bytes into p. It returns nothing of a record until the
// whole record has come and opened; a read cut off by its deadline keeps
// what came for the next call. io.EOF means the peer closed between
// records; a close inside one is io.ErrUnexpectedEOF.
func (s *sealedConn) Read(p []byte) (int, error) {
	for {
		if s.rerr != nil {
			return 0, s.rerr
		}
		if len(s.rplain) > 0 {
			n := copy(p, s.rplain)
			s.rplain = s.rplain[n:]
			return n, nil
		}
		if len(p) == 0 {
			return 0, nil
		}
		n, err := s.readRecord(p)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// readRecord reads and opens one record into p (or into rbuf, leaving in
// rplain what does not fit p). It returns how many bytes landed in p.
func (s *sealedConn) readRecord(p []byte) (int, error) {
	for s.rhn < lenBytes {
		n, err := s.readConn(s.rh[s.rhn:])
		s.rhn += n
		if err != nil {
			if err == io.EOF && s.rhn > 0 {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
	}
	size := int(binary.LittleEndian.Uint32(s.rh[:]))
	if size < tagBytes || size > sealRecord+tagBytes {
		s.rerr = fmt.Errorf("garbage on the connection: a record of %d bytes (at most %d)", size, sealRecord+tagBytes)
		return 0, s.rerr
	}
	if cap(s.rbuf) < size { // small first: the lanes to peers on this host carry only the shm handshake
		n := sealRecord + tagBytes
		if size <= 4<<10 {
			n = 4 << 10
		}
		s.rbuf = make([]byte, n)
	}
	switch {
	case s.rgot == 0:
		// A record that fits p with its tag is read and opened there.
		s.rown = len(p) < size
		if s.rown {
			s.rrec = s.rbuf[:size]
		} else {
			s.rrec = p[:size]
		}
	case !s.rown && (len(p) < size || &p[0] != &s.rrec[0]):
		// Resumed into another buffer: carry on in the connection's own.
		copy(s.rbuf, s.rrec[:s.rgot])
		s.rrec, s.rown = s.rbuf[:size], true
	}
	for s.rgot < size {
		n, err := s.readConn(s.rrec[s.rgot:size])
		s.rgot += n
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
	}
	rec, own := s.rrec[:size], s.rown
	s.rhn, s.rgot, s.rrec = 0, 0, nil
	aead, nonce, err := s.in.next()
	if err != nil {
		s.rerr = err
		return 0, err
	}
	k := size - tagBytes
	dst := rec[:0] // in place
	if own && len(p) >= k {
		dst = p[:0] // opened from rbuf straight into p
	}
	if _, err := aead.Open(dst, nonce, rec, s.rh[:]); err != nil {
		s.rerr = errTampered
		return 0, s.rerr
	}
	if !own || len(p) >= k {
		return k, nil
	}
	n := copy(p, rec[:k])
	s.rplain = rec[n:k]
	return n, nil
}

// readConn reads from the connection into p, first what an earlier read
// took ahead. On a TCP socket it is one readv(2) into p and abuf, which
// keeps what has come beyond p, up to aheadBytes, for the next read; a
// connection that is not a socket (tests wrap some) is read plainly.
func (s *sealedConn) readConn(p []byte) (int, error) {
	if len(s.ahead) > 0 {
		n := copy(p, s.ahead)
		s.ahead = s.ahead[n:]
		return n, nil
	}
	if s.sock == nil {
		return s.Conn.Read(p)
	}
	if s.abuf == nil {
		s.abuf = make([]byte, aheadBytes)
	}
	s.iov, s.got, s.gotErr = [2][]byte{p, s.abuf}, 0, nil
	err := s.sock.Read(s.readv)
	s.iov = [2][]byte{} // holds p no longer
	if err == nil {
		err = s.gotErr
	}
	if s.got == 0 && err == nil {
		err = io.EOF // readv(2) reads nothing only at the end of the stream
	}
	k := min(s.got, len(p))
	s.ahead = s.abuf[:s.got-k]
	if k > 0 {
		return k, nil // an error with bytes comes again at the next read
	}
	return 0, err
}

// readvOnce is syscall.RawConn.Read's function for readConn: false (wait
// for the socket) while nothing has come.
func (s *sealedConn) readvOnce(fd uintptr) bool {
	for {
		n, err := unix.Readv(int(fd), s.iov[:])
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case nil:
			s.got = n
		default:
			s.gotErr = os.NewSyscallError("readv", err)
		}
		return true
	}
}

// recordReader sits under a TLS handshake and never reads past the end of
// the TLS record being read, so that when the handshake ends the next
// byte on the connection is the peer's first sealed record, not a byte
// lost in crypto/tls's buffer.
type recordReader struct {
	net.Conn
	hdr  [5]byte // a TLS record header: type, version, length
	hn   int
	left int // bytes of the current record's body not yet read
}

func (r *recordReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if r.left == 0 {
		n, err := r.Conn.Read(p[:min(len(p), len(r.hdr)-r.hn)])
		copy(r.hdr[r.hn:], p[:n])
		r.hn += n
		if r.hn == len(r.hdr) {
			r.left = int(binary.BigEndian.Uint16(r.hdr[3:]))
			r.hn = 0
		}
		return n, err
	}
	n, err := r.Conn.Read(p[:min(len(p), r.left)])
	r.left -= n
	return n, err
}
