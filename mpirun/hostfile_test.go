package mpirun

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseHostfile(t *testing.T) {
	cases := []struct {
		name, in string
		want     []Host
		err      string // substring of the error; "" = no error
	}{
		{"openmpi", "a slots=2\nb slots=4 max_slots=6\nc\n", []Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 4, MaxSlots: 6}, {Name: "c", Slots: 1}}, ""},
		{"comments and blanks", "# cluster\n\n  a slots=2   # two GPUs\n\t\n#b slots=9\nc slots=1\n", []Host{{Name: "a", Slots: 2}, {Name: "c", Slots: 1}}, ""},
		{"horovod", "a:4\nb:2\n", []Host{{Name: "a", Slots: 4}, {Name: "b", Slots: 2}}, ""},
		{"mixed", "a:4\nb slots=2\n", []Host{{Name: "a", Slots: 4}, {Name: "b", Slots: 2}}, ""},
		{"dash key", "a slots=2 max-slots=3\n", []Host{{Name: "a", Slots: 2, MaxSlots: 3}}, ""},
		{"horovod with max", "a:2 max_slots=4\n", []Host{{Name: "a", Slots: 2, MaxSlots: 4}}, ""},
		{"duplicate merges", "a slots=2\nb\na slots=3\n", []Host{{Name: "a", Slots: 5}, {Name: "b", Slots: 1}}, ""},
		{"ipv6", "::1 slots=2\n[fe80::1]:3\n", []Host{{Name: "::1", Slots: 2}, {Name: "fe80::1", Slots: 3}}, ""},
		{"crlf", "a slots=2\r\nb:1\r\n", []Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 1}}, ""},
		// Windows editors start a UTF-8 file with a byte-order mark.
		{"bom", "\ufeffa slots=2\r\nb:1\r\n", []Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 1}}, ""},
		{"bom then comment", "\ufeff# hosts\na:2\n", []Host{{Name: "a", Slots: 2}}, ""},
		{"bom inside", "a\n\ufeffb\n", nil, `hosts:2: "\ufeffb": host name contains a byte-order mark`},
		{"slots zero", "a slots=2\nb slots=0\n", nil, "hosts:2: host b has slots=0"},
		{"colon zero", "a:0\n", nil, "hosts:1: host a has 0 slots"},
		{"negative", "a slots=-1\n", nil, "hosts:1: slots=\"-1\""},
		{"not a number", "\n\na slots=two\n", nil, "hosts:3: slots=\"two\""},
		{"unknown key", "a slots=1 cpus=2\n", nil, "hosts:1: unknown key \"cpus\""},
		{"no equals", "a 4\n", nil, "hosts:1: \"4\": want key=value"},
		{"slots twice", "a slots=1 slots=2\n", nil, "hosts:1: slots given twice"},
		{"colon and slots", "a:2 slots=2\n", nil, "hosts:1: a:2 gives slots twice"},
		{"max below slots", "a slots=4 max_slots=2\n", nil, "hosts:1: host a: max_slots=2 is less than slots=4"},
		{"max zero", "a slots=2 max_slots=0\n", nil, "hosts:1: host a: max_slots=0: a host's cap is at least its slots (leave max_slots out for no cap)"},
		{"empty count", "a:\n", nil, "hosts:1: \"a:\": missing slot count"},
		{"dash host", "-oProxyCommand=x\n", nil, "hosts:1: \"-oProxyCommand=x\": host name may not start with '-'"},
		{"shell chars", "a;b\n", nil, "hosts:1: \"a;b\": host name contains ';'"},
		{"bad v6", "a:b:c\n", nil, "hosts:1: \"a:b:c\": not a host name"},
		{"huge", "a slots=99999999999999999999\n", nil, "hosts:1: slots="},
		{"empty file", "# nothing\n\n", nil, "hosts: no hosts in the file"},
		// max_slots equal to slots is a cap, not an error.
		{"max equals slots", "a slots=2 max_slots=2\n", []Host{{Name: "a", Slots: 2, MaxSlots: 2}}, ""},
		// A host listed twice: slots and max_slots both add up.
		{"duplicate merges max_slots", "a slots=1 max_slots=2\nb\na slots=2 max_slots=3\n", []Host{{Name: "a", Slots: 3, MaxSlots: 5}, {Name: "b", Slots: 1}}, ""},
		{"duplicate uncaps", "a slots=1 max_slots=2\na slots=1\n", []Host{{Name: "a", Slots: 2}}, ""},
		{"largest count", "a slots=1048576\n", []Host{{Name: "a", Slots: 1 << 20}}, ""},
		{"count too large", "a\nb slots=1048577\n", nil, "hosts:2: slots=\"1048577\": 1048577 is too large"},
		// The two spellings of a key are one key.
		{"max_slots twice, two spellings", "a max_slots=2 max-slots=3\n", nil, "hosts:1: max-slots given twice"},
		{"slots twice, two cases", "a slots=1 SLOTS=2\n", nil, "hosts:1: SLOTS given twice"},
		{"line too long", "a\n\nb slots=1 " + strings.Repeat("x", 1<<20) + "\n", nil, "hosts:3: line longer than 1 MiB"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseHostfile("hosts", strings.NewReader(c.in))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one containing %q", err, c.err)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Fatalf("error has more than one line: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if !strings.HasPrefix(got[i].Where, "hosts:") {
					t.Errorf("host %d: Where = %q", i, got[i].Where)
				}
				got[i].Where = ""
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestReadHostfile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "hosts")
	os.WriteFile(p, []byte("a slots=2\nb slots=x\n"), 0o644)
	_, err := ReadHostfile(p)
	if err == nil || !strings.HasPrefix(err.Error(), p+":2: ") {
		t.Fatalf("error %v, want it to start with %s:2:", err, p)
	}
	// A hostfile saved by a Windows editor: a byte-order mark, CRLF.
	bom := filepath.Join(dir, "hosts-bom")
	os.WriteFile(bom, []byte("\xef\xbb\xbfnode1 slots=2\r\nnode2:1\r\n"), 0o644)
	hs, err := ReadHostfile(bom)
	if err != nil || len(hs) != 2 || hs[0].Name != "node1" || hs[0].Slots != 2 || hs[1].Name != "node2" {
		t.Fatalf("hostfile with a byte-order mark: %+v, %v", hs, err)
	}
	_, err = ReadHostfile(filepath.Join(dir, "missing"))
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing hostfile: %v", err)
	}
	// The example at the repository root parses.
	hs, err = ReadHostfile("../hostfile.example")
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) < 2 {
		t.Fatalf("hostfile.example has %d hosts", len(hs))
	}
}

