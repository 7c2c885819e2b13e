package collective

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank"
)

// Op is a reduction.
type Op uint8

const (
	Sum     Op = 1
	Average Op = 2 // the sum divided by the world size
	Min     Op = 3
	Max     Op = 4
)

func (o Op) valid() bool { return o >= Sum && o <= Max }

func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Average:
		return "avg"
	case Min:
		return "min"
	case Max:
		return "max"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// ParseOp accepts sum, avg (average), min, max.
func ParseOp(s string) (Op, error) {
	switch s {
	case "sum":
		return Sum, nil
	case "avg", "average", "mean":
		return Average, nil
	case "min":
		return Min, nil
	case "max":
		return Max, nil
	}
	return 0, fmt.Errorf("unknown reduction %q (want sum, avg, min or max)", s)
}

// kind is the collective, carried in every message's Tag.Kind.
type kind uint16

const (
	kAllreduce     kind = 1
	kBroadcast     kind = 2
	kAllgather     kind = 3
	kReduceScatter kind = 4
	kBarrier       kind = 5
)

func (k kind) String() string {
	switch k {
	case kAllreduce:
		return "allreduce"
	case kBroadcast:
		return "broadcast"
	case kAllgather:
		return "allgather"
	case kReduceScatter:
		return "reduce-scatter"
	case kBarrier:
		return "barrier"
	}
	return fmt.Sprintf("collective %d", uint16(k))
}

// call describes one collective call as every rank must agree on it. It is
// packed into the tag of every message: Seq = sequence number (low 32
// bits) | element count (high 32 bits), Kind = collective, Aux = dtype |
// op<<4 | wire dtype<<8 | algorithm<<12 (for broadcast: the root).
type call struct {
	seq   uint32
	kind  kind
	count int // elements
	dtype dtype.DType
	op    Op
	wire  dtype.DType
	algo  algo.Algorithm
	root  int
	bad   bool // invalid arguments on this rank: fails without moving data
}

func (c call) tag(msg int) rank.Tag {
	aux := uint16(c.dtype) | uint16(c.op)<<4 | uint16(c.wire)<<8 | uint16(c.algo)<<12
	if c.kind == kBroadcast {
		aux = uint16(c.root)
	}
	return rank.Tag{Seq: uint64(c.seq) | uint64(uint32(c.count))<<32, Kind: uint16(c.kind), Aux: aux, Chunk: uint32(msg)}
}

func fromTag(t rank.Tag) call {
	c := call{seq: uint32(t.Seq), count: int(t.Seq >> 32), kind: kind(t.Kind)}
	if c.kind == kBroadcast {
		c.root = int(t.Aux)
	} else {
		c.dtype, c.op, c.wire, c.algo = dtype.DType(t.Aux&15), Op(t.Aux>>4&15), dtype.DType(t.Aux>>8&15), algo.Algorithm(t.Aux>>12)
	}
	return c
}

func (c call) String() string {
	if c.bad {
		return fmt.Sprintf("%s #%d", c.kind, c.seq)
	}
	s := fmt.Sprintf("%s #%d of %d", c.kind, c.seq, c.count)
	switch c.kind {
	case kBroadcast:
		return s + fmt.Sprintf(" bytes from root %d", c.root)
	case kBarrier:
		return fmt.Sprintf("barrier #%d", c.seq)
	}
	if c.kind == kAllgather {
		return s + " bytes per rank"
	}
	s += " x " + c.dtype.String()
	{
		s += ", " + c.op.String()
	}
	if c.wire != c.dtype {
		s += ", " + c.wire.String() + " on the wire"
	}
	if c.kind == kAllreduce {
		s += ", " + c.algo.String()
	}
	return s
}

// differences names what differs between two calls.
func differences(a, b call) string {
	var d []string
	if a.seq != b.seq {
		d = append(d, "sequence number (a rank skipped or added a collective)")
	}
	if a.kind != b.kind {
		d = append(d, "collective")
	}
	if a.count != b.count {
		d = append(d, "length")
	}
	if a.dtype != b.dtype {
		d = append(d, "data type")
	}
	if a.op != b.op {
		d = append(d, "reduction")
	}
	if a.wire != b.wire {
		d = append(d, "wire format")
	}
	if a.algo != b.algo {
		d = append(d, "algorithm (set GORUN_ALLREDUCE the same on every rank)")
	}
	if a.root != b.root {
		d = append(d, "root")
	}
	if len(d) == 0 {
		return "message sizes (slice settings differ between ranks)"
	}
	s := d[0]
	for _, x := range d[1:] {
		s += ", " + x
	}
	return s
}

// MismatchError reports ranks that called different collectives (or the
// same one with a different length, data type, reduction, root, algorithm
// or sequence number).
type MismatchError struct {
	Rank, Peer  int
	Mine, Peers string // the calls as each rank made them
	What        string // what differs
	bits        uint16
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("collective mismatch: rank %d called %s but rank %d called %s (%s differs)", e.Rank, e.Mine, e.Peer, e.Peers, e.What)
}

func explainMismatch(err error) error {
	var me *rank.MismatchError
	if !errors.As(err, &me) {
		return err
	}
	a, b := fromTag(me.Want), fromTag(me.Got)
	if kind(me.Got.Kind) == kAbort {
		return fromAbort(me.Self, me.Peer, a, me.Got)
	}
	if me.Want == me.Got {
		return &MismatchError{Rank: me.Self, Peer: me.Peer, Mine: a.String(), Peers: b.String(), bits: dSize,
			What: fmt.Sprintf("message size (%d bytes expected, %d sent; slice settings differ between ranks)", me.WantLen, me.GotLen)}
	}
	return &MismatchError{Rank: me.Self, Peer: me.Peer, Mine: a.String(), Peers: b.String(), What: differences(a, b), bits: diffBits(a, b)}
}

// Float32Bytes views a float32 slice as bytes (no copy).
func Float32Bytes(s []float32) []byte {
	if len(s) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 4*len(s))
}

// Float32s views bytes as float32s (no copy; b is 4-byte aligned):
// the inverse of Float32Bytes.
func Float32s(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// Uint16s views bytes as float16 or bfloat16 bits (no copy).
func Uint16s(b []byte) []uint16 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
}
