package envconf

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/rank"
)

// The mesh's variables that package rank's messages do not name (its
// others, rank.EnvTransport, rank.EnvIface, rank.EnvPortRange,
// rank.EnvConns, rank.EnvTimeout, rank.EnvTCPCipher, rank.EnvQUICGRO,
// rank.EnvShm and rank.EnvShmGroup, are declared there). docs/shm.md.
const (
	ShmCMA = "GORUN_SHM_CMA" // 1 (or on, true): single copies of large messages between ranks sharing memory
	ShmDir = "GORUN_SHM_DIR" // where the shared-memory segments are created (default /dev/shm)
)

// Mesh is opt with every field the program left at its zero value read
// from gorun's variables (rank.Options names each field's): a field the
// program sets wins, and its variable is not read, as when rank.Connect
// read them itself. A malformed GORUN_PORT_RANGE, GORUN_CONNS_PER_PEER,
// GORUN_TIMEOUT or GORUN_SHM is an error naming it; GORUN_TRANSPORT,
// GORUN_TCP_CIPHER and GORUN_QUIC_GRO are checked by rank.Connect, whose
// messages name them.
func Mesh(get Lookup, opt rank.Options) (rank.Options, error) {
	str := func(name string) string { v, _ := get(name); return v }
	if opt.Transport == "" {
		opt.Transport = str(rank.EnvTransport)
	}
	if opt.Iface == "" {
		opt.Iface = str(rank.EnvIface)
	}
	if opt.Ports.IsZero() {
		pr, err := rank.ParsePortRange(str(rank.EnvPortRange))
		if err != nil {
			return opt, fmt.Errorf("%s=%w", rank.EnvPortRange, err)
		}
		opt.Ports = pr
	}
	if opt.TCPCipher == "" {
		opt.TCPCipher = str(rank.EnvTCPCipher)
	}
	if opt.QUICGRO == "" {
		opt.QUICGRO = str(rank.EnvQUICGRO)
	}
	if v := str(rank.EnvConns); opt.ConnsPerPeer == 0 && v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 64 {
			return opt, fmt.Errorf("%s=%q: want an integer from 1 to 64", rank.EnvConns, v)
		}
		opt.ConnsPerPeer = n
	}
	if v := str(rank.EnvTimeout); opt.Timeout == 0 && v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return opt, fmt.Errorf("%s=%q: want a positive Go duration such as 60s", rank.EnvTimeout, v)
		}
		opt.Timeout = d
	}
	if v := strings.ToLower(strings.TrimSpace(opt.SharedMemory)); v == "" || v == "auto" {
		on, err := rank.ParseShm(rank.EnvShm, str(rank.EnvShm))
		if err != nil {
			return opt, err
		}
		if !on {
			opt.SharedMemory = "off"
		}
	}
	if str(rank.EnvShmGroup) == "0" {
		opt.NoGroup = true
	}
	if v := str(ShmCMA); v == "1" || v == "on" || v == "true" {
		opt.SingleCopy = true
	}
	if opt.ShmDir == "" {
		opt.ShmDir = str(ShmDir)
	}
	return opt, nil
}
