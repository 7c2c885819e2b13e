package mpirun

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"time"
)

// IsLocalHost reports whether name is this machine: "localhost", this
// machine's host name (full or short), or one of the addresses of its
// interfaces (127.0.0.1 and ::1 included). Other loopback addresses such as
// 127.0.0.2 are not assigned to an interface and count as remote, which
// tests use to exercise the remote path on one machine. No DNS is asked.
func IsLocalHost(name string) bool {
	n := strings.ToLower(strings.TrimSuffix(name, "."))
	if n == "localhost" || n == "localhost.localdomain" || n == "ip6-localhost" {
		return true
	}
	if hn, err := os.Hostname(); err == nil && hn != "" {
		hn = strings.ToLower(hn)
		short, _, _ := strings.Cut(hn, ".")
		if n == hn || n == short {
			return true
		}
	}
	a, err := netip.ParseAddr(n)
	if err != nil {
		return false
	}
	a = a.Unmap().WithZone("")
	if a == netip.MustParseAddr("127.0.0.1") || a == netip.IPv6Loopback() {
		return true
	}
	addrs, _ := net.InterfaceAddrs()
	for _, ia := range addrs {
		if ipn, ok := ia.(*net.IPNet); ok {
			if b, ok := netip.AddrFromSlice(ipn.IP); ok && b.Unmap() == a {
				return true
			}
		}
	}
	return false
}

// routeSource is the local address the kernel would use to reach host
// (no packet is sent).
func routeSource(host string) (string, error) {
	c, err := net.Dial("udp", net.JoinHostPort(host, "9"))
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// rendezvousIP picks the address gorun serves the rendezvous on: loopback
// when every rank is local, else the source address of the route to the
// first remote host that resolves (through ssh -G when ssh is the
// launcher, so that ssh_config aliases work), else the source address of
// the default route, else the first non-loopback address of an interface
// that is up.
func rendezvousIP(remote []string, sshWords, environ []string) string {
	if len(remote) == 0 {
		return "127.0.0.1"
	}
	for _, h := range remote {
		if len(sshWords) > 0 {
			if real := sshHostName(sshWords, h, environ); real != "" && real != h {
				if ip, err := routeSource(real); err == nil {
					return ip
				}
			}
		}
		if ip, err := routeSource(h); err == nil {
			return ip
		}
	}
	if ip, err := routeSource("192.0.2.1"); err == nil { // TEST-NET-1: only the route is looked up
		return ip
	}
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// sshHostName asks ssh which address it would connect to for host
// ("ssh -G" prints the configuration without connecting), ssh run with
// environ, gorun's environment.
func sshHostName(sshWords []string, host string, environ []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	args := append(append([]string(nil), sshWords[1:]...), "-G", host)
	cmd := exec.CommandContext(ctx, sshWords[0], args...)
	cmd.Env = childEnv(environ)
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == "hostname" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
