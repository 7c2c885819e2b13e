package plan

import (
	"fmt"

	"github.com/gorun/gorun/collective/algo"
)

// call is one allreduce as gorun runs it on the cluster: the algorithm the
// communicator picks, how long it takes, and how much transport CPU each
// rank spends on it.
type call struct {
	algo algo.Algorithm // Auto's choice (of the phase across hosts, when hierarchical)
	hier bool           // the group segment within each host + algo across hosts
	sec  float64        // predicted time
	cpu  float64        // CPU seconds of the network transport per rank
	// linkBound: the link, not the transport's cap, sets the rate
	linkBound bool
}

// name is the algorithm as the plan prints it.
func (c call) name(hosts int) string {
	if c.hier {
		return fmt.Sprintf("hierarchical (shm group, %v across %d hosts)", c.algo, hosts)
	}
	return c.algo.String()
}

// route is what collective.Communicator.AlgorithmFor and exec do with an
// allreduce of bytes on the wire asking for ask (Auto, or the Ring the
// trainer forces for its token count) on this cluster, timed with the
// cost models of the links it crosses:
//
//   - one rank: nothing;
//   - every rank on one host: Auto takes the shm algorithm (the host's
//     group segment); a forced algorithm runs over the shared-memory pair
//     rings;
//   - several hosts with two or more ranks each (hierarchical, unless
//     GORUN_HIERARCHICAL=0): a reduce-scatter and an allgather in the
//     host's group segment (together one shm allreduce's cost) around an
//     allreduce of bytes/G among the H ranks of each local index, the G of
//     a host sharing its link and cores; Auto chooses that phase's
//     algorithm for H ranks with Direct off, on the cost model of the
//     link it is timed with, as the communicator does on the link its
//     start-up probe measured (collective.Config.Across);
//   - otherwise flat: Auto's choice for the world size on the link's
//     cost model, every step across a link.
func (p *planner) route(bytes int, ask algo.Algorithm) call {
	c := p.c
	n := c.Hosts * c.PerHost
	if n <= 1 {
		return call{algo: algo.Ring}
	}
	if c.Hosts == 1 {
		if ask == algo.Auto {
			return call{algo: algo.Shared, sec: model(ShmGroup, 0, 0, n).Predict(algo.Shared, bytes, n) / 1e6}
		}
		return call{algo: ask, sec: model(ShmRings, 0, 0, n).Predict(ask, bytes, n) / 1e6}
	}
	if c.PerHost >= 2 && !c.Flat {
		part := (bytes + c.PerHost - 1) / c.PerHost
		share := p.link(c.PerHost)
		cross := algo.LinkModel(share, c.Hosts)
		a := ask
		if a == algo.Auto { // as the communicator: for the phase across the hosts, on its link
			m := cross
			m.DirectMaxBytes = 0
			a = m.Choose(part, c.Hosts)
		}
		local := model(ShmGroup, 0, 0, c.PerHost).Predict(algo.Shared, bytes, c.PerHost)
		return call{algo: a, hier: true, sec: (local + cross.Predict(a, part, c.Hosts)) / 1e6,
			cpu: p.moved(a, part, c.Hosts) / (share.CapGBs * 1e9), linkBound: share.Gbps/8 <= share.CapGBs}
	}
	l := p.link(1)
	m := algo.LinkModel(l, n)
	a := ask
	if a == algo.Auto {
		a = m.Choose(bytes, n)
	}
	return call{algo: a, sec: m.Predict(a, bytes, n) / 1e6,
		cpu: p.moved(a, bytes, n) / (l.CapGBs * 1e9), linkBound: l.Gbps/8 <= l.CapGBs}
}

// link is what each of the ranks that cross the host's link at once has:
// its share of the link's rate, the latency and the transport's cost per
// step, and its transport's cap, cut when those ranks outnumber the cores.
func (p *planner) link(sharing int) algo.Link {
	c := p.c
	capGBs := p.tr.CapGBs
	if c.CoresPerHost > 0 && c.CoresPerHost < sharing {
		capGBs *= float64(c.CoresPerHost) / float64(sharing)
	}
	return algo.Link{Gbps: c.LinkGbps / float64(sharing), StepUs: c.LatencyUs + p.tr.StepUs, CapGBs: capGBs}
}

// moved is the bytes an allreduce of bytes on n ranks sends from its
// busiest rank (and receives there): 2(n-1)/n buffers around a ring,
// TreeLoad(n) in gorun's double tree, DoublingLoad(n) for recursive
// doubling, (n-1) for Direct.
func (p *planner) moved(a algo.Algorithm, bytes, n int) float64 {
	b := float64(bytes)
	switch a {
	case algo.Tree:
		return algo.TreeLoad(n) * b
	case algo.Direct:
		return float64(n-1) * b
	case algo.RecursiveDoubling:
		return algo.DoublingLoad(n) * b
	}
	return 2 * float64(n-1) / float64(n) * b
}

// model is a transport's cost model on a link of gbps (0: the transport
// alone) with latencyUs more per step, for calls among n ranks.
func model(t Transport, gbps, latencyUs float64, n int) algo.CostModel {
	return algo.LinkModel(algo.Link{Gbps: gbps, StepUs: t.StepUs + latencyUs, CapGBs: t.CapGBs}, n)
}
