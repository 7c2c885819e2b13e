#!/usr/bin/env bash
# Creates gorun's test hosts: network namespaces joined by veth pairs to a
# bridge, each with its own address, an sshd with a key made for this run,
# and a shaped link. Idempotent (tears down what it finds first). Root only.
#
#   HOSTS=2 LINK="rate 1gbit delay 0.2ms loss 0%" test/hosts/up.sh
#
# The launcher side (where gorun runs) is the bridge address 198.18.77.1;
# host i is 198.18.77.(10+i), reachable as h1, h2, ... through the generated
# ssh config. 198.18.0.0/15 is the range RFC 2544 sets aside for benchmark
# networks: traffic stays between these namespaces.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
HOSTS=${HOSTS:-2}
LINK=${LINK:-}
STATE=${GORUN_HOSTS_STATE:-$here/run}
NET=198.18.77
BR=gorunbr0

if [ "$(id -u)" != 0 ]; then echo "test/hosts/up.sh: must run as root (network namespaces)" >&2; exit 1; fi
for tool in ip tc; do command -v $tool >/dev/null || { echo "test/hosts/up.sh: $tool not found (apt-get install iproute2)" >&2; exit 1; }; done
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$SSHD" ] || { echo "test/hosts/up.sh: sshd not found (apt-get install openssh-server)" >&2; exit 1; }
case "$HOSTS" in [1-9]) ;; *) echo "test/hosts/up.sh: HOSTS=$HOSTS: want 1..9" >&2; exit 1;; esac

# LINK="rate R delay D loss L%": applied to both directions of a host's link
# (egress inside the namespace, and the bridge side of its veth). With
# sch_netem in the kernel, netem does all three; without it (this project's
# CI kernel lacks it), rate is a token bucket (tbf), loss is an nftables rule
# that drops that share of packets at random, and a delay cannot be made: it
# is reported and left out.
parse_link() {
  RATE= DELAY= LOSS=
  set -- $LINK
  while [ $# -gt 0 ]; do
    case "$1" in
      rate) RATE=$2; shift 2;;
      delay) DELAY=$2; shift 2;;
      loss) LOSS=${2%\%}; shift 2;;
      *) echo "test/hosts/up.sh: LINK: unknown word '$1' (want: rate R delay D loss L%)" >&2; exit 1;;
    esac
  done
}
have_netem() {
  ip link add gorun-probe type dummy 2>/dev/null || return 1
  tc qdisc add dev gorun-probe root netem delay 1ms 2>/dev/null; local ok=$?
  ip link del gorun-probe 2>/dev/null
  return $ok
}
shape_link() { # ns veth-root-side
  local ns=$1 outer=$2
  if [ "$NETEM" = 1 ]; then
    local args="${RATE:+rate $RATE} ${DELAY:+delay $DELAY} ${LOSS:+loss $LOSS%}"
    ip netns exec "$ns" tc qdisc replace dev eth0 root netem $args limit 100000
    tc qdisc replace dev "$outer" root netem $args limit 100000
    return
  fi
  if [ -n "$RATE" ]; then
    ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$RATE" burst 1mb latency 50ms
    tc qdisc replace dev "$outer" root tbf rate "$RATE" burst 1mb latency 50ms
  fi
  if [ -n "$LOSS" ] && [ "$LOSS" != 0 ]; then
    command -v nft >/dev/null || { echo "test/hosts/up.sh: loss without netem needs nft (apt-get install nftables)" >&2; exit 1; }
    # Drop LOSS% of the packets leaving and entering the host, at random.
    local per10k
    per10k=$(awk -v l="$LOSS" 'BEGIN{printf "%d", l*100}')
    ip netns exec "$ns" nft -f - <<NFT
table inet gorunloss {
  chain out { type filter hook output priority 0; numgen random mod 10000 < $per10k drop; }
  chain in { type filter hook input priority 0; numgen random mod 10000 < $per10k drop; }
}
NFT
  fi
}

parse_link
NETEM=0
if [ -n "$LINK" ] && have_netem; then NETEM=1; fi
if [ -n "$DELAY" ] && [ "$NETEM" = 0 ]; then echo "test/hosts/up.sh: warning: delay $DELAY left out: this kernel has no sch_netem" >&2; fi

"$here/down.sh" >/dev/null 2>&1 || true
mkdir -p "$STATE" /run/sshd
chmod 700 "$STATE"
ssh-keygen -q -t ed25519 -N '' -f "$STATE/id_ed25519" -C gorun-test-hosts
ssh-keygen -q -t ed25519 -N '' -f "$STATE/host_key" -C gorun-test-host
cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"

ip link add $BR type bridge
ip addr add $NET.1/24 dev $BR
ip link set $BR up

: > "$STATE/hostfile"
cat > "$STATE/ssh_config" <<CFG
Host h* $NET.*
  User root
  IdentityFile $STATE/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
  ConnectTimeout 5
CFG
for i in $(seq 1 "$HOSTS"); do
  ns=gorun-h$i ip_addr=$NET.$((10 + i))
  ip netns add $ns
  ip link add gr-h$i type veth peer name eth0 netns $ns
  ip link set gr-h$i master $BR up
  ip -n $ns link set lo up
  ip -n $ns addr add $ip_addr/24 dev eth0
  ip -n $ns link set eth0 up
  ip netns exec $ns sysctl -q -w net.core.rmem_max=7500000 net.core.wmem_max=7500000 2>/dev/null || true
  if [ -n "$LINK" ]; then shape_link $ns gr-h$i; fi
  cat > "$STATE/sshd_h$i.conf" <<CFG
ListenAddress $ip_addr
Port 22
HostKey $STATE/host_key
PidFile $STATE/sshd_h$i.pid
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AcceptEnv GORUN_*
PrintMotd no
CFG
  ip netns exec $ns "$SSHD" -f "$STATE/sshd_h$i.conf" -E "$STATE/sshd_h$i.log"
  printf 'Host h%d\n  HostName %s\n' "$i" "$ip_addr" >> "$STATE/ssh_config"
  echo "$ip_addr slots=2" >> "$STATE/hostfile"
done
# Wait for every sshd to answer.
for i in $(seq 1 "$HOSTS"); do
  for try in $(seq 1 50); do
    if ssh -F "$STATE/ssh_config" h$i true 2>/dev/null; then break; fi
    [ "$try" = 50 ] && { echo "test/hosts/up.sh: sshd on h$i did not answer; see $STATE/sshd_h$i.log" >&2; exit 1; }
    sleep 0.1
  done
done
echo "test hosts up: $HOSTS host(s) on $NET.0/24${LINK:+, link: $LINK}"
echo "  hostfile:   $STATE/hostfile"
echo "  ssh config: $STATE/ssh_config   (e.g. ssh -F $STATE/ssh_config h1 hostname)"
echo "  gorun:      bin/gorun -np 4 -hostfile $STATE/hostfile --ssh-args \"-F $STATE/ssh_config\" --iface $NET.1 PROG"
