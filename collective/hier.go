package collective

import (
	"context"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/rank"
)

// Hierarchical allreduce (Horovod's, for jobs with several ranks on each
// of several hosts): the ranks of a host reduce-scatter among themselves
// (through shared memory when the transport has it), so that local rank i
// holds part i of the host's sum; the ranks with the same local index on
// every host allreduce their part across hosts (ring or tree), so the
// bytes that cross hosts are spread over every local rank's links; then
// each host allgathers the parts. Used when the transport reports hosts
// (rank.Mesh.Hosts), there are two hosts or more, and every host has the
// same number (at least two) of ranks; otherwise calls stay flat.

// hier is this rank's place in the two-level layout.
type hier struct {
	local []int // global ranks on this host, in rank order
	cross []int // global ranks with this rank's local index, one per host, in host order
	idx   int   // this rank's index in local
	hidx  int   // this host's index in cross
}

// newHier groups ranks by host key; nil when the layout does not fit.
func newHier(hosts []string, me int) *hier {
	if len(hosts) < 4 || me < 0 || me >= len(hosts) {
		return nil
	}
	var order []string
	groups := map[string][]int{}
	for r, h := range hosts {
		if _, ok := groups[h]; !ok {
			order = append(order, h)
		}
		groups[h] = append(groups[h], r)
	}
	m := len(groups[order[0]])
	if len(order) < 2 || m < 2 {
		return nil
	}
	for _, h := range order {
		if len(groups[h]) != m {
			return nil
		}
	}
	hs := &hier{local: groups[hosts[me]]}
	for i, r := range hs.local {
		if r == me {
			hs.idx = i
		}
	}
	for i, h := range order {
		hs.cross = append(hs.cross, groups[h][hs.idx])
		if h == hosts[me] {
			hs.hidx = i
		}
	}
	return hs
}

func hierFor(t rank.Transport, flat bool) *hier {
	if flat {
		return nil
	}
	h, ok := t.(interface{ Hosts() []string })
	if !ok {
		return nil
	}
	return newHier(h.Hosts(), t.Rank())
}

// oneHost reports whether every rank of t is on one host (false when t
// does not say).
func oneHost(t rank.Transport) bool {
	h, ok := t.(interface{ Hosts() []string })
	if !ok {
		return false
	}
	hs := h.Hosts()
	for _, x := range hs {
		if x != hs[0] {
			return false
		}
	}
	return len(hs) > 0
}

// subTransport is a subset of a transport's ranks, renumbered 0..len-1.
// It shares the parent's lanes: phases that use it run one after another,
// in the same order on every rank, so each lane's messages stay in order.
type subTransport struct {
	t       rank.Transport
	members []int
	me      int
}

func (s *subTransport) Rank() int     { return s.me }
func (s *subTransport) Size() int     { return len(s.members) }
func (s *subTransport) Channels() int { return s.t.Channels() }
func (s *subTransport) Send(ctx context.Context, peer, ch int, tag rank.Tag, p []byte) error {
	return s.t.Send(ctx, s.members[peer], ch, tag, p)
}
func (s *subTransport) SendMore(ctx context.Context, peer, ch int, tag rank.Tag, p []byte) error {
	if m, ok := s.t.(rank.MoreSender); ok {
		return m.SendMore(ctx, s.members[peer], ch, tag, p)
	}
	return s.t.Send(ctx, s.members[peer], ch, tag, p)
}
func (s *subTransport) Recv(ctx context.Context, peer, ch int, want rank.Tag, dst []byte) error {
	return s.t.Recv(ctx, s.members[peer], ch, want, dst)
}
func (s *subTransport) Stats() []rank.PeerStats { return s.t.Stats() }
func (s *subTransport) Close() error            { return nil }

// hierAllreduce runs the three phases on acc (count elements); src, when
// not nil, holds this rank's input (out of place), which the first phase
// reads where it lies.
func (c *Communicator) hierAllreduce(ctx context.Context, acc, src []byte, count int, cl call) error {
	h := c.hier
	n := c.t.Size()
	local := &subTransport{t: c.t, members: h.local, me: h.idx}
	cross := &subTransport{t: c.t, members: h.cross, me: h.hidx}
	m := len(h.local)
	parts := split(count, m)
	ws := cl.wire.Size()
	// 1: reduce-scatter on the host, partial sums (no Average yet)
	if c.hg != nil {
		if err := c.hg.reduceScatter(ctx, acc, src, parts, cl); err != nil {
			return err
		}
	} else {
		r := newRun(ctx, local, cl, c.settings)
		r.ring(ringSpec{acc: acc, src: src, chunks: parts, rs: true, noFinish: true,
			nch: c.channelsFor(len(acc)), sliceBytes: sliceFor(count*ws, m, c.localSlice),
			dtype: cl.dtype, wire: cl.wire, op: cl.op})
		if err := r.wait(); err != nil {
			return err
		}
	}
	// 2: allreduce of this rank's part across the hosts
	lo, hi := parts[h.idx], parts[h.idx+1]
	r := newRun(ctx, cross, cl, c.settings)
	c.allreduceOn(r, cross, acc, nil, lo, hi, cl, n, c.cfg.SliceBytes)
	if err := r.wait(); err != nil {
		return err
	}
	// 3: allgather on the host (the parts are already in the wire format's
	// values when it differs, so sending them again rounds nothing)
	if c.hg != nil {
		return c.hg.allgather(ctx, acc, parts, cl)
	}
	r = newRun(ctx, local, cl, c.settings)
	r.ring(ringSpec{acc: acc, chunks: parts, ag: true,
		nch: c.channelsFor(len(acc)), sliceBytes: sliceFor(count*ws, m, c.localSlice),
		dtype: cl.dtype, wire: cl.wire, op: cl.op})
	return r.wait()
}

