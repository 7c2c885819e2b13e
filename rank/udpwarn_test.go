package rank

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/rank/choice"
)

// The UDP buffer warning is due only where QUIC carries data: not between
// ranks that share memory, not over TLS/TCP, not for a job of one rank;
// and it comes from one rank per host.
func TestUDPWarning(t *testing.T) {
	const small, enough = 212992, quicBufferBytes
	meshes := func(t *testing.T, n int, opt Options) []*Mesh {
		t.Helper()
		var ms []*Mesh
		for _, tr := range group(t, n, opt) {
			ms = append(ms, tr.(*Mesh))
		}
		return ms
	}
	says := func(m *Mesh, rmem int) bool { return m.udpWarning(rmem) != "" }
	opt := Options{Transport: "quic", Timeout: 10 * time.Second}

	t.Run("shared memory on one host", func(t *testing.T) {
		opt := opt
		opt.SharedMemory = "on"
		for _, m := range meshes(t, 3, opt) {
			if m.PeerTransport((m.id.Rank+1)%3) != "shm" {
				t.Skipf("no shared memory here (rank %d: %s)", m.id.Rank, m.PeerTransport((m.id.Rank+1)%3))
			}
			if says(m, small) {
				t.Errorf("rank %d warns although every peer is reached through shared memory: %s", m.id.Rank, m.udpWarning(small))
			}
		}
	})
	t.Run("QUIC on one host", func(t *testing.T) {
		ms := meshes(t, 3, opt) // loopbackGroup: shared memory off
		w := ms[0].udpWarning(small)
		if !strings.Contains(w, "rank 0: net.core.rmem_max is 212992 on localhost") || !strings.Contains(w, "sysctl -w net.core.rmem_max=7500000") {
			t.Errorf("rank 0 with small buffers: %q", w)
		}
		if says(ms[0], enough) {
			t.Errorf("rank 0 warns with rmem_max %d", enough)
		}
		for _, m := range ms[1:] {
			if says(m, small) {
				t.Errorf("rank %d warns too; only the host's lowest rank should", m.id.Rank)
			}
		}
	})
	t.Run("TLS over TCP", func(t *testing.T) {
		for _, m := range meshes(t, 2, Options{Transport: "tcp", Timeout: 10 * time.Second}) {
			if says(m, small) {
				t.Errorf("rank %d warns about UDP buffers over TCP", m.id.Rank)
			}
		}
	})
	t.Run("one rank", func(t *testing.T) {
		m, err := Connect(context.Background(), Identity{Rank: 0, Size: 1, LocalSize: 1}, opt)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if says(m, small) {
			t.Error("a job of one rank warns")
		}
	})
	t.Run("peers on other hosts", func(t *testing.T) {
		// Ranks 0 and 1 on host a, 2 on host b, with shared memory between
		// 0 and 1: QUIC carries data to rank 2 only, and the warning comes
		// from rank 0 (host a's lowest) and rank 2 (host b's).
		for r, want := range []bool{true, false, true} {
			m := &Mesh{id: Identity{Rank: r, Size: 3}, opt: Options{Transport: "quic"}, choice: choice.Choice{Transport: "quic"},
				hosts: []string{"a", "a", "b"}, names: []string{"node1", "node1", "node2"}, links: make([]link, 3)}
			if r < 2 {
				m.links[1-r] = &shmPeer{}
			}
			if got := says(m, small); got != want {
				t.Errorf("rank %d: warns %v, want %v (%q)", r, got, want, m.udpWarning(small))
			}
		}
	})
}
