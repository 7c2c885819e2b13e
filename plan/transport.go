package plan

import (
	"fmt"
	"strings"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/rank/choice"
)

// Transport is what carries an allreduce's messages, as the planner sees
// it: the cost of one ring step or tree hop apart from the bytes, and the
// rate one connection reaches when the CPU, not the link, is the limit.
type Transport struct {
	Name string
	// StepUs: one ring step or tree hop on an idle link of no latency (µs),
	// both sides' software.
	StepUs float64
	// CapGBs: GB/s each way one connection carries with both directions
	// busy (every ring step sends and receives) and a core for each side.
	CapGBs float64
}

// The transports gorun runs, measured on this project's 2-core AMD EPYC
// VM on 2026-11-25 (two sittings, 04:42 and 04:43 UTC, commit bf2e97d:
// sealed records and 96 KiB slices across hosts): bench/peers/
// plan_validate.sh's first stage (PRESETS=none), allreduce-perf -W half
// -a ring between the two namespace test hosts (test/hosts, sharing the
// machine's 2 cores, one rank each, GOMAXPROCS=2 as nmt-train runs) on a
// 10 Gbit/s tbf link, which neither transport fills on 2 cores, 4 KiB to
// 64 MiB, twice per sitting. The cap is fitted to the sizes of 512 KiB
// and more on the wire, the step to those up to 32 KiB; the constants are
// the means of the two sittings (TLS/TCP 82 and 80 µs, 0.812 and 0.768
// GB/s; QUIC 92 and 102 µs, 0.206 and 0.215 GB/s). docs/plan.md has the
// tables and the fits before. On other machines these are other numbers:
// they are the transports' CPU cost per message and per byte on these
// cores.
// Shared memory (np 4): docs/performance.md's sitting of 2026-11-24 06:04
// and, for the pair rings' rate, docs/collective.md's 23:38 sitting.
var (
	// QUIC between hosts (quic-go).
	QUIC = Transport{Name: "quic", StepUs: 97, CapGBs: 0.21}
	// TLSTCP is TCP authenticated by TLS 1.3, its bytes in sealed
	// records (rank/sealed.go).
	TLSTCP = Transport{Name: "tcp", StepUs: 81, CapGBs: 0.79}
	// ShmRings is the pair rings in /dev/shm that the message-passing
	// algorithms on one host use (and the hierarchical allreduce's phases
	// within a host where the group segment is missing): ring 4 KiB
	// 123 µs (6 steps), 1-16 MiB 0.70-0.94 GB/s.
	ShmRings = Transport{Name: "shm rings", StepUs: 20, CapGBs: 0.9}
	// ShmGroup is the shm algorithm (every rank of the job on one host,
	// reducing in the host's group segment), and the hierarchical
	// allreduce's phases within a host: np 4, 4 KiB 17 µs,
	// 16-64 MiB 3.0-3.2 GB/s bus bandwidth.
	ShmGroup = Transport{Name: "shm", StepUs: 3, CapGBs: 3.0}
)

// ParseTransport accepts auto (the faster on the link, as gorun's start-up
// probe decides), quic and tcp.
func ParseTransport(s string) (string, error) {
	switch strings.ToLower(s) {
	case "", "auto":
		return "auto", nil
	case "quic":
		return "quic", nil
	case "tcp", "tls", "tls/tcp":
		return "tcp", nil
	}
	return "", fmt.Errorf("unknown transport %q (want auto, quic or tcp)", s)
}

// TransportLabel is a transport's name as gorun prints it.
func TransportLabel(name string) string {
	switch name {
	case "tcp":
		return "TLS/TCP"
	case "quic":
		return "QUIC"
	}
	return name
}

// between picks the transport between hosts: the one named, or for auto
// what rank/choose.go decides from its probe (choice.TCPWins): TLS/TCP when
// it moves more than choice.AutoTCPMargin times QUIC's rate on this link
// each way (each the min of the link and its cap), else QUIC.
func between(name string, linkGBs float64) Transport {
	switch name {
	case "quic":
		return QUIC
	case "tcp":
		return TLSTCP
	}
	if choice.TCPWins(min(linkGBs, QUIC.CapGBs), min(linkGBs, TLSTCP.CapGBs)) {
		return TLSTCP
	}
	return QUIC
}

// Across is the link between hosts that a job's communicators choose
// their algorithm with (collective.Config.Across), from the transport
// choice its mesh made: the chosen transport's cost per step and, where
// auto's start-up probe ran, the rate it measured each way with both
// directions busy (the link or the CPU, whichever limited); without a
// probe (a transport named, or one host), the transport's cap alone, the
// link unknown. The probe's rates reach every rank from rank 0, so every
// rank gets the same link. The probe does not measure latency: a link's
// own latency is left out of the step.
func Across(c choice.Choice) algo.Link {
	t := between(c.Transport, 0)
	gbs := c.QUICGBs
	if c.Transport == "tcp" {
		gbs = c.TCPGBs
	}
	if c.Peer < 0 || !(gbs > 0) {
		return algo.Link{StepUs: t.StepUs, CapGBs: t.CapGBs}
	}
	return algo.Link{Gbps: 8 * gbs, StepUs: t.StepUs}
}