func TestParseHostList(t *testing.T) {
	cases := []struct {
		in   string
		want []Host
		err  string
	}{
		{"a:2,b:2", []Host{{Name: "a", Slots: 2, Where: "-H"}, {Name: "b", Slots: 2, Where: "-H"}}, ""},
		{"a,b,a", []Host{{Name: "a", Slots: 2, Where: "-H"}, {Name: "b", Slots: 1, Where: "-H"}}, ""},
		{"localhost:4", []Host{{Name: "localhost", Slots: 4, Where: "-H"}}, ""},
		{"[::1]:2", []Host{{Name: "::1", Slots: 2, Where: "-H"}}, ""},
		{"a:2,,b", nil, "empty host name at position 2"},
		{"a:0", nil, "0 slots"},
		{"a:x", nil, "slot count \"x\""},
		{"", nil, "empty host name"},
		{"a b:2", nil, "host name contains ' '"},
		{"a:1,-oProxyCommand=x", nil, "host name may not start with '-'"},
	}
	for _, c := range cases {
		got, err := ParseHostList(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q: got %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

func FuzzParseHostfile(f *testing.F) {
	for _, s := range []string{
		"a slots=2\nb slots=4 max_slots=6\n", "a:4\n# c\n\nb:2", "::1 slots=2\n[fe80::1]:3",
		"a slots=0", "a:0", "a slots=1 slots=2", "[", "[]:", "a:b:c", "x max_slots=1 slots=1\nx slots=1\n",
		"a slots=1048576\na slots=1048576", "\xff\xfe slots=1", "a\x00b", "\ufeffa:2", "a\n\ufeffb",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hosts, err := ParseHostfile("fuzz", strings.NewReader(s))
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		total := 0
		for _, h := range hosts {
			if h.Slots < 1 || h.Name == "" || (h.MaxSlots != 0 && h.MaxSlots < h.Slots) {
				t.Fatalf("invalid host accepted: %+v from %q", h, s)
			}
			total += h.Slots
		}
		// Whatever parses can be placed.
		np := min(total, 64)
		slots, err := Place(hosts, np, MapByNode, false)
		if err != nil || len(slots) != np {
			t.Fatalf("Place(%+v, %d): %v", hosts, np, err)
		}
	})
}

func TestPlace(t *testing.T) {
	hs := func(spec ...string) []Host {
		var out []Host
		for _, s := range spec {
			var h Host
			var n, m int
			if k, _ := fmt.Sscanf(s, "%1s:%d:%d", &h.Name, &n, &m); k < 2 {
				t.Fatalf("bad spec %q", s)
			}
			h.Slots, h.MaxSlots = n, m
			out = append(out, h)
		}
		return out
	}
	// layout writes host/local/node per rank: "a0/0 a1/0 b0/1".
	layout := func(ss []Slot) string {
		var parts []string
		for _, s := range ss {
			parts = append(parts, fmt.Sprintf("%s%d/%d/%d", s.Host, s.LocalRank, s.LocalSize, s.NodeRank))
		}
		return strings.Join(parts, " ")
	}
	cases := []struct {
		hosts  []Host
		np     int
		mapBy  string
		over   bool
		want   string
		errSub string
	}{
		{hs("a:2", "b:2"), 4, MapBySlot, false, "a0/2/0 a1/2/0 b0/2/1 b1/2/1", ""},
		{hs("a:2", "b:2"), 3, MapBySlot, false, "a0/2/0 a1/2/0 b0/1/1", ""},
		{hs("a:2", "b:2"), 2, MapBySlot, false, "a0/2/0 a1/2/0", ""},
		{hs("a:2", "b:2"), 4, MapByNode, false, "a0/2/0 b0/2/1 a1/2/0 b1/2/1", ""},
		{hs("a:3", "b:1"), 4, MapByNode, false, "a0/3/0 b0/1/1 a1/3/0 a2/3/0", ""},
		{hs("a:1", "b:1"), 5, MapBySlot, true, "a0/3/0 b0/2/1 a1/3/0 b1/2/1 a2/3/0", ""},
		{hs("a:1:2", "b:1"), 5, MapBySlot, true, "a0/2/0 b0/3/1 a1/2/0 b1/3/1 b2/3/1", ""},
		{hs("a:2", "b:2"), 5, MapBySlot, false, "", "-np 5 is more than the 4 slots of a:2, b:2; add --oversubscribe"},
		{hs("a:1:2", "b:1:1"), 4, MapBySlot, true, "", "-np 4 is more than the 3 max_slots"},
		{hs("a:2"), 0, MapBySlot, false, "", "need at least 1 rank"},
		{hs("a:2"), 1, "core", false, "", "--map-by \"core\""},
		{nil, 1, MapBySlot, false, "", "no hosts"},
	}
	for i, c := range cases {
		got, err := Place(c.hosts, c.np, c.mapBy, c.over)
		if c.errSub != "" {
			if err == nil || !strings.Contains(err.Error(), c.errSub) {
				t.Errorf("case %d: error %v, want %q", i, err, c.errSub)
			}
			continue
		}
		if err != nil {
			t.Errorf("case %d: %v", i, err)
			continue
		}
		for r, s := range got {
			if s.Rank != r {
				t.Errorf("case %d: slot %d has rank %d", i, r, s.Rank)
			}
		}
		if l := layout(got); l != c.want {
			t.Errorf("case %d: got %s, want %s", i, l, c.want)
		}
	}
}
