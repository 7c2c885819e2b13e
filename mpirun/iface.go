package mpirun

import (
	"fmt"
	"io"
	"strings"

	"github.com/gorun/gorun/rank"
)

// MCAParam is one OpenMPI parameter given as --mca KEY VALUE. gorun is not
// OpenMPI: the ones that name the network interface (ifaceMCA) choose the
// interface the ranks bind, the others are dropped with a note.
type MCAParam struct {
	Flag       string // as typed: --mca, -mca, --gmca
	Key, Value string
}

func (m MCAParam) String() string { return m.Flag + " " + m.Key + " " + m.Value }

// ifaceMCA are the MCA parameters that name interfaces (value: an exclude
// list), in the order they are followed: OpenMPI's data transport (btl)
// before its runtime's (oob).
var ifaceMCA = []struct {
	key     string
	exclude bool
}{
	{"btl_tcp_if_include", false}, {"btl_tcp_if_exclude", true},
	{"oob_tcp_if_include", false}, {"oob_tcp_if_exclude", true},
}

// IfaceVars are the variables of NCCL, Gloo and Horovod that name the
// interface, in the order they are followed. Given with -x, or set in
// gorun's environment (cmd/gorun reads them into Config.IfaceVars), they
// choose the interface the ranks bind, as --iface does.
var IfaceVars = []string{"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE"}

// ifaceHint is one place the command line or the environment names an
// interface, and what it says in GORUN_IFACE's syntax.
type ifaceHint struct {
	from string // as the user wrote it: "--mca btl_tcp_if_include eth0"
	spec rank.IfaceSpec
}

// ifaceHints collects the hints of the MCA parameters and of IfaceVars
// (the -x value, else gorun's environment's), in the order they are
// followed.
func ifaceHints(cfg Config, exports []string) ([]ifaceHint, error) {
	var hints []ifaceHint
	for _, im := range ifaceMCA {
		for _, m := range cfg.MCA {
			if m.Key != im.key {
				continue
			}
			v := m.Value
			if im.exclude {
				v = "^" + v
			}
			spec, err := rank.ParseIfaceSpec(v)
			if err != nil || spec.Addr != "" {
				return nil, usagef("%s: want interface names or subnets, comma-separated", m)
			}
			hints = append(hints, ifaceHint{m.String(), spec})
			break
		}
	}
	for _, name := range IfaceVars {
		v, from := "", ""
		for _, kv := range exports {
			if k, val, _ := strings.Cut(kv, "="); k == name {
				v, from = val, "-x "+kv
			}
		}
		if from == "" {
			val, ok := cfg.IfaceVars[name]
			if !ok {
				continue
			}
			v, from = val, name+"="+val+" (gorun's environment)"
		}
		spec, err := rank.ParseIfaceSpec(varSpec(name, v))
		if err != nil || spec.IsZero() {
			return nil, usagef("%s: not an interface list", from)
		}
		hints = append(hints, ifaceHint{from, spec})
	}
	return hints, nil
}

// varSpec turns the value of one of IfaceVars into GORUN_IFACE's syntax.
// NCCL_SOCKET_IFNAME: "eth" is a prefix (eth*), "=eth0" exact, "^" before
// either excludes; GLOO_SOCKET_IFNAME: exact names; HOROVOD_GLOO_IFACE: one
// exact name.
func varSpec(name, v string) string {
	v = strings.TrimSpace(v)
	if name != "NCCL_SOCKET_IFNAME" {
		return v
	}
	not := strings.HasPrefix(v, "^")
	v = strings.TrimPrefix(v, "^")
	exact := strings.HasPrefix(v, "=")
	v = strings.TrimPrefix(v, "=")
	items := strings.Split(v, ",")
	for i, it := range items {
		if it = strings.TrimSpace(it); !exact && it != "" {
			it += "*"
		}
		items[i] = it
	}
	s := strings.Join(items, ",")
	if not {
		s = "^" + s
	}
	return s
}

