#!/usr/bin/env bash
# A real Slurm cluster on gorun's test hosts (Debian's slurm-wlm and munge):
# slurmctld on the launcher side (the bridge address), one slurmd per test
# host inside its network namespace with a host name of its own (h1, h2, ...;
# a UTS namespace each), one munged per node and one for the controller,
# all with one munge key made for this run. Everything (slurm.conf, keys,
# logs, spool, state) lives under the state directory. Root only;
# idempotent (tears down what it finds first); a half-made cluster is
# removed again.
#
#   HOSTS=2 test/slurm/up.sh         (make slurm-up)
#   export SLURM_CONF=test/slurm/run/slurm.conf
#   sbatch examples/slurm/train.sbatch; squeue; sinfo
#   test/slurm/shell.sh 1            a shell on node h1, as on a login node
#   test/slurm/down.sh               (make slurm-down)
#
# The test hosts come from test/hosts/up.sh (a set of their own: namespaces
# gorun-s1.., bridge gorunbrs, 198.18.78.0/24, state under the Slurm state);
# its GORUN_HOSTS_* variables still name another set, and so do:
#   GORUN_SLURM_STATE  the state directory (default test/slurm/run)
#   GORUN_SLURM_PORT   slurmctld's port (default 6817; slurmd's is 6818 in
#                      every namespace)
#   CPUS               as for test/hosts/up.sh: one taskset list per node;
#                      each node's slurmd then declares that many CPUs
#                      (unset: every node declares all of this machine's)
#   NODE_MUNGE_KEY     "N=FILE": node N's munged uses FILE as its key
#                      (a mistake to try: the node is refused, by name)
#   GORUN_SLURM_KEEP   set: a failed up.sh leaves what it made, for its logs
#                      (down.sh removes it)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
slurm_vars

if [ "$(id -u)" != 0 ]; then echo "test/slurm/up.sh: must run as root (network namespaces, Slurm daemons)" >&2; exit 1; fi
for tool in slurmctld slurmd slurmstepd munged munge unmunge unshare; do
  command -v $tool >/dev/null || [ -x /usr/sbin/$tool ] || {
    echo "test/slurm/up.sh: $tool not found (apt-get install slurm-wlm munge)" >&2; exit 1; }
done
case "$HOSTS" in [1-9]) ;; *) echo "test/slurm/up.sh: HOSTS=$HOSTS: want 1..9" >&2; exit 1;; esac

"$here/down.sh" >/dev/null 2>&1 || true
trap 'st=$?; if [ $st != 0 ] && [ -z "${GORUN_SLURM_KEEP:-}" ]; then "$here/down.sh" >/dev/null 2>&1; fi; exit $st' EXIT
mkdir -p "$STATE"
chmod 700 "$STATE"

# The test hosts: network namespaces with an sshd each.
"$root/test/hosts/up.sh" >"$STATE/hosts-up.log" 2>&1 || {
  echo "test/slurm/up.sh: test/hosts/up.sh failed: $(tail -n 1 "$STATE/hosts-up.log")" >&2; exit 1; }

# One munge key for the run; munged for the controller.
mkdir -p "$STATE/munge"
chmod 700 "$STATE/munge"
dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1 count=1024 status=none
chmod 400 "$STATE/munge/munge.key"
start_munged "$STATE/munge" "$STATE/munge/munge.key"

mkdir -p "$STATE/ctld"
write_conf ctl > "$STATE/slurm.conf"
# slurmctld on the launcher side, listening on every address (the nodes
# reach it on the bridge's).
setsid slurmctld -D -f "$STATE/slurm.conf" >>"$STATE/slurmctld.out" 2>&1 </dev/null &
echo $! > "$STATE/slurmctld.launch.pid"
disown
for try in $(seq 1 100); do
  if scontrol ping 2>/dev/null | grep -q 'is UP'; then break; fi
  if ! kill -0 "$(cat "$STATE/slurmctld.launch.pid")" 2>/dev/null; then
    echo "test/slurm/up.sh: slurmctld exited: $(tail -n 1 "$STATE/slurmctld.log" 2>/dev/null || tail -n 1 "$STATE/slurmctld.out")" >&2; exit 1
  fi
  [ "$try" = 100 ] && { echo "test/slurm/up.sh: slurmctld does not answer; see $STATE/slurmctld.log" >&2; exit 1; }
  sleep 0.1
done

for i in $(seq 1 "$HOSTS"); do
  key=$STATE/munge/munge.key
  case "${NODE_MUNGE_KEY:-}" in "$i="*) key=${NODE_MUNGE_KEY#*=};; esac
  start_node "$i" "$key"
done
for i in $(seq 1 "$HOSTS"); do
  wait_node "$i" 30 || exit 1
done

cat > "$STATE/env" <<ENV
export SLURM_CONF=$STATE/slurm.conf
ENV
echo "slurm up: $HOSTS node(s) h1..h$HOSTS ($(node_cpus 1) CPUs each), slurmctld on $NET.1:$CTLD_PORT"
echo "  export SLURM_CONF=$STATE/slurm.conf     (or: . $STATE/env)"
echo "  sbatch examples/slurm/train.sbatch; squeue; sinfo"
echo "  $here/shell.sh 1                         a shell on node h1"
echo "  logs: $STATE/slurmctld.log, $STATE/h1/slurmd.log, ..."
