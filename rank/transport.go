package rank

import (
	"context"
	"fmt"
	"time"
)

// Tag is the header every framed message carries. The transport checks that
// a received message carries exactly the tag the receiver expects, so two
// ranks that disagree about which collective (or which step of it) they are
// in get an error naming both, never silently wrong data. rank gives the
// fields no meaning; package collective does.
type Tag struct {
	Seq   uint64 // operation sequence number
	Kind  uint16 // which collective
	Aux   uint16 // dtype / reduce op, packed by the caller
	Chunk uint32 // chunk or slice index inside the operation
}

func (t Tag) String() string {
	return fmt.Sprintf("seq %d kind %d aux %d chunk %d", t.Seq, t.Kind, t.Aux, t.Chunk)
}

// Transport moves framed, ordered messages between the ranks of one job.
// Channels are independent ordered lanes between each pair of ranks
// (separate streams or connections), numbered 0..Channels()-1.
//
// Concurrency: for each (peer, channel) at most one Send and one Recv may be
// in flight at a time, but a Send and a Recv may run concurrently. Send may
// block until the peer receives (flow control), so an exchange in which both
// sides send must run its sends and receives in separate goroutines.
type Transport interface {
	Rank() int
	Size() int
	Channels() int
	// Send writes one message with tag and payload to peer on channel ch.
	Send(ctx context.Context, peer, ch int, tag Tag, payload []byte) error
	// Recv reads the next message from peer on channel ch into dst. It fails
	// with a *MismatchError if the message's tag differs from want or its
	// length differs from len(dst).
	Recv(ctx context.Context, peer, ch int, want Tag, dst []byte) error
	// Stats returns the bytes sent to and received from every peer so far.
	Stats() []PeerStats
	Close() error
}

// MoreSender is a Transport that can hold a message back to go out with
// the next one to the same peer and channel: SendMore is Send, except
// that the message may wait, gathered, until the next Send or SendMore
// there. The caller must make that call: a pipeline that already holds its
// next message uses SendMore, and Send for the last.
type MoreSender interface {
	SendMore(ctx context.Context, peer, ch int, tag Tag, payload []byte) error
}

// PeerStats counts the bytes exchanged with one peer: the payload and
// framing bytes of messages (over whatever transport reaches the peer:
// QUIC, TCP or a shared-memory ring), and the bytes that moved between
// the two through the host's shared-memory group segment, where
// collectives exchange data without messages (LocalGroup.Count): what
// this rank wrote there for the peer to read, and what it read of the
// peer's.
type PeerStats struct {
	BytesSent uint64
	BytesRecv uint64
	GroupSent uint64
	GroupRecv uint64
}

// MismatchError reports a message that is not the one the receiver expected.
type MismatchError struct {
	Self, Peer int
	Channel    int
	Want, Got  Tag
	WantLen    int
	GotLen     int
}

func (e *MismatchError) Error() string {
	if e.Want != e.Got {
		return fmt.Sprintf("rank %d: message from rank %d on channel %d does not match: rank %d expects (%v), rank %d sent (%v)",
			e.Self, e.Peer, e.Channel, e.Self, e.Want, e.Peer, e.Got)
	}
	return fmt.Sprintf("rank %d: message from rank %d on channel %d (%v) has %d bytes, rank %d expects %d",
		e.Self, e.Peer, e.Channel, e.Got, e.GotLen, e.Self, e.WantLen)
}

// PeerError reports a peer that failed, vanished or did not answer in time.
type PeerError struct {
	Self, Peer int
	Host       string
	Op         string // "send", "recv", "dial", ...
	Err        error
	// Waited is how long the wait went without progress, when that is why
	// it ended (zero otherwise).
	Waited time.Duration
}

func (e *PeerError) Error() string {
	h := ""
	if e.Host != "" {
		h = " (" + e.Host + ")"
	}
	return fmt.Sprintf("rank %d: %s with rank %d%s: %v", e.Self, e.Op, e.Peer, h, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }
