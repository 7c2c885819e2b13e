package rank

import (
	"errors"
)

// RendezvousServer collects every rank's address and hands the table to all
// of them. gorun serves it for the jobs it launches; under a foreign launcher
// rank 0 serves it. Only holders of the job secret can complete a handshake.
type RendezvousServer struct {
	addr string
	done chan struct{}
}

// ListenRendezvous starts a rendezvous for a job of size ranks on addr
// ("host:port"; port 0 picks a free one).
func ListenRendezvous(addr string, size int, secret []byte) (*RendezvousServer, error) {
	return nil, errors.New("rendezvous: not implemented yet")
}

// Addr is the address the server is bound to.
func (s *RendezvousServer) Addr() string { return s.addr }

// Done is closed once every rank has received the address table.
func (s *RendezvousServer) Done() <-chan struct{} { return s.done }

// Close stops the server.
func (s *RendezvousServer) Close() error { return nil }
