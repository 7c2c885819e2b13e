package choice

import (
	"strings"
	"testing"
)

func TestDecide(t *testing.T) {
	for _, c := range []struct {
		quic, tcp float64
		want      string
	}{{0.2, 0.6, "tcp"}, {0.6, 0.2, "quic"}, {0.1, 0.1, "quic"}, {0.1, 0.109, "quic"}, {0.1, 0.111, "tcp"}, {0.115, 0.1, "quic"}} {
		d := Decide(2, "node2", c.quic, c.tcp)
		if d.Transport != c.want || d.Peer != 2 {
			t.Errorf("QUIC %v, TCP %v GB/s: chose %q with rank %d, want %q with rank 2", c.quic, c.tcp, d.Transport, d.Peer, c.want)
		}
		if !strings.Contains(d.String(), "start-up probe rank 0 <-> rank 2 (node2)") || !strings.Contains(d.String(), "GB/s each way; ") {
			t.Errorf("the choice does not say why: %q", d)
		}
	}
}
