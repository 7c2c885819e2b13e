package rank

import (
	"context"
	"testing"
	"time"
)

func TestProbePeer(t *testing.T) {
	for _, c := range []struct {
		hosts []string
		want  int
	}{
		{[]string{"a"}, -1},
		{[]string{"a", "a", "a"}, -1},
		{[]string{"a", "b"}, 1},
		{[]string{"a", "a", "b", "b"}, 2},
		{[]string{"a", "b", "a", "c"}, 1},
	} {
		if got := probePeer(c.hosts); got != c.want {
			t.Errorf("probePeer(%q) = %d, want %d", c.hosts, got, c.want)
		}
	}
}

// On one host auto connects both transports, carries the data over QUIC
// and closes the TCP lanes; quic and tcp by hand connect only theirs.
func TestAutoOnOneHost(t *testing.T) {
	for _, c := range []struct{ opt, want, why string }{
		{"", "quic", "auto: all ranks on one host"},
		{"tcp", "tcp", "set with GORUN_TRANSPORT"},
		{"quic", "quic", "set with GORUN_TRANSPORT"},
	} {
		var ms []*Mesh
		for _, tr := range group(t, 3, Options{Transport: c.opt, Timeout: 10 * time.Second}) {
			ms = append(ms, tr.(*Mesh))
		}
		for _, m := range ms {
			ch := m.TransportChoice()
			if ch.Transport != c.want || ch.Why != c.why || m.PeerTransport((m.id.Rank+1)%3) != c.want {
				t.Errorf("transport %q: rank %d carries data over %q (%q), peer transport %q; want %q (%q)",
					c.opt, m.id.Rank, ch.Transport, ch.Why, m.PeerTransport((m.id.Rank+1)%3), c.want, c.why)
			}
			if (m.sets[viaTCP] != nil) != (c.want == "tcp") || (m.sets[viaQUIC] != nil) != (c.want == "quic") {
				t.Errorf("transport %q: rank %d keeps QUIC lanes %v, TCP lanes %v", c.opt, m.id.Rank, m.sets[viaQUIC] != nil, m.sets[viaTCP] != nil)
			}
		}
		// the data lanes work
		ctx := context.Background()
		errc := make(chan error, 1)
		go func() { errc <- ms[0].Send(ctx, 1, 1, Tag{Seq: 7}, []byte("hello")) }()
		got := make([]byte, 5)
		if err := ms[1].Recv(ctx, 0, 1, Tag{Seq: 7}, got); err != nil || string(got) != "hello" || <-errc != nil {
			t.Errorf("transport %q: message after the choice: %v %q", c.opt, err, got)
		}
	}
}
