#!/usr/bin/env bash
# Stops everything test/slurm/up.sh started (the cluster named by the same
# variables; see up.sh): slurmctld, every slurmd and whatever its jobs left
# running, every munged, the test hosts and the state directory. Safe to run twice.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
slurm_vars
if [ "$(id -u)" != 0 ]; then echo "test/slurm/down.sh: must run as root" >&2; exit 1; fi
pids=()
for f in "$STATE/slurmctld.launch.pid" "$STATE"/h*/slurmd.launch.pid "$STATE/munge/munged.pid" "$STATE"/h*/munged.pid; do
  [ -f "$f" ] || continue
  p=$(cat "$f")
  case "$p" in '' | *[!0-9]*) continue;; esac
  kill -9 "$p" 2>/dev/null && pids+=("$p")
done
# The jobs' processes (slurmstepd, ranks) run in the namespaces: the test
# hosts' down.sh kills whatever runs there, then removes them.
"$root/test/hosts/down.sh" >/dev/null 2>&1
for p in "${pids[@]}"; do
  for try in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
done
rm -rf "$STATE"
echo "slurm down"
exit 0
