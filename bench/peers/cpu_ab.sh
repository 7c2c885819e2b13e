#!/usr/bin/env bash
# CPU time per allreduce call of several allreduce-perf builds, and OpenMPI's
# bus bandwidth beside them, between two test hosts (test/hosts/up.sh), np 2,
# one rank per host, TLS/TCP, in alternating rounds. On a shared, noisy
# machine the CPU a rank spends per call (user + system, /usr/bin/time,
# both ranks' mean over all calls) moves less than the wall-clock rate when
# the rank is bound by its core, as it is here: the A/B behind the changes
# of docs/performance.md, "Per-message costs on the lanes". Root only.
#
#   CPUS="0 1" HOSTS=2 LINK= test/hosts/up.sh
#   git worktree add /tmp/old HEAD~1 && (cd /tmp/old && go build -o /tmp/old/bin/ ./cmd/allreduce-perf)
#   BINS="/tmp/old/bin/allreduce-perf bin/allreduce-perf" bench/peers/cpu_ab.sh
#
#   env: BINS (allreduce-perf binaries, paths the hosts see), ROUNDS (4),
#        SIZE (bytes, 1048576), N (timed calls, 4000), MPI (1: OpenMPI's
#        busbw too, needs mpicc; bench/peers/mpi_allreduce.c, as
#        multihost_busbw.sh), GORUN_HOSTS_STATE
#        (test/hosts/run)
# Prints one line per run: round, binary, busbw GB/s, CPU microseconds per call.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-4} SIZE=${SIZE:-1048576} N=${N:-4000} MPI=${MPI:-1}
BINS=${BINS:-bin/allreduce-perf}
STATE=${GORUN_HOSTS_STATE:-test/hosts/run}
HF=$STATE/hostfile CFG=$STATE/ssh_config
[ -f "$HF" ] || { echo "cpu_ab.sh: no test hosts ($HF): run test/hosts/up.sh first" >&2; exit 1; }
mapfile -t ADDRS < <(awk '{print $1}' "$HF")
NET=${ADDRS[0]%.*}
if [ "$MPI" = 1 ]; then
	mpicc -O2 -o /tmp/gorun_mpi_allreduce "$(dirname "$0")/mpi_allreduce.c" -lm
fi
for r in $(seq 1 "$ROUNDS"); do
	for b in $BINS; do
		out=$(bin/gorun -hostfile "$HF" --ssh-args "-F $CFG" -np 2 --map-by node -x GORUN_TRANSPORT=tcp \
			/usr/bin/time -f "CPU %U %S" "$(realpath "$b")" -b "$SIZE" -e "$SIZE" -n "$N" -S 1 -w 20 -I 0 -c 0 2>&1)
		bw=$(awk '$1=="[0]" && $2+0>0 {print $8}' <<<"$out")
		cpu=$(awk -v n="$N" '/CPU/ {for (i=1;i<=NF;i++) if ($i=="CPU") {s+=$(i+1)+$(i+2); k++}} END {if (k) printf "%.1f", 1e6*s/k/(n+20)}' <<<"$out")
		echo "round $r $b busbw $bw cpu_us_per_call $cpu"
	done
	if [ "$MPI" = 1 ]; then
		bw=$(timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca btl tcp,self \
			--mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" --mca plm_rsh_agent "ssh -F $CFG" \
			--host "${ADDRS[0]}:1,${ADDRS[1]}:1" -np 2 /tmp/gorun_mpi_allreduce 3 "$SIZE" 2>&1 | awk -v s="$SIZE" '$1 == s {print $7}')
		echo "round $r openmpi busbw $bw"
	fi
done
