package rank

import (
	"crypto/tls"
	"net"
	"sync"
)

// batchBytes is how much of a Send's TLS records batchConn gathers before
// it writes them to the socket.
const batchBytes = 256 << 10

// batchConn sits under a TLS connection and gathers the records of one
// Send into few writes: crypto/tls hands every record (16 KiB at most) to
// its conn with a write(2) of its own, and at 10 Gbit/s those system
// calls, not the bytes, are what a large message costs. Between Begin
// and Flush (one Send) writes collect, batchBytes at a time; otherwise
// (the handshake, the hello, the shared-memory handshake, closing) they
// go straight through. The lock also orders a record that crypto/tls
// writes from a Read (a key update's answer) with a Flush.
type batchConn struct {
	net.Conn
	mu  sync.Mutex
	on  bool
	buf []byte
}

// Begin gathers the writes that follow until Flush.
func (b *batchConn) Begin() {
	b.mu.Lock()
	b.on = true
	b.mu.Unlock()
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.on {
		return b.Conn.Write(p)
	}
	if len(b.buf)+len(p) > batchBytes && len(b.buf) > 0 {
		if _, err := b.flushLocked(); err != nil {
			return 0, err
		}
	}
	if len(p) >= batchBytes {
		return b.Conn.Write(p)
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// Flush writes what Write gathered and ends the batch. It reports
// whether any byte went out, so that a caller's wait knows the peer
// still takes data; after an error it may be called again.
func (b *batchConn) Flush() (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	moved, err := b.flushLocked()
	if err == nil {
		b.on = false
	}
	return moved, err
}

func (b *batchConn) flushLocked() (bool, error) {
	moved := false
	for len(b.buf) > 0 {
		n, err := b.Conn.Write(b.buf)
		if n > 0 {
			moved = true
			b.buf = b.buf[:copy(b.buf, b.buf[n:])]
		}
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// tlsLane is a TLS connection over a batchConn: a lane whose Send
// gathers its records.
type tlsLane struct {
	*tls.Conn
	raw *batchConn
}

func (t tlsLane) Begin()               { t.raw.Begin() }
func (t tlsLane) Flush() (bool, error) { return t.raw.Flush() }

// batcher is a lane connection that can gather a Send's writes.
type batcher interface {
	Begin()
	Flush() (bool, error)
}
