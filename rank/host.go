package rank

import (
	"fmt"
	"net"
	"os"
	"strings"
)

// This host: the address to listen on, and the keys that tell the ranks
// of one machine.

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// listenIP picks the address to listen on: the one iface names (an
// IfaceSpec, resolved on this host), else the local address that routes
// to the rendezvous.
func listenIP(iface, rendezvous string) (string, error) {
	route := func() (string, error) { return routeIP(rendezvous) }
	if iface == "" {
		return route()
	}
	spec, err := ParseIfaceSpec(iface)
	if err != nil {
		return "", fmt.Errorf("%s=%w", EnvIface, err)
	}
	ip, err := spec.Resolve(route)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", EnvIface, iface, err)
	}
	return ip, nil
}

// routeIP is the local address that routes to the rendezvous (its own
// address when it is on loopback).
func routeIP(rendezvous string) (string, error) {
	host, _, err := net.SplitHostPort(rendezvous)
	if err != nil {
		return "", err
	}
	if isLoopbackHost(host) {
		if host == "localhost" {
			return "127.0.0.1", nil
		}
		return host, nil
	}
	c, err := net.Dial("udp", net.JoinHostPort(host, "9"))
	if err != nil {
		return "", fmt.Errorf("no route to the rendezvous host %s: %w", host, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// hostKey identifies this machine and network namespace.
func hostKey() string {
	mid, _ := os.ReadFile("/etc/machine-id")
	ns, _ := os.Readlink("/proc/self/ns/net")
	h, _ := os.Hostname()
	return strings.TrimSpace(string(mid)) + "/" + h + "/" + ns
}

func hostName(id Identity) string {
	if id.Host != "" {
		return id.Host
	}
	h, _ := os.Hostname()
	return h
}
