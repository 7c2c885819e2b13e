package rank

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// countingConn counts the writes that reach the socket.
type countingConn struct {
	net.Conn
	writes int
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes++
	return c.Conn.Write(p)
}

// TestBatchConn: outside a batch every write reaches the socket; within
// one, 16 KiB records go out batchBytes at a time; the bytes arrive whole
// and in order.
func TestBatchConn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		b, _ := io.ReadAll(c)
		got <- b
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cc := &countingConn{Conn: raw}
	bc := &batchConn{Conn: cc}
	var want []byte
	write := func(n int, fill byte) {
		p := bytes.Repeat([]byte{fill}, n)
		want = append(want, p...)
		if k, err := bc.Write(p); k != n || err != nil {
			t.Fatalf("write of %d: %d, %v", n, k, err)
		}
	}
	write(100, 'h') // a handshake's write: straight through
	if cc.writes != 1 {
		t.Fatalf("%d socket writes outside a batch, want 1", cc.writes)
	}
	bc.Begin()
	const records = 64
	for i := range records {
		write(16<<10, byte(i))
	}
	if moved, err := bc.Flush(); !moved || err != nil {
		t.Fatalf("flush: %v %v", moved, err)
	}
	batched := cc.writes - 1
	if wantMax := records*16<<10/batchBytes + 1; batched > wantMax || batched < 2 {
		t.Errorf("%d records of 16 KiB went out in %d writes, want 2..%d", records, batched, wantMax)
	}
	write(5, 'z') // after Flush: straight through again
	if cc.writes != batched+2 {
		t.Errorf("a write after the batch was held back")
	}
	raw.Close()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("received %d bytes, not the %d written in order", len(b), len(want))
	}
}
