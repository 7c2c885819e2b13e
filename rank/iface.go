package rank

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// IfaceSpec is what GORUN_IFACE (gorun's --iface) says about the address a
// rank binds and advertises. It is resolved on each host, since hosts have
// their own interfaces and addresses:
//
//	192.0.2.7        that address
//	eth0             that interface (its first IPv4 address, else its first
//	                 address that is not link-local)
//	eth0,ens5        the first of these interfaces that exists on the host
//	eth*             an interface whose name starts with eth (the first one
//	                 that is up and has an address)
//	10.0.0.0/24      the interface with an address in this subnet
//	^docker*,lo      exclude: the interface of the route to the rendezvous
//	                 unless excluded, else the first interface that is up,
//	                 not loopback and not excluded
//
// The list forms are what OpenMPI's btl_tcp_if_include / _exclude, NCCL's
// NCCL_SOCKET_IFNAME and Gloo's GLOO_SOCKET_IFNAME say, which gorun turns
// into this syntax.
type IfaceSpec struct {
	Addr    string   // an IP address; then nothing else is set
	Exclude bool     // Items are excluded
	Items   []string // interface names, name prefixes ending in *, or subnets
}

// ParseIfaceSpec reads a GORUN_IFACE value (see IfaceSpec); "" is the zero
// spec (the route to the rendezvous decides).
func ParseIfaceSpec(s string) (IfaceSpec, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return IfaceSpec{}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return IfaceSpec{Addr: a.String()}, nil
	}
	var spec IfaceSpec
	if rest, ok := strings.CutPrefix(s, "^"); ok {
		spec.Exclude, s = true, rest
	}
	for _, it := range strings.Split(s, ",") {
		it = strings.TrimSpace(it)
		switch {
		case it == "" || it == "*":
			return IfaceSpec{}, fmt.Errorf("%q: an empty interface name in the list", s)
		case strings.Contains(it, "/"):
			if _, err := netip.ParsePrefix(it); err != nil {
				return IfaceSpec{}, fmt.Errorf("%q: %q is not a subnet such as 10.0.0.0/24", s, it)
			}
		case strings.ContainsAny(strings.TrimSuffix(it, "*"), " *^=:"):
			return IfaceSpec{}, fmt.Errorf("%q: %q is not an interface name", s, it)
		}
		spec.Items = append(spec.Items, it)
	}
	return spec, nil
}

// IsZero reports whether s says nothing.
func (s IfaceSpec) IsZero() bool { return s.Addr == "" && len(s.Items) == 0 }

// String is s in GORUN_IFACE's syntax.
func (s IfaceSpec) String() string {
	if s.Addr != "" {
		return s.Addr
	}
	list := strings.Join(s.Items, ",")
	if s.Exclude {
		return "^" + list
	}
	return list
}

// Describe says in words what s binds, for a launcher's message.
func (s IfaceSpec) Describe() string {
	switch {
	case s.Addr != "":
		return s.Addr
	case s.Exclude:
		return "the interface of the route to the rendezvous unless it is " + orList(s.Items) +
			", else the first up interface that is not loopback and not excluded"
	case len(s.Items) == 1 && !isPattern(s.Items[0]):
		return s.Items[0]
	case len(s.Items) == 1:
		return describeItem(s.Items[0])
	}
	words := make([]string, len(s.Items))
	for i, it := range s.Items {
		words[i] = describeItem(it)
	}
	return "the first of " + orList(words) + " that exists on each host"
}

func describeItem(it string) string {
	switch {
	case strings.HasSuffix(it, "*"):
		return "an interface named " + it
	case strings.Contains(it, "/"):
		return "the interface in " + it
	}
	return it
}

func isPattern(it string) bool { return strings.HasSuffix(it, "*") || strings.Contains(it, "/") }

func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// hostIface is one interface of the host, as Resolve sees it.
type hostIface struct {
	name         string
	up, loopback bool
	addrs        []netip.Addr
}

// hostIfaces lists this host's interfaces.
func hostIfaces() []hostIface {
	ifs, _ := net.Interfaces()
	out := make([]hostIface, 0, len(ifs))
	for _, ifc := range ifs {
		h := hostIface{name: ifc.Name, up: ifc.Flags&net.FlagUp != 0, loopback: ifc.Flags&net.FlagLoopback != 0}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if b, ok := netip.AddrFromSlice(ipn.IP); ok {
					h.addrs = append(h.addrs, b.Unmap())
				}
			}
		}
		out = append(out, h)
	}
	return out
}

// address is the interface's address to bind: its first IPv4 address,
// else its first address that is not link-local; "" if none.
func (h hostIface) address() string {
	first := ""
	for _, a := range h.addrs {
		if a.Is4() {
			return a.String()
		}
		if first == "" && !a.IsLinkLocalUnicast() {
			first = a.String()
		}
	}
	return first
}

// matches reports whether item names h (or a subnet one of its addresses
// is in), and which address then.
func (h hostIface) matches(item string) (bool, string) {
	if p, err := netip.ParsePrefix(item); err == nil {
		for _, a := range h.addrs {
			if p.Contains(a) {
				return true, a.String()
			}
		}
		return false, ""
	}
	if prefix, ok := strings.CutSuffix(item, "*"); ok {
		return strings.HasPrefix(h.name, prefix), h.address()
	}
	return h.name == item, h.address()
}

// Resolve returns the address s binds on this host. route gives the
// address the kernel would use to reach the rendezvous; an exclude list
// asks it.
func (s IfaceSpec) Resolve(route func() (string, error)) (string, error) {
	return s.resolve(hostIfaces(), route)
}

func (s IfaceSpec) resolve(ifs []hostIface, route func() (string, error)) (string, error) {
	if s.Addr != "" {
		return s.Addr, nil
	}
	if s.Exclude {
		return s.resolveExclude(ifs, route)
	}
	var noAddr error // an interface named exactly, without an address
	for _, it := range s.Items {
		exact := !isPattern(it)
		for _, h := range ifs {
			ok, addr := h.matches(it)
			switch {
			case !ok:
				continue
			case addr != "" && (exact || h.up):
				return addr, nil
			case exact && noAddr == nil:
				noAddr = fmt.Errorf("interface %s has no usable address", h.name)
			}
		}
	}
	if noAddr != nil {
		return "", noAddr
	}
	return "", fmt.Errorf("no interface of this host matches %s (it has %s)", strings.Join(s.Items, ","), names(ifs))
}

func (s IfaceSpec) resolveExclude(ifs []hostIface, route func() (string, error)) (string, error) {
	excluded := func(h hostIface) bool {
		for _, it := range s.Items {
			if ok, _ := h.matches(it); ok {
				return true
			}
		}
		return false
	}
	if ip, err := route(); err == nil {
		if a, err := netip.ParseAddr(ip); err == nil {
			for _, h := range ifs {
				for _, b := range h.addrs {
					if b == a.Unmap() && !excluded(h) {
						return ip, nil
					}
				}
			}
		}
	}
	for _, h := range ifs {
		if h.up && !h.loopback && !excluded(h) {
			if addr := h.address(); addr != "" {
				return addr, nil
			}
		}
	}
	return "", fmt.Errorf("every interface of this host that is up and has an address is excluded by ^%s (it has %s)", strings.Join(s.Items, ","), names(ifs))
}

func names(ifs []hostIface) string {
	n := make([]string, len(ifs))
	for i, h := range ifs {
		n[i] = h.name
	}
	if len(n) == 0 {
		return "no interfaces"
	}
	return strings.Join(n, ", ")
}
