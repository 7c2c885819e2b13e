#!/usr/bin/env bash
# Side-by-side allreduce comparison on this machine, in one sitting:
# OpenMPI (shared memory "vader" and TCP on loopback) and torch gloo, run by
# the project's shared peer scripts (../shared/peers, called, not copied),
# then gorun's allreduce-perf under bin/gorun over shared memory, QUIC and
# TLS/TCP, for the same sizes and world sizes (float32, sum), and beside
# each transport's allreduce its `allreduce-perf -C sendrecv` (every rank
# sends to the next while it receives from the previous: the ring's traffic
# without reduction, the most that transport carries in that pattern here).
#
# Usage: bench/peers/allreduce_peers.sh
#   env: NPS ("2 4"), SIZES (bytes, 4 KiB to 256 MiB as in issue 3's table),
#        BUDGET (seconds per size for the peers, default 3), ALGOS ("auto"; add
#        ring, tree, direct to compare), TRANSPORTS ("shm quic tcp"),
#        SENDRECV (1: also -C sendrecv per transport; 0: not), PEERS (dir of
#        the shared peer scripts), SKIP_PEERS=1 (gorun only), OUT (results dir)
# Prints a markdown table of busbw (GB/s) and median time per op (us), then
# the ratios the issue asks about.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PEERS=${PEERS:-$REPO/../shared/peers}
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

if [ "${SKIP_PEERS:-0}" != 1 ]; then
  [ -x "$PEERS/02_mpi_allreduce.sh" ] || { echo "allreduce_peers.sh: no peer scripts in $PEERS (set PEERS=)" >&2; exit 1; }
  OUT=$OUT/peers BUDGET=$BUDGET NPS=$NPS SIZES=$SIZES CONFIGS="vader tcp" "$PEERS/02_mpi_allreduce.sh"
  OUT=$OUT/peers BUDGET=$BUDGET NPS=$NPS SIZES=$SIZES "$PEERS/03_gloo_allreduce.sh"
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

# one table: rows from the peers' markdown and from gorun
{
  cat "$OUT"/peers/02_mpi_allreduce.md "$OUT"/peers/03_gloo_allreduce.md 2>/dev/null | grep -E '^\| [0-9]' |
    awk -F'|' '{gsub(/ /,""); s=$2; m=1; if (s ~ /MiB$/) {m=1048576} else if (s ~ /KiB$/) {m=1024}; sub(/[KM]iB$/,"",s); print s*m, $3, $4, $5, $6, $7, $8, $9}' || true
  cat "$OUT/gorun_rows"
} > "$TMP/all"
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
