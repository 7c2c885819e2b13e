// Package mpirun is gorun's launcher: hostfile parsing, slot-to-rank
// placement, local and remote (ssh or a launch agent) process start, rank
// output tagging, and the job lifecycle (first failure stops the job,
// signals reach every rank, no orphans). It moves processes, not data.
package mpirun

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// Host is one machine of the job and how many ranks it takes.
type Host struct {
	Name     string
	Slots    int // ranks placed before the next host is used (>= 1)
	MaxSlots int // hard cap even with oversubscription (0: no cap)
	Where    string
}

// maxCount bounds slot counts so that sums cannot overflow.
const maxCount = 1 << 20

// ParseHostfile reads a hostfile in OpenMPI syntax
//
//	host [slots=N] [max_slots=M]   # comment
//
// or Horovod's "host:N" lines (the two may be mixed). Blank lines and
// everything after '#' are ignored, and so is a UTF-8 byte-order mark at the
// start of the file (Windows editors write one). A host listed twice gets
// the sum of its slots. name is used in error messages ("hosts:3: ...").
func ParseHostfile(name string, r io.Reader) ([]Host, error) {
	var hosts []Host
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if line == 1 {
			text = strings.TrimPrefix(text, byteOrderMark)
		}
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		where := fmt.Sprintf("%s:%d", name, line)
		h, err := parseHostToken(fields[0])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		fromColon := h.Slots > 0
		if h.Slots == 0 {
			h.Slots = 1
		}
		seen := map[string]bool{}
		for _, f := range fields[1:] {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				return nil, fmt.Errorf("%s: %q: want key=value (slots=N or max_slots=M)", where, f)
			}
			key := strings.ToLower(strings.ReplaceAll(k, "-", "_"))
			if seen[key] {
				return nil, fmt.Errorf("%s: %s given twice", where, k)
			}
			seen[key] = true
			n, err := parseCount(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %s=%q: %w", where, k, v, err)
			}
			switch key {
			case "slots":
				if fromColon {
					return nil, fmt.Errorf("%s: %s gives slots twice (host:N and slots=)", where, fields[0])
				}
				h.Slots = n
			case "max_slots":
				if n < 1 {
					return nil, fmt.Errorf("%s: host %s: max_slots=0: a host's cap is at least its slots (leave max_slots out for no cap)", where, fields[0])
				}
				h.MaxSlots = n
			default:
				return nil, fmt.Errorf("%s: unknown key %q (want slots=N or max_slots=M)", where, k)
			}
		}
		if h.Slots < 1 {
			return nil, fmt.Errorf("%s: host %s has slots=0: a host needs at least 1 slot (remove the line to leave it out)", where, h.Name)
		}
		if h.MaxSlots != 0 && h.MaxSlots < h.Slots {
			return nil, fmt.Errorf("%s: host %s: max_slots=%d is less than slots=%d", where, h.Name, h.MaxSlots, h.Slots)
		}
		h.Where = where
		hosts = mergeHost(hosts, h)
	}
	if err := sc.Err(); err != nil {
		if err == bufio.ErrTooLong {
			return nil, fmt.Errorf("%s:%d: line longer than 1 MiB", name, line+1)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("%s: no hosts in the file", name)
	}
	return hosts, nil
}

// byteOrderMark is U+FEFF in UTF-8, which Windows editors put at the start
// of a text file.
const byteOrderMark = "\ufeff"

// ReadHostfile opens and parses a hostfile.
func ReadHostfile(path string) ([]Host, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("hostfile: %w", err)
	}
	defer f.Close()
	return ParseHostfile(path, f)
}

// ParseHostList parses -H's comma-separated "host[:N]" list
// ("a:2,b:2"; a host without :N has one slot; a host listed twice gets the
// sum).
func ParseHostList(list string) ([]Host, error) {
	var hosts []Host
	for i, tok := range strings.Split(list, ",") {
		tok = strings.TrimSpace(tok)
		if tok == "" {
			return nil, fmt.Errorf("-H %q: empty host name at position %d", list, i+1)
		}
		h, err := parseHostToken(tok)
		if err != nil {
			return nil, fmt.Errorf("-H %q: %w", list, err)
		}
		if h.Slots == 0 {
			h.Slots = 1
		}
		h.Where = "-H"
		hosts = mergeHost(hosts, h)
	}
	return hosts, nil
}

// parseHostToken parses "host", "host:N", "[v6addr]" or "[v6addr]:N".
// Slots is 0 when no count was given; ":0" is an error.
func parseHostToken(tok string) (Host, error) {
	var h Host
	name, count := tok, ""
	switch {
	case strings.HasPrefix(tok, "["):
		end := strings.IndexByte(tok, ']')
		if end < 0 {
			return h, fmt.Errorf("%q: missing ']'", tok)
		}
		name = tok[1:end]
		rest := tok[end+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return h, fmt.Errorf("%q: unexpected %q after ']'", tok, rest)
			}
			count = rest[1:]
			if count == "" {
				return h, fmt.Errorf("%q: missing slot count after ':'", tok)
			}
		}
	case strings.Count(tok, ":") > 1:
		if _, err := netip.ParseAddr(tok); err != nil {
			return h, fmt.Errorf("%q: not a host name, host:N, or IPv6 address (write [addr]:N)", tok)
		}
	case strings.Contains(tok, ":"):
		name, count, _ = strings.Cut(tok, ":")
		if count == "" {
			return h, fmt.Errorf("%q: missing slot count after ':'", tok)
		}
	}
	if err := checkHostName(name); err != nil {
		return h, fmt.Errorf("%q: %w", tok, err)
	}
	h.Name = name
	if count != "" {
		n, err := parseCount(count)
		if err != nil {
			return h, fmt.Errorf("%q: slot count %w", tok, err)
		}
		if n == 0 {
			return h, fmt.Errorf("host %s has 0 slots: a host needs at least 1 slot", name)
		}
		h.Slots = n
	}
	return h, nil
}

func parseCount(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a non-negative integer", s)
	}
	if n > maxCount {
		return 0, fmt.Errorf("%d is too large (max %d)", n, maxCount)
	}
	return n, nil
}

// checkHostName refuses names that ssh would take for options or that
// cannot be host names at all.
func checkHostName(name string) error {
	if name == "" {
		return fmt.Errorf("empty host name")
	}
	if strings.HasPrefix(name, "-") {
		return fmt.Errorf("host name may not start with '-'")
	}
	if strings.Contains(name, byteOrderMark) {
		// Two files joined into one, the second saved with a BOM.
		return fmt.Errorf("host name contains a byte-order mark (U+FEFF): save the hostfile as UTF-8 without BOM")
	}
	for _, c := range name {
		if c <= ' ' || c == 0x7f || strings.ContainsRune("=,'\"\\`$;&|<>()[]{}*?!", c) {
			return fmt.Errorf("host name contains %q", c)
		}
	}
	return nil
}

func mergeHost(hosts []Host, h Host) []Host {
	for i := range hosts {
		if hosts[i].Name == h.Name {
			hosts[i].Slots = min(hosts[i].Slots+h.Slots, maxCount)
			switch {
			case hosts[i].MaxSlots == 0 || h.MaxSlots == 0:
				hosts[i].MaxSlots = 0
			default:
				hosts[i].MaxSlots = min(hosts[i].MaxSlots+h.MaxSlots, maxCount)
			}
			return hosts
		}
	}
	return append(hosts, h)
}
