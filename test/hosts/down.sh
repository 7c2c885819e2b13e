#!/usr/bin/env bash
# Removes everything test/hosts/up.sh made. Safe to run twice.
here=$(cd "$(dirname "$0")" && pwd)
STATE=${GORUN_HOSTS_STATE:-$here/run}
for pid in "$STATE"/sshd_h*.pid; do
  [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null
done
for ns in $(ip netns list 2>/dev/null | awk '/^gorun-h[0-9]/{print $1}'); do
  # Kill whatever still runs inside (ranks left behind by a failed test).
  for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  ip netns del "$ns"
done
ip link del gorunbr0 2>/dev/null
for l in $(ip -o link show 2>/dev/null | awk -F': ' '/gr-h[0-9]/{print $2}' | cut -d@ -f1); do ip link del "$l" 2>/dev/null; done
rm -rf "$STATE"
echo "test hosts down"
exit 0
