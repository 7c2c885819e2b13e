#!/usr/bin/env bash
# Side-by-side allreduce comparison on this machine, in one sitting:
# OpenMPI (shared memory "vader" and TCP on loopback; bench/peers/mpi_allreduce.c)
# and torch gloo (bench/peers/gloo_allreduce.py), then gorun's allreduce-perf under bin/gorun over shared memory, QUIC and
# TLS/TCP, for the same sizes and world sizes (float32, sum), and beside
# each transport's allreduce its `allreduce-perf -C sendrecv` (every rank
# sends to the next while it receives from the previous: the ring's traffic
# without reduction, the most that transport carries in that pattern here).
#
# Usage: bench/peers/allreduce_peers.sh
#   env: NPS ("2 4"), SIZES (bytes, 4 KiB to 256 MiB as in issue 3's table),
#        BUDGET (seconds per size for the peers, default 3), ALGOS ("auto"; add
#        ring, tree, direct to compare), TRANSPORTS ("shm quic tcp"),
#        SENDRECV (1: also -C sendrecv per transport; 0: not),
#        SKIP_PEERS=1 (gorun only), OUT (results dir); the peers need mpicc
#        (openmpi-bin, libopenmpi-dev) and Debian's python3-torch
# Prints a markdown table of busbw (GB/s) and median time per op (us), then
# the ratios the issue asks about.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
NPS=${NPS:-"2 4"}
SIZES=${SIZES:-"4096 65536 1048576 16777216 67108864 268435456"}
BUDGET=${BUDGET:-3}
ALGOS=${ALGOS:-"auto"}
SENDRECV=${SENDRECV:-1}
TRANSPORTS=${TRANSPORTS:-"shm quic tcp"}
OUT=${OUT:-$REPO/bench/peers/results/allreduce-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
echo "# allreduce side by side, $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/README.txt"

# peer rows: size np peer median_us algbw busbw best_busbw samples
: > "$OUT/peer_rows"
if [ "${SKIP_PEERS:-0}" != 1 ]; then
  mkdir -p "$OUT/peers"
  mpicc -O2 -o "$TMP/mpi_allreduce" "$REPO/bench/peers/mpi_allreduce.c" -lm
  MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1)
  declare -A MCA=([vader]="--mca btl vader,self" [tcp]="--mca btl tcp,self --mca btl_tcp_if_include lo")
  for np in $NPS; do for c in vader tcp; do
    cmd=("${MPIRUN[@]}" -np "$np" ${MCA[$c]} "$TMP/mpi_allreduce" "$BUDGET" $SIZES)
    echo "+ ${cmd[*]}" | sed "s#$TMP/##g" > "$OUT/peers/mpi_${c}_np${np}.txt"
    timeout 480 "${cmd[@]}" 2>&1 | tee -a "$OUT/peers/mpi_${c}_np${np}.txt" | grep -E '^ +[0-9]' |
      awk -v c="openmpi-$c" '{print $1, $2, c, $5, $6, $7, $8, $4}' >> "$OUT/peer_rows"
  done; done
  for np in $NPS; do
    cmd=(/usr/bin/python3 "$REPO/bench/peers/gloo_allreduce.py" --np "$np" --budget "$BUDGET" --timeout 480 --sizes $SIZES)
    echo "+ ${cmd[*]}" > "$OUT/peers/gloo_np${np}.txt"
    "${cmd[@]}" 2>&1 | tee -a "$OUT/peers/gloo_np${np}.txt" | grep -E '^ +[0-9]' |
      awk '{print $1, $2, "torch-gloo", $5, $6, $7, $8, $4}' >> "$OUT/peer_rows"
  done
fi

