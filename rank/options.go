package rank

import (
	"fmt"
	"time"
)

// Options configures a Mesh. The zero value picks the defaults. A library
// reads no environment: a program fills Options from gorun's variables
// once, at its edge (internal/envconf.Mesh; "Env:" names each variable).
type Options struct {
	// Transport is what carries messages between ranks that shared memory
	// does not connect: "auto" (default), "quic" or "tcp" (TLS over TCP).
	// Both are encrypted and authenticated with the job secret. "auto"
	// connects both; when the job spans hosts, a start-up probe between
	// rank 0 and the first rank on another host measures each, and the
	// faster carries the data (choose.go); on one host it is QUIC. Every
	// rank of a job must use the same setting. Env: GORUN_TRANSPORT.
	Transport string
	// Iface is the address (or interface name, or list: IfaceSpec) to
	// listen on and advertise. Default: the local address that routes to
	// the rendezvous. Env: GORUN_IFACE.
	Iface string
	// Ports is where the UDP (QUIC) and TCP (TLS/TCP) ports are taken
	// from, the first free of each. (The rendezvous that rank 0 serves
	// under a foreign launcher is on the port its address names.)
	// Default: any free port. Env: GORUN_PORT_RANGE.
	Ports PortRange
	// ConnsPerPeer stripes the channels to one peer over this many QUIC
	// connections (one quic-go connection is driven by one goroutine and
	// tops out near 0.3 GB/s here; more connections use more cores).
	// Env: GORUN_CONNS_PER_PEER. Default 2.
	ConnsPerPeer int
	// Channels is the number of independent ordered lanes per peer.
	// Default: max(2, ConnsPerPeer).
	Channels int
	// Timeout bounds every wait: rendezvous, connecting, and each Send or
	// Recv that makes no progress (a wait for a live peer lasts up to twice
	// as long; stall.go). It also sets the QUIC keep-alive period (an
	// eighth of it, at most 2s) and idle timeout (three times it). Env:
	// GORUN_TIMEOUT (Go duration). Default 60s.
	Timeout time.Duration
	// SharedMemory: ranks on the same host exchange messages through
	// shared-memory rings instead of sockets (docs/shm.md): "" or "auto"
	// (default) or "on", or "off". Env: GORUN_SHM.
	SharedMemory string
	// NoGroup: the host's lowest rank maps no group segment (LocalGroup),
	// so collectives use the pair rings. Env: GORUN_SHM_GROUP=0.
	NoGroup bool
	// SingleCopy: messages of 64 KiB or more between two ranks sharing
	// memory travel in one copy where the receiver may read the sender's
	// memory (process_vm_readv; shm.go). Off by default: on 2 cores the
	// two-copy ring moved more (docs/shm.md). Env: GORUN_SHM_CMA=1.
	SingleCopy bool
	// ShmDir is where the shared-memory segments are created (and unlinked
	// at once). Default /dev/shm. Env: GORUN_SHM_DIR.
	ShmDir string
	// TCPCipher seals the TLS/TCP lanes' records: "auto" (default)
	// seals with AEGIS-128X4 between two ranks whose CPUs have VAES on
	// AVX-512, else with AES-128-GCM; "aes-gcm" always with AES-128-GCM
	// (sealed.go). Ranks may differ: each lane takes what both ends
	// offer. Env: GORUN_TCP_CIPHER.
	TCPCipher string
	// QUICGRO: "auto" (default) receives QUIC's datagrams with UDP_GRO
	// where the kernel has it (gro.go: a run of datagrams from one sender
	// comes in one buffer); "off" reads them one by one, as quic-go does
	// on its own. Ranks may differ. Env: GORUN_QUIC_GRO.
	QUICGRO string
}

// autoOr sets an option left empty to "auto", and refuses anything but
// "auto" and other, naming the variable env that sets it.
func autoOr(v *string, env, other string) error {
	if *v == "" {
		*v = "auto"
	}
	if *v != "auto" && *v != other {
		return fmt.Errorf("%s=%q: want auto or %s", env, *v, other)
	}
	return nil
}

// defaultShmDir is where shared-memory segments go unless Options.ShmDir
// says otherwise.
const defaultShmDir = "/dev/shm"

func (o Options) withDefaults() (Options, error) {
	if o.Transport == "" {
		o.Transport = "auto"
	}
	if o.Transport != "auto" && o.Transport != "quic" && o.Transport != "tcp" {
		return o, fmt.Errorf("unknown transport %q (want auto, quic or tcp; from %s or options)", o.Transport, EnvTransport)
	}
	if err := autoOr(&o.TCPCipher, EnvTCPCipher, "aes-gcm"); err != nil {
		return o, err
	}
	if err := autoOr(&o.QUICGRO, EnvQUICGRO, "off"); err != nil {
		return o, err
	}
	if o.ConnsPerPeer <= 0 {
		o.ConnsPerPeer = 2
	}
	if o.Channels <= 0 {
		o.Channels = max(2, o.ConnsPerPeer)
	}
	if o.Channels > 256 {
		return o, fmt.Errorf("%d channels per peer is too many (max 256)", o.Channels)
	}
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
	if _, err := shmEnabled(o.SharedMemory); err != nil {
		return o, err
	}
	if o.ShmDir == "" {
		o.ShmDir = defaultShmDir
	}
	return o, nil
}
