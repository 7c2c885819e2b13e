package rank

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestParseIfaceSpec(t *testing.T) {
	for in, want := range map[string]IfaceSpec{
		"":                  {},
		"192.0.2.7":         {Addr: "192.0.2.7"},
		"fd00::2":           {Addr: "fd00::2"},
		"eth0":              {Items: []string{"eth0"}},
		"eth0, ens5":        {Items: []string{"eth0", "ens5"}},
		"eth*":              {Items: []string{"eth*"}},
		"^docker*,lo":       {Exclude: true, Items: []string{"docker*", "lo"}},
		"10.0.0.0/24,eth1":  {Items: []string{"10.0.0.0/24", "eth1"}},
		"^127.0.0.1/8,sppp": {Exclude: true, Items: []string{"127.0.0.1/8", "sppp"}},
	} {
		got, err := ParseIfaceSpec(in)
		if err != nil || got.String() != want.String() || got.Exclude != want.Exclude || got.Addr != want.Addr {
			t.Errorf("ParseIfaceSpec(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"eth0,", ",", "^", "*", "10.0.0.0/33", "e th0", "eth0^", "a=b"} {
		if s, err := ParseIfaceSpec(in); err == nil {
			t.Errorf("ParseIfaceSpec(%q) = %+v, want an error", in, s)
		}
	}
}

// A host's interfaces as Resolve sees them: lo, eth0 and a docker bridge
// that are up, a down ib0, an eth1 without addresses.
var testIfaces = []hostIface{
	{name: "lo", up: true, loopback: true, addrs: addrs("127.0.0.1", "::1")},
	{name: "docker0", up: true, addrs: addrs("172.17.0.1")},
	{name: "eth0", up: true, addrs: addrs("fe80::1", "10.1.2.3", "fd00::3")},
	{name: "eth1", up: true},
	{name: "ib0", addrs: addrs("10.9.0.5")},
	{name: "ens5", up: true, addrs: addrs("fe80::5", "fd00::5")},
}

func addrs(ss ...string) []netip.Addr {
	var a []netip.Addr
	for _, s := range ss {
		a = append(a, netip.MustParseAddr(s))
	}
	return a
}

func TestIfaceSpecResolve(t *testing.T) {
	route := func(ip string) func() (string, error) {
		return func() (string, error) { return ip, nil }
	}
	noRoute := func() (string, error) { return "", errors.New("no route") }
	for _, c := range []struct {
		spec, route, want string
	}{
		{"192.0.2.7", "", "192.0.2.7"},
		{"eth0", "", "10.1.2.3"},           // its IPv4 address
		{"ens5", "", "fd00::5"},            // else its first address that is not link-local
		{"nope0,eth0", "", "10.1.2.3"},     // the first that exists
		{"eth1,docker0", "", "172.17.0.1"}, // one without an address is passed over
		{"ib0", "", "10.9.0.5"},            // named exactly: taken even when down
		{"eth*", "", "10.1.2.3"},           // a prefix: the first up with an address
		{"ib*,e*", "", "10.1.2.3"},         // ib0 is down
		{"10.9.0.0/16,172.16.0.0/12", "", "172.17.0.1"},
		{"fd00::/64", "", "fd00::3"},       // the address in the subnet
		{"^lo", "10.1.2.3", "10.1.2.3"},    // the route's interface
		{"^lo", "127.0.0.1", "172.17.0.1"}, // excluded: the first up, not loopback, not excluded
		{"^docker*,lo", "127.0.0.1", "10.1.2.3"},
		{"^docker*", "127.0.0.1", "127.0.0.1"}, // lo is not excluded
		{"^172.17.0.0/16,eth0", "172.17.0.1", "fd00::5"},
		{"^docker0", "", "10.1.2.3"}, // no route
	} {
		s, err := ParseIfaceSpec(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		r := noRoute
		if c.route != "" {
			r = route(c.route)
		}
		if got, err := s.resolve(testIfaces, r); err != nil || got != c.want {
			t.Errorf("%q (route %q): %q, %v; want %q", c.spec, c.route, got, err, c.want)
		}
	}
	for spec, want := range map[string]string{
		"nope0,nope1":           "no interface of this host matches nope0,nope1 (it has lo, docker0, eth0, eth1, ib0, ens5)",
		"eth1":                  "interface eth1 has no usable address",
		"ib*":                   "no interface of this host matches ib*",
		"192.168.0.0/16":        "no interface of this host matches 192.168.0.0/16",
		"^lo,docker0,eth*,ens5": "every interface of this host that is up and has an address is excluded by ^lo,docker0,eth*,ens5",
	} {
		s, _ := ParseIfaceSpec(spec)
		if got, err := s.resolve(testIfaces, route("127.0.0.1")); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%q: %q, %v; want the error %q", spec, got, err, want)
		}
	}
}

func TestIfaceSpecDescribe(t *testing.T) {
	for spec, want := range map[string]string{
		"eth0":        "eth0",
		"eth*":        "an interface named eth*",
		"eth0,ens5":   "the first of eth0 or ens5 that exists on each host",
		"10.0.0.0/8":  "the interface in 10.0.0.0/8",
		"^docker*,lo": "the interface of the route to the rendezvous unless it is docker* or lo, else the first up interface that is not loopback and not excluded",
	} {
		s, _ := ParseIfaceSpec(spec)
		if got := s.Describe(); got != want {
			t.Errorf("%q: %q, want %q", spec, got, want)
		}
	}
}

// listenIP resolves GORUN_IFACE on this host: names and lists of them,
// and an exclude list against the route to the rendezvous.
func TestListenIPFromIface(t *testing.T) {
	for iface, want := range map[string]string{"": "127.0.0.1", "lo": "127.0.0.1", "nosuch0,lo": "127.0.0.1", "lo*": "127.0.0.1", "127.0.0.0/8": "127.0.0.1"} {
		if got, err := listenIP(iface, "127.0.0.1:1234"); err != nil || got != want {
			t.Errorf("GORUN_IFACE=%q: %q %v; want %q", iface, got, err, want)
		}
	}
	if _, err := listenIP("nosuch0", "127.0.0.1:1"); err == nil || !strings.HasPrefix(err.Error(), "GORUN_IFACE=nosuch0: no interface of this host matches nosuch0 (it has lo") {
		t.Errorf("a missing interface: %v", err)
	}
	// ^lo on a job whose rendezvous is on loopback: another interface,
	// if this host has one that is up.
	other := ""
	for _, h := range hostIfaces() {
		if h.up && !h.loopback && h.address() != "" && other == "" {
			other = h.address()
		}
	}
	got, err := listenIP("^lo", "127.0.0.1:1")
	switch {
	case other == "" && err == nil:
		t.Errorf("^lo with no other interface up: %q", got)
	case other != "" && (err != nil || got != other || net.ParseIP(got).IsLoopback()):
		t.Errorf("^lo: %q %v; want %q", got, err, other)
	}
}
