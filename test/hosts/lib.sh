# Shared by up.sh, link.sh: link shaping of the test hosts. Sourced, not run.
# Needs VETH (bridge-side veth prefix) and LINK set.

# LINK="rate R delay D loss L%": the shape of each host's link.
# The rate applies to both directions (egress inside the namespace, and the
# bridge side of its veth, i.e. the host's ingress). Delay and loss apply
# once per packet (delay on the sending host's egress, loss on the
# receiving host's ingress), so that a packet between two test hosts sees
# them once, not twice. With sch_netem in
# the kernel, netem does all three; without it (this project's CI kernel
# lacks it), the rate is a token bucket (tbf), loss is an nftables rule that
# drops that share of the packets a host sends, at random, and a delay
# cannot be made: it is reported and left out.
parse_link() {
  RATE= DELAY= LOSS=
  set -- $LINK
  while [ $# -gt 0 ]; do
    case "$1" in
      rate) RATE=$2; shift 2;;
      delay) DELAY=$2; shift 2;;
      loss) LOSS=${2%\%}; shift 2;;
      *) echo "test/hosts: LINK: unknown word '$1' (want: rate R delay D loss L%)" >&2; exit 1;;
    esac
  done
  NETEM=0
  if [ -n "$LINK" ] && have_netem; then NETEM=1; fi
  if [ -n "$DELAY" ] && [ "$NETEM" = 0 ]; then echo "test/hosts: warning: delay $DELAY left out: this kernel has no sch_netem" >&2; fi
  return 0
}
have_netem() {
  local probe=${VETH}probe ok=0
  ip link add "$probe" type dummy 2>/dev/null || return 1
  tc qdisc add dev "$probe" root netem delay 1ms 2>/dev/null || ok=1
  ip link del "$probe" 2>/dev/null
  return $ok
}
# tc_bytes RATE: the bytes of 1 ms at RATE (tc units: bit, kbit, mbit, gbit,
# or bps etc. taken as bits), at least 1000000.
tc_bytes() {
  awk -v r="$1" 'BEGIN {
    m = 1; v = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u)
    if (u == "kbit") m = 1e3; else if (u == "mbit") m = 1e6; else if (u == "gbit") m = 1e9; else if (u == "tbit") m = 1e12
    b = v * m / 8 / 1000; if (b < 1000000) b = 1000000; printf "%d", b }'
}
# unshape_link ns veth: back to an unshaped link.
unshape_link() {
  ip netns exec "$1" tc qdisc del dev eth0 root 2>/dev/null || true
  tc qdisc del dev "$2" root 2>/dev/null || true
  ip netns exec "$1" nft delete table inet gorunloss 2>/dev/null || true
  ip -n "$1" link set dev eth0 gso_max_segs 65535 2>/dev/null || true
  ip link set dev "$2" gso_max_segs 65535 2>/dev/null || true
}
# shape_link ns veth: apply RATE/DELAY/LOSS (from parse_link) to host ns.
shape_link() {
  local ns=$1 outer=$2
  unshape_link "$ns" "$outer"
  if [ "$NETEM" = 1 ]; then
    local args="${RATE:+rate $RATE} ${DELAY:+delay $DELAY} ${LOSS:+loss $LOSS%}"
    ip netns exec "$ns" tc qdisc replace dev eth0 root netem $args limit 100000
    if [ -n "$RATE" ]; then tc qdisc replace dev "$outer" root netem rate "$RATE" limit 100000; fi
    return
  fi
  if [ -n "$RATE" ]; then
    # The bucket holds 1 ms of the rate (at least 1 MB): the kernel refills
    # it in timer ticks, and a smaller bucket caps the rate below RATE.
    local burst
    burst=$(tc_bytes "$RATE")
    ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$RATE" burst "$burst" latency 50ms
    tc qdisc replace dev "$outer" root tbf rate "$RATE" burst "$burst" latency 50ms
  fi
  if [ -n "$LOSS" ] && [ "$LOSS" != 0 ]; then
    command -v nft >/dev/null || { echo "test/hosts: loss without netem needs nft (apt-get install nftables)" >&2; exit 1; }
    # Drop LOSS% of the packets the host receives, at random (numgen:
    # 0..9999). On the receiving side, because a drop in the sender's own
    # output hook is not silent: sendmsg fails with EPERM, which no wire does.
    # One packet at a time on the wire: without this, a UDP GSO send (quic-go
    # uses it) crosses the veth and the bridge as one buffer of up to 64 KB,
    # and the rule would drop ~45 packets at once, 1 % of the buffers.
    ip -n "$ns" link set dev eth0 gso_max_segs 1
    ip link set dev "$outer" gso_max_segs 1
    local per10k
    per10k=$(awk -v l="$LOSS" 'BEGIN{printf "%d", l*100}')
    ip netns exec "$ns" nft -f - <<NFT
table inet gorunloss {
  chain in { type filter hook input priority 0; numgen random mod 10000 < $per10k counter drop; }
}
NFT
  fi
}

