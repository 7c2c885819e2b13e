package train

import (
	"context"
	"time"

	"github.com/gorun/gorun/rank"
)

// probeKind tags the link probe's messages (no collective uses it).
const probeKind = 0xFFF0

// probeLink measures the point-to-point rate between rank 0 and the first
// rank on another host (the link a data-parallel job crosses), before any
// collective runs: a warm-up message, then 3 x 8 MiB and an acknowledgement.
// It returns 0 when every rank is on rank 0's host. Only rank 0 and that
// peer take part; the others return at once.
func probeLink(ctx context.Context, m *rank.Mesh) (gbps float64, peer int, err error) {
	hosts := m.Hosts()
	peer = -1
	for r := 1; r < len(hosts); r++ {
		if hosts[r] != hosts[0] {
			peer = r
			break
		}
	}
	me := m.Rank()
	if peer < 0 || (me != 0 && me != peer) {
		return 0, peer, nil
	}
	const n = 8 << 20
	buf := make([]byte, n)
	ack := make([]byte, 8)
	tag := func(i int) rank.Tag { return rank.Tag{Seq: uint64(i), Kind: probeKind} }
	if me == 0 {
		var t0 time.Time
		for i := 0; i < 4; i++ {
			if i == 1 {
				t0 = time.Now()
			}
			if err := m.Send(ctx, peer, 0, tag(i), buf); err != nil {
				return 0, peer, err
			}
			if i == 0 || i == 3 {
				if err := m.Recv(ctx, peer, 0, tag(100+i), ack); err != nil {
					return 0, peer, err
				}
			}
		}
		return 3 * n * 8 / time.Since(t0).Seconds() / 1e9, peer, nil
	}
	for i := 0; i < 4; i++ {
		if err := m.Recv(ctx, 0, 0, tag(i), buf); err != nil {
			return 0, peer, err
		}
		if i == 0 || i == 3 {
			if err := m.Send(ctx, 0, 0, tag(100+i), ack); err != nil {
				return 0, peer, err
			}
		}
	}
	return 0, peer, nil
}
