#!/usr/bin/env bash
# A shell (or a command) on node hI of test/slurm/up.sh's cluster, as on a
# login node: its network namespace, its host name, its /etc/hosts, and
# SLURM_CONF set.
#
#   test/slurm/shell.sh 1                      a shell on h1
#   test/slurm/shell.sh 1 salloc -N 2 --ntasks-per-node 2 bin/gorun -np 4 bin/ring
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
slurm_vars
i=${1:?usage: test/slurm/shell.sh NODE [COMMAND...] (NODE: 1 for h1)}
shift
pid=$(cat "$STATE/h$i/slurmd.pid" 2>/dev/null) || { echo "test/slurm/shell.sh: node h$i is not up (no $STATE/h$i/slurmd.pid; run test/slurm/up.sh)" >&2; exit 1; }
[ $# -gt 0 ] || set -- bash
exec nsenter -t "$pid" -n -u -m --wd="$PWD" -- "$@"
