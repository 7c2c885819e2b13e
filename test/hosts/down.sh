#!/usr/bin/env bash
# Removes everything test/hosts/up.sh made (the set named by the same
# GORUN_HOSTS_* variables; see up.sh). Safe to run twice.
here=$(cd "$(dirname "$0")" && pwd)
STATE=${GORUN_HOSTS_STATE:-$here/run}
NAME=${GORUN_HOSTS_NAME:-gorun-h}
VETH=${GORUN_HOSTS_VETH:-gr-h}
BR=${GORUN_HOSTS_BRIDGE:-gorunbr0}
if [ "$(id -u)" != 0 ]; then echo "test/hosts/down.sh: must run as root (network namespaces)" >&2; exit 1; fi
for pid in "$STATE"/sshd_h*.pid; do
  [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null
done
for ns in $(ip netns list 2>/dev/null | awk -v n="$NAME" 'index($1, n) == 1 && substr($1, length(n) + 1) ~ /^[0-9]+$/ {print $1}'); do
  # Kill whatever still runs inside (ranks left behind by a failed test).
  for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  ip netns del "$ns"
done
ip link del "$BR" 2>/dev/null
for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
  case "$l" in "$VETH"*) ;; *) continue;; esac
  case "${l#"$VETH"}" in '' | *[!0-9]*) ;; *) ip link del "$l" 2>/dev/null;; esac
done
rm -rf "$STATE"
echo "test hosts down"
exit 0