// allreduceOn runs a flat allreduce of acc's elements [lo, hi) over t with
// the call's algorithm, in slices of at most slice bytes; Average divides
// by div. src, when not nil, holds this rank's input laid out as acc (out
// of place): the ring reads it where it lies, the others copy it first.
func (c *Communicator) allreduceOn(r *run, t rank.Transport, acc, src []byte, lo, hi int, cl call, div, slice int) {
	n := t.Size()
	es := cl.dtype.Size()
	if src != nil && (n == 1 || cl.algo != algo.Ring) { // only the ring reads src where it lies
		copy(acc[lo*es:hi*es], src[lo*es:hi*es])
		src = nil
	}
	if n == 1 {
		if cl.op == Average || cl.wire != cl.dtype {
			red := newReducer(cl.dtype, cl.wire, cl.op, div)
			a := acc[lo*es : hi*es]
			red.finish(a)
			if cl.wire != cl.dtype && len(a) > 0 {
				w := make([]byte, (hi-lo)*cl.wire.Size())
				red.toWire(w, a)
				red.fromWire(a, w)
			}
		}
		return
	}
	count := hi - lo
	if cl.algo == algo.Tree {
		if t.Channels() < 2 {
			sh := algo.InorderTree(n)
			r.tree(treeSpec{acc: acc, lo: lo, hi: hi, ch: 0, shape: sh[t.Rank()], up: true,
				sliceBytes: slice, dtype: cl.dtype, wire: cl.wire, op: cl.op, div: div})
			return
		}
		trees := algo.DoubleTree(n)
		half := split(count, 2)
		for i := 0; i < 2; i++ {
			r.tree(treeSpec{acc: acc, lo: lo + half[i], hi: lo + half[i+1], ch: i, shape: trees[i][t.Rank()], up: true,
				sliceBytes: slice, dtype: cl.dtype, wire: cl.wire, op: cl.op, div: div})
		}
		return
	}
	if cl.algo == algo.HalvingDoubling || cl.algo == algo.RecursiveDoubling {
		plan := hdPlanFor
		if cl.algo == algo.RecursiveDoubling {
			plan = rdPlanFor
		}
		// Whole slices (not sliceFor's smaller ones): a step's slices only
		// overlap its receives with its reductions, nothing across steps,
		// so small calls gain nothing from more messages: over QUIC at np
		// 4, one message per step made 64 KiB 1.31 ms against 1.82 with
		// 8 KiB slices (docs/collective.md).
		r.halvingDoubling(hdSpec{acc: acc, lo: lo, hi: hi, nch: c.channelsFor(count * es),
			sliceBytes: slice, dtype: cl.dtype, wire: cl.wire, op: cl.op, div: div, plan: plan})
		return
	}
	chunks := split(count, n)
	for i := range chunks {
		chunks[i] += lo
	}
	r.ring(ringSpec{acc: acc, src: src, chunks: chunks, rs: true, ag: true,
		nch: c.channelsFor(count * es), sliceBytes: sliceFor(count*cl.wire.Size(), n, slice),
		dtype: cl.dtype, wire: cl.wire, op: cl.op, roundOwn: cl.wire != cl.dtype, div: div})
}

// HierarchicalInGroup reports whether the hierarchical allreduce's phases
// within this rank's host go through the host's group segment (false:
// the ring over the pair rings or sockets, or calls are flat).
func (c *Communicator) HierarchicalInGroup() bool { return c.hg != nil }

// Hierarchical reports the two-level layout Allreduce uses: the number of
// hosts and of ranks per host, or 0, 0 when calls are flat.
func (c *Communicator) Hierarchical() (hosts, perHost int) {
	if c.hier == nil {
		return 0, 0
	}
	return len(c.hier.cross), len(c.hier.local)
}