// chooseIface returns the interface the ranks are told (GORUN_IFACE, in
// its syntax; "" for none), where that came from (for errors), and the
// line gorun says about it ("" for none). --iface wins, then the hints in
// order; a hint that binds another address here than the chosen one is
// named as not followed. resolve gives the address a spec binds on this
// host.
func chooseIface(cfg Config, exports []string, resolve func(rank.IfaceSpec) (string, error)) (name, from, line string, err error) {
	hints, err := ifaceHints(cfg, exports)
	if err != nil {
		return "", "", "", err
	}
	var chosen rank.IfaceSpec
	if cfg.Iface != "" {
		if chosen, err = rank.ParseIfaceSpec(cfg.Iface); err != nil {
			return "", "", "", usagef("--iface %w", err)
		}
		from = fmt.Sprintf("--iface %q", cfg.Iface)
	}
	if len(hints) == 0 {
		return chosen.String(), from, "", nil
	}
	explicit := !chosen.IsZero()
	if !explicit {
		chosen, from = hints[0].spec, hints[0].from
	}
	here, hereErr := resolve(chosen)
	var agree, differ []string
	for _, h := range hints {
		ip, err := resolve(h.spec)
		if h.spec.String() == chosen.String() || err == nil && hereErr == nil && ip == here {
			agree = append(agree, h.from)
		} else {
			differ = append(differ, fmt.Sprintf("%s (as --iface %s)", h.from, shellQuote(h.spec.String())))
		}
	}
	name = chosen.String()
	switch {
	case explicit && len(differ) == 0:
	case explicit:
		verb := "chooses"
		if len(differ) > 1 {
			verb = "choose"
		}
		line = fmt.Sprintf("--iface %s wins over %s, which %s another interface here", shellQuote(cfg.Iface), strings.Join(differ, ", "), verb)
	default:
		line = fmt.Sprintf("%s: the ranks bind and advertise %s (as --iface %s)", strings.Join(agree, ", "), chosen.Describe(), shellQuote(name))
		if len(differ) > 0 {
			line += "; not followed: " + strings.Join(differ, ", ")
		}
	}
	return name, from, line, nil
}

// isIfaceMCA reports whether the MCA parameter key names interfaces.
func isIfaceMCA(key string) bool {
	for _, im := range ifaceMCA {
		if im.key == key {
			return true
		}
	}
	return false
}

// bindingLine is what OpenMPI's --report-bindings prints for a rank that
// is not bound, with the rank's host as placed and its pid.
func bindingLine(s Slot, pid int) string {
	return fmt.Sprintf("[%s:%d] MCW rank %d is not bound (or bound to all available processors)\n", s.Host, pid, s.Rank)
}

// printMap writes the placement as OpenMPI's --display-map does: the
// job's slots, then each host that got ranks, its slots and its ranks.
// Nothing is bound (gorun leaves placement on cores to the kernel).
func (p *plan) printMap(w io.Writer) {
	total := 0
	for _, h := range p.hostList {
		total += h.Slots
	}
	var b strings.Builder
	fmt.Fprintf(&b, " Data for JOB [%s] offset 0 Total slots allocated %d\n\n", p.jobID, total)
	b.WriteString(" ========================   JOB MAP   ========================\n")
	for _, h := range p.hostList {
		var ranks []Slot
		for _, sp := range p.specs {
			if sp.slot.Host == h.Name {
				ranks = append(ranks, sp.slot)
			}
		}
		fmt.Fprintf(&b, "\n Data for node: %s\tNum slots: %d\tMax slots: %d\tNum procs: %d\n", h.Name, h.Slots, h.MaxSlots, len(ranks))
		for _, s := range ranks {
			fmt.Fprintf(&b, " \tProcess jobid: [%s] App: 0 Process rank: %d Local rank: %d Bound: UNBOUND\n", p.jobID, s.Rank, s.LocalRank)
		}
	}
	b.WriteString("\n =============================================================\n")
	_, _ = io.WriteString(w, b.String())
}
