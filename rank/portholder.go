package rank

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Who holds a UDP port on this host. The rendezvous is QUIC, over UDP, and
// a process that has bound the port but does not speak QUIC answers
// nothing at all: to a dialing rank it looks like a rendezvous not started
// yet (ICMP "port unreachable", which would tell the two apart, does not
// reach quic-go's unconnected socket, and a firewall that drops packets
// looks the same from another host). On the rendezvous' own host the
// kernel's socket table (/proc/net/udp, Linux) does tell them apart: a
// socket is bound to the port, or none is. Elsewhere (another host, not
// Linux) these find nothing and a rank waits its timeout as before.

// portHolder is a socket bound to a UDP port of this host, and the process
// that holds it where this user can see it.
type portHolder struct {
	port  int
	inode uint64
	uid   int
	pid   int    // 0: not found (another user's process)
	comm  string // the process's name
}

func (h *portHolder) String() string {
	switch {
	case h.pid == os.Getpid():
		return fmt.Sprintf("this process (%d, %s)", h.pid, h.comm)
	case h.pid > 0:
		return fmt.Sprintf("process %d (%s)", h.pid, h.comm)
	}
	return fmt.Sprintf("a process of uid %d that this user cannot see (socket inode %d)", h.uid, h.inode)
}

// udpHolder returns the socket bound to UDP port on this host that
// datagrams to ip would reach: bound to ip itself or to every address, and
// not connected to a peer. nil when there is none, or the table cannot be
// read.
func udpHolder(ip net.IP, port int) *portHolder {
	for _, f := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		if h := udpHolderIn(f, ip, port); h != nil {
			h.pid, h.comm = socketOwner(h.inode)
			return h
		}
	}
	return nil
}

// udpHolderIn reads one of the kernel's UDP socket tables:
//
//	sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ...
//	0: 0100007F:7530 00000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 123456 ...
func udpHolderIn(path string, ip net.IP, port int) *portHolder {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 {
			continue
		}
		lip, lport, ok := procAddr(fs[1])
		if !ok || lport != port {
			continue
		}
		if rip, _, ok := procAddr(fs[2]); !ok || !rip.IsUnspecified() {
			continue // connected: it receives from its peer only
		}
		if !lip.IsUnspecified() && ip != nil && !ip.IsUnspecified() && !lip.Equal(ip) {
			continue
		}
		uid, _ := strconv.Atoi(fs[7])
		inode, _ := strconv.ParseUint(fs[9], 10, 64)
		return &portHolder{port: port, inode: inode, uid: uid}
	}
	return nil
}

// procAddr parses an address of /proc/net/udp{,6}: the IP as 32-bit words
// in hex, each in this machine's byte order, a colon and the port in hex.
func procAddr(s string) (net.IP, int, bool) {
	h, p, ok := strings.Cut(s, ":")
	if !ok || (len(h) != 8 && len(h) != 32) {
		return nil, 0, false
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return nil, 0, false
	}
	raw, err := hex.DecodeString(h)
	if err != nil {
		return nil, 0, false
	}
	ip := make(net.IP, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(ip[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	return ip, int(port), true
}

// socketOwner finds the process with socket inode open, among those this
// user may look into; 0 when none is found.
func socketOwner(inode uint64) (int, string) {
	if inode == 0 {
		return 0, ""
	}
	want := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, ""
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name())); err == nil && l == want {
				comm, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
				return pid, strings.TrimSpace(string(comm))
			}
		}
	}
	return 0, ""
}

// localIP is the address of host if it is one of this host's (a loopback
// address, or one of its interfaces'), else nil.
func localIP(host string) net.IP {
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		cancel()
		if err != nil {
			return nil
		}
		for _, a := range addrs {
			ips = append(ips, a.IP)
		}
	}
	ifaddrs, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IsLoopback() || ip.IsUnspecified() {
			return ip
		}
		for _, a := range ifaddrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return ip
			}
		}
	}
	return nil
}

// localPort splits addr into its IP and port where the IP is one of this
// host's; ok is false for another host's address (or one that does not
// resolve).
func localPort(addr string) (ip net.IP, port int, ok bool) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, 0, false
	}
	port, err = strconv.Atoi(p)
	if err != nil {
		return nil, 0, false
	}
	ip = localIP(host)
	return ip, port, ip != nil
}

// holderCheck returns a function that finds the holder of addr's UDP port
// when addr is on this host (nil otherwise); it resolves addr once, at its
// first call.
func holderCheck(addr string) func() *portHolder {
	var ip net.IP
	var port int
	var ok, resolved bool
	return func() *portHolder {
		if !resolved {
			ip, port, ok = localPort(addr)
			resolved = true
		}
		if !ok {
			return nil
		}
		return udpHolder(ip, port)
	}
}

// boundHolder is the holder of the UDP port of addr (host:port to listen
// on; an empty host is every address) on this host, or nil.
func boundHolder(addr string) *portHolder {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return nil
	}
	var ip net.IP // every address: any holder of the port is in the way
	if host != "" {
		if ip = localIP(host); ip == nil {
			return nil
		}
	}
	return udpHolder(ip, port)
}
