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
#
# Several sets of hosts can live side by side (the integration tests use
# their own set, so that `make hosts-up` and `go test ./test/multihost` do
# not tear down each other's hosts):
#   GORUN_HOSTS_NAME   namespaces NAME1, NAME2, ... (default gorun-h)
#   GORUN_HOSTS_VETH   bridge-side veth names VETH1, ... (default gr-h; <= 12 chars)
#   GORUN_HOSTS_BRIDGE bridge name (default gorunbr0)
#   GORUN_HOSTS_NET    the /24 as three octets (default 198.18.77)
#   GORUN_HOSTS_STATE  directory for keys, configs, hostfile (default test/hosts/run)
#
# CPUS gives each host cores of its own, one taskset list per host
# (CPUS="0 1": h1 runs on core 0, h2 on core 1). Whatever ssh starts on a
# host inherits them, so a rank there counts only its host's cores (Go's
# runtime.NumCPU, OpenMPI's binding), as on separate machines. Unset, every
# host shares all of this machine's cores and each takes them all for its own.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
HOSTS=${HOSTS:-2}
LINK=${LINK:-}
STATE=${GORUN_HOSTS_STATE:-$here/run}
NAME=${GORUN_HOSTS_NAME:-gorun-h}
VETH=${GORUN_HOSTS_VETH:-gr-h}
NET=${GORUN_HOSTS_NET:-198.18.77}
BR=${GORUN_HOSTS_BRIDGE:-gorunbr0}
read -r -a CPU_LIST <<< "${CPUS:-}"
if [ ${#CPU_LIST[@]} -gt 0 ] && [ ${#CPU_LIST[@]} != "$HOSTS" ]; then
  echo "test/hosts/up.sh: CPUS has ${#CPU_LIST[@]} lists for $HOSTS hosts (one taskset list per host, e.g. CPUS=\"0 1\")" >&2; exit 1
fi

if [ "$(id -u)" != 0 ]; then echo "test/hosts/up.sh: must run as root (network namespaces)" >&2; exit 1; fi
for tool in ip tc; do command -v $tool >/dev/null || { echo "test/hosts/up.sh: $tool not found (apt-get install iproute2)" >&2; exit 1; }; done
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$SSHD" ] || { echo "test/hosts/up.sh: sshd not found (apt-get install openssh-server)" >&2; exit 1; }
case "$HOSTS" in [1-9]) ;; *) echo "test/hosts/up.sh: HOSTS=$HOSTS: want 1..9" >&2; exit 1;; esac

. "$here/lib.sh"

parse_link

"$here/down.sh" >/dev/null 2>&1 || true
# A half-made set of hosts is removed again.
trap 'st=$?; if [ $st != 0 ]; then "$here/down.sh" >/dev/null 2>&1; fi; exit $st' EXIT
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
  ns=$NAME$i ip_addr=$NET.$((10 + i))
  ip netns add $ns
  ip link add $VETH$i type veth peer name eth0 netns $ns
  ip link set $VETH$i master $BR up
  ip -n $ns link set lo up
  ip -n $ns addr add $ip_addr/24 dev eth0
  ip -n $ns link set eth0 up
  ip netns exec $ns sysctl -q -w net.core.rmem_max=7500000 net.core.wmem_max=7500000 2>/dev/null || true
  shape_link $ns $VETH$i
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
  pin=()
  [ ${#CPU_LIST[@]} -gt 0 ] && pin=(taskset -c "${CPU_LIST[$((i - 1))]}")
  ip netns exec $ns "${pin[@]}" "$SSHD" -f "$STATE/sshd_h$i.conf" -E "$STATE/sshd_h$i.log" 2>/dev/null || {
    if [ ${#pin[@]} -gt 0 ]; then echo "test/hosts/up.sh: h$i: cannot start sshd on cores '${CPU_LIST[$((i - 1))]}' (CPUS: is that list on this machine? it has $(nproc))" >&2
    else echo "test/hosts/up.sh: h$i: sshd did not start; see $STATE/sshd_h$i.log" >&2; fi
    exit 1
  }
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
echo "  gorun:      bin/gorun -np 4 -hostfile $STATE/hostfile --ssh-args \"-F $STATE/ssh_config\" PROG"