(cd "$REPO" && go build -o "$TMP/gorun" ./cmd/gorun && go build -o "$TMP/allreduce-perf" ./cmd/allreduce-perf)
: > "$OUT/gorun_rows"
modes=$ALGOS; [ "$SENDRECV" = 1 ] && modes="$modes sendrecv"
for np in $NPS; do for tr in $TRANSPORTS; do for algo in $modes; do
  case $tr in
    shm)  env=(-x GORUN_SHM=on -x GORUN_TRANSPORT=quic) ;;
    quic) env=(-x GORUN_SHM=off -x GORUN_TRANSPORT=quic) ;;
    tcp)  env=(-x GORUN_SHM=off -x GORUN_TRANSPORT=tcp) ;;
  esac
  for size in $SIZES; do
    # about the same work per size: many iterations when small, few when large
    # (about 1 GiB per size, 10 to 2000 iterations: the peers run ~BUDGET seconds each)
    n=$(( 1073741824 / size )); [ $n -gt 2000 ] && n=2000; [ $n -lt 10 ] && n=10
    w=$(( n / 10 + 1 ))
    if [ "$algo" = sendrecv ]; then how=(-C sendrecv); else how=(-o sum -a "$algo"); fi
    cmd=("$TMP/gorun" -np "$np" "${env[@]}" "$TMP/allreduce-perf" -b "$size" -e "$size" -n "$n" -w "$w" -d float "${how[@]}" -I 0 -c 1)
    echo "+ ${cmd[*]}" | sed "s#$TMP/##g" >> "$OUT/gorun_${tr}_np${np}_${algo}.txt"
    timeout 600 "${cmd[@]}" 2>&1 | tee -a "$OUT/gorun_${tr}_np${np}_${algo}.txt" | sed 's/^\[[0-9]*\] //' | grep -E '^ +[0-9]' |
      awk -v np="$np" -v p="gorun-$tr-$algo" '{print $1, np, p, $6, $7, $8, $8, $9}' >> "$OUT/gorun_rows"
  done
done; done; done

# one table: rows from the peers and from gorun
cat "$OUT/peer_rows" "$OUT/gorun_rows" > "$TMP/all"
/usr/bin/python3 - "$TMP/all" <<'PY' | tee "$OUT/SUMMARY.md"
import sys, collections
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
peers, cell = [], {}
for size, np, peer, us, algbw, busbw, *_ in rows:
    if peer not in peers: peers.append(peer)
    cell[(int(size), int(np), peer)] = (float(us), float(busbw))
keys = sorted({(s, n) for s, n, _ in cell})
def name(b): return f"{b>>20}MiB" if b >= 1 << 20 else f"{b>>10}KiB"
print("busbw GB/s (time per op, us); float32 sum; GB = 1e9 B; busbw = algbw*2(n-1)/n")
print()
print("| size | np | " + " | ".join(peers) + " |")
print("|---|---|" + "---|" * len(peers))
for s, n in keys:
    out = []
    for p in peers:
        v = cell.get((s, n, p))
        out.append(f"{v[1]:.3f} ({v[0]:.0f})" if v else "")
    print(f"| {name(s)} | {n} | " + " | ".join(out) + " |")
# ratios of busbw (time ratios where the issue speaks of latency: 4 KiB)
pairs = [("gorun-shm-auto", "openmpi-vader"), ("gorun-shm-auto", "torch-gloo"),
         ("gorun-quic-auto", "gorun-quic-sendrecv"), ("gorun-tcp-auto", "gorun-tcp-sendrecv"),
         ("gorun-quic-auto", "torch-gloo"), ("gorun-tcp-auto", "torch-gloo"), ("gorun-tcp-auto", "openmpi-tcp")]
pairs = [(a, b) for a, b in pairs if a in peers and b in peers]
if pairs:
    print()
    print("busbw ratios (x: the first is faster when > 1)")
    print()
    print("| size | np | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |")
    print("|---|---|" + "---|" * len(pairs))
    for s, n in keys:
        out = []
        for a, b in pairs:
            va, vb = cell.get((s, n, a)), cell.get((s, n, b))
            out.append(f"{va[1] / vb[1]:.2f}x" if va and vb and vb[1] > 0 else "")
        print(f"| {name(s)} | {n} | " + " | ".join(out) + " |")
PY
echo "results in $OUT"
