package mpirun

import (
	"fmt"
	"strings"
)

// Slot is where one rank runs.
type Slot struct {
	Rank      int
	Host      string
	LocalRank int // index among the ranks on the same host
	LocalSize int // ranks on the same host
	NodeRank  int // index of the host among the hosts that got ranks, in rank order
}

// Mapping policies (--map-by).
const (
	MapBySlot = "slot" // fill a host's slots before the next host (default)
	MapByNode = "node" // one rank per host in turn
)

// Place assigns np ranks to the hosts' slots. By slot, ranks fill each
// host's slots in order; by node, ranks go round-robin over the hosts that
// have free slots. With oversubscribe, ranks beyond the total slot count go
// round-robin over the hosts that are below their max_slots; without it,
// np larger than the slots is an error.
func Place(hosts []Host, np int, mapBy string, oversubscribe bool) ([]Slot, error) {
	if len(hosts) == 0 {
		return nil, fmt.Errorf("no hosts to place ranks on")
	}
	if np < 1 {
		return nil, fmt.Errorf("-np %d: need at least 1 rank", np)
	}
	if np > maxCount {
		return nil, fmt.Errorf("-np %d is too large (max %d)", np, maxCount)
	}
	total, capTotal, capped := 0, 0, true
	for _, h := range hosts {
		if h.Slots < 1 {
			return nil, fmt.Errorf("host %s has %d slots: a host needs at least 1 slot", h.Name, h.Slots)
		}
		total += h.Slots
		if h.MaxSlots == 0 {
			capped = false
		}
		capTotal += max(h.MaxSlots, h.Slots)
	}
	if np > total && !oversubscribe {
		return nil, fmt.Errorf("-np %d is more than the %d slots of %s; add --oversubscribe or more slots", np, total, describeHosts(hosts))
	}
	if capped && np > capTotal {
		return nil, fmt.Errorf("-np %d is more than the %d max_slots of %s", np, capTotal, describeHosts(hosts))
	}
	hostOf := make([]int, 0, np)
	used := make([]int, len(hosts))
	switch mapBy {
	case "", MapBySlot:
		for i, h := range hosts {
			for s := 0; s < h.Slots && len(hostOf) < np; s++ {
				hostOf = append(hostOf, i)
				used[i]++
			}
		}
	case MapByNode:
		for len(hostOf) < np && len(hostOf) < total {
			for i, h := range hosts {
				if used[i] < h.Slots && len(hostOf) < np {
					hostOf = append(hostOf, i)
					used[i]++
				}
			}
		}
	default:
		return nil, fmt.Errorf("--map-by %q: want slot, node or ppr:N:node", mapBy)
	}
	// Oversubscription: round-robin over the hosts below their cap.
	for len(hostOf) < np {
		for i, h := range hosts {
			if len(hostOf) < np && (h.MaxSlots == 0 || used[i] < h.MaxSlots) {
				hostOf = append(hostOf, i)
				used[i]++
			}
		}
	}
	slots := make([]Slot, np)
	local := make([]int, len(hosts))
	node := make([]int, len(hosts))
	for i := range node {
		node[i] = -1
	}
	nodes := 0
	for r, hi := range hostOf {
		if node[hi] < 0 {
			node[hi] = nodes
			nodes++
		}
		slots[r] = Slot{Rank: r, Host: hosts[hi].Name, LocalRank: local[hi], LocalSize: used[hi], NodeRank: node[hi]}
		local[hi]++
	}
	return slots, nil
}

func describeHosts(hosts []Host) string {
	var parts []string
	for i, h := range hosts {
		if i == 6 {
			parts = append(parts, fmt.Sprintf("and %d more", len(hosts)-6))
			break
		}
		parts = append(parts, fmt.Sprintf("%s:%d", h.Name, h.Slots))
	}
	return strings.Join(parts, ", ")
}
