//go:build !linux

package rank

import "context"

// Shared memory is implemented on Linux only; elsewhere every peer uses
// sockets.

type shmPeer struct{}

func (m *Mesh) setupShm(ctx context.Context) error { return nil }
func (m *Mesh) closeShm()                          {}
func (m *Mesh) shmPeer(peer int) *shmPeer          { return nil }

// PeerTransport names how this rank exchanges messages with peer: "shm",
// "quic", "tcp", or "self".
func (m *Mesh) PeerTransport(peer int) string {
	if peer == m.id.Rank {
		return "self"
	}
	return m.opt.Transport
}

func (sp *shmPeer) send(ctx context.Context, ch int, tag Tag, payload []byte) error {
	panic("unreachable")
}

func (sp *shmPeer) recvMsg(ctx context.Context, ch int, want Tag, dst []byte) error {
	panic("unreachable")
}
