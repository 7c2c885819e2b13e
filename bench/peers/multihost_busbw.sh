#!/usr/bin/env bash
# Allreduce bus bandwidth across 2 test hosts (network namespaces, real ssh;
# test/hosts/up.sh) against the link rate, side by side with OpenMPI over
# TCP and torch gloo (GLOO=0 leaves it out) on the same hosts, with iperf3
# between the hosts as the link's
# reference; then nmt-train's step time at 1 Gbit/s with and without
# overlap. One sitting, so the ratios compare like with like. Root only.
#
#   bench/peers/multihost_busbw.sh
#   env: LINKS ("1gbit 10gbit none"), NPS ("2 4"), SIZES (bytes, "1048576 16777216 67108864"),
#        ITERS (gorun timed allreduces per size, at least 5; more for small sizes: up to
#        1000 and ITER_BYTES / size, ITER_BYTES 1 GiB, so that a size runs long enough
#        for a mean to mean something, as the peers' 3-s budgets), MPI_BUDGET (s per size, 3),
#        CPUS (cores per host, as test/hosts/up.sh takes them; default: each host half of
#        this machine's, as two machines would have their own; set it empty to let both
#        hosts share all cores, as before 2026-11-25),
#        TRAIN_PRESETS ("tiny"; set empty for none), TRAIN_STEPS (60), GLOO (1: torch gloo too), OUT (results dir),
#        ROUNDS (1): run gorun's default, OpenMPI and gloo this many times per size, one after
#        another in turn, and report each one's median over the rounds (this machine's noise
#        moves a single run by 10-20 %; the QUIC and TCP columns run once)
# gorun runs four times per size: its default transport (auto: the faster
# of QUIC and TLS/TCP by the start-up probe; the cell names the one chosen),
# GORUN_TRANSPORT=quic and GORUN_TRANSPORT=tcp, to tell the transport from
# the rest, and, when the hosts share cores (CPUS empty), the default again
# with GOMAXPROCS=1: a rank that takes a whole host's cores
# (allreduce-perf's GOMAXPROCS = cores / ranks on its host) then runs twice
# as many threads as there are cores, where OpenMPI's ranks run one each.
#
# gorun side: bin/allreduce-perf (-I 0 -c 1 -n ITERS -S up to 100: the
# median of the samples, each the slowest rank's time per call, as the
# peers measure, and the mean of all ITERS out-of-place allreduces,
# checked; the ratios use the median) when cmd/allreduce-perf exists,
# else test/multihost/archeck (median and best of ITERS). OpenMPI side: bench/peers/mpi_allreduce.c (the
# project's peer baseline), pml ob1, btl
# tcp,self: not vader, because every namespace has the same host name, so
# OpenMPI takes ranks on different "hosts" for neighbours and its shared
# memory transport crashes (SIGSEGV in mca_pml_ob1_recv_frag_callback_fin).
# gloo side: bench/peers/gloo_allreduce.py's ranks started in
# the hosts' namespaces (ip netns exec, as torchrun would start them there:
# RANK, WORLD_SIZE, MASTER_ADDR = host 1, GLOO_SOCKET_IFNAME = eth0).
# busbw = algbw * 2(n-1)/n, GB = 1e9 bytes; np 2 = one rank per host,
# np 4 = two per host (hosts filled in order, as gorun and mpirun do).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LINKS=${LINKS:-"1gbit 10gbit none"}
NPS=${NPS:-"2 4"}
SIZES=${SIZES:-"1048576 16777216 67108864"}
ITERS=${ITERS:-5}
ITER_BYTES=${ITER_BYTES:-1073741824}
ROUNDS=${ROUNDS:-1}
case $ROUNDS in '' | *[!0-9]* | 0) echo "multihost_busbw.sh: ROUNDS=$ROUNDS is not a whole number of rounds (1 or more)" >&2; exit 2 ;; esac
ROUND=
if [ -z "${CPUS+set}" ]; then
  c=$(nproc); CPUS=
  [ "$c" -ge 2 ] && CPUS="0-$((c / 2 - 1)) $((c / 2))-$((c - 1))"
fi
MPI_BUDGET=${MPI_BUDGET:-3}
GLOO=${GLOO:-1}
TRAIN_PRESETS=${TRAIN_PRESETS-tiny}
TRAIN_STEPS=${TRAIN_STEPS:-60}
OUT=${OUT:-/tmp/gorun-multihost-bench}
if [ "$(id -u)" != 0 ]; then echo "multihost_busbw.sh: must run as root (network namespaces)" >&2; exit 1; fi
mkdir -p "$OUT"

# A set of hosts of its own (see test/hosts/up.sh), taken down on exit.
export GORUN_HOSTS_NAME=gorun-bh GORUN_HOSTS_VETH=grbh GORUN_HOSTS_BRIDGE=gorunbrb \
  GORUN_HOSTS_NET=198.18.79 GORUN_HOSTS_STATE=/tmp/gorun-bench-hosts
H1=198.18.79.11 H2=198.18.79.12
CFG=$GORUN_HOSTS_STATE/ssh_config
BIN=$(mktemp -d /tmp/gorun-bench-bin.XXXXXX)
trap '"$ROOT/test/hosts/down.sh" >/dev/null 2>&1; rm -rf "$BIN"' EXIT

need() { dpkg -s "$@" >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
need openmpi-bin libopenmpi-dev iperf3 openssh-server
cd "$ROOT"
PKGS="./cmd/gorun ./cmd/nmt-train ./test/multihost/archeck"
PERF=archeck
if [ -d cmd/allreduce-perf ] && git ls-files --error-unmatch cmd/allreduce-perf >/dev/null 2>&1; then
  PKGS="$PKGS ./cmd/allreduce-perf" PERF=allreduce-perf
fi
CGO_ENABLED=0 go build -o "$BIN/" $PKGS
MPI_SRC=$ROOT/bench/peers/mpi_allreduce.c
HAVE_MPI=0
if [ -f "$MPI_SRC" ] && mpicc -O2 -o "$BIN/mpi_allreduce" "$MPI_SRC" -lm 2>"$OUT/mpicc.log"; then HAVE_MPI=1; else
  echo "multihost_busbw.sh: no OpenMPI peer ($MPI_SRC missing or mpicc failed; see $OUT/mpicc.log): OpenMPI columns left empty" >&2
fi

CPUS="$CPUS" HOSTS=2 LINK="rate 1gbit" test/hosts/up.sh >"$OUT/up.log" 2>&1
GORUN=("$BIN/gorun" -hostfile "$GORUN_HOSTS_STATE/hostfile" --ssh-args "-F $CFG")
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca btl tcp,self
  --mca btl_tcp_if_include "$GORUN_HOSTS_NET.0/24" --mca oob_tcp_if_include "$GORUN_HOSTS_NET.0/24"
  --mca plm_rsh_agent "ssh -F $CFG")

{
  if [ -n "$CPUS" ]; then cores="cores $CPUS, one list per host"; else cores="$(nproc) cores shared by both hosts"; fi
  echo "# multihost busbw, $(date -u +%FT%TZ), $cores, kernel $(uname -r)"
  echo "# gorun side: $PERF; OpenMPI: $(mpirun --allow-run-as-root --version 2>/dev/null | head -1)"
} | tee "$OUT/header.txt"

# gorun_busbw NP SIZE TRANSPORT [PROCS] -> "median best chosen" (GB/s, GB/s,
# transport); PROCS sets GOMAXPROCS on every rank.
gorun_busbw() {
  local np=$1 size=$2 tr=$3 map=(-x GORUN_TRANSPORT=$3) f=gorun_$3
  [ "$np" = 2 ] && map+=(--map-by node)
  [ -n "${4:-}" ] && map+=(-x GOMAXPROCS=$4) && f+=_procs$4
  f="$OUT/${f}_np${np}_${size}_$LINKNAME$ROUND.txt"
  if [ "$PERF" = allreduce-perf ]; then
    local n=$(( ITER_BYTES / size )); n=$(( n > 1000 ? 1000 : n )); n=$(( n < ITERS ? ITERS : n ))
    "${GORUN[@]}" -np "$np" "${map[@]}" "$BIN/allreduce-perf" -b "$size" -e "$size" -n "$n" -S $(( n < 100 ? n : 100 )) -w $(( n / 10 + 1 )) -I 0 -c 1 >"$f" 2>&1
    # Rank 0's row: size count type redop algo time algbw busbw #wrong, the
    # time the median sample; the line under it: "# size out-of-place: mean
    # X us, median Y us, best Z us". Prints the median's and the mean's busbw.
    awk -v s="$size" '{ sub(/^\[0\] */, "") } /^# transport / { t = $3 }
      $1 == s && $9 == 0 { bw = $8 } $1 == "#" && $2 == s && $3 == "out-of-place:" { mean = $5; med = $8 }
      END { if (bw != "" && mean > 0) printf "%s %.3f %s\n", bw, bw * med / mean, t }' "$f"
  else
    "${GORUN[@]}" -np "$np" "${map[@]}" "$BIN/archeck" -bytes "$size" -iters "$ITERS" >"$f" 2>&1
    awk '/archeck: np/ { for (i = 1; i < NF; i++) { if ($i == "busbw_median_GBps") m = $(i + 1); if ($i == "busbw_best_GBps") b = $(i + 1); if ($i == "transport") t = $(i + 1) } print m, b, t }' "$f"
  fi
}
# mpi_busbw NP SIZE -> "median best" GB/s
mpi_busbw() {
  local np=$1 size=$2 hosts
  [ "$HAVE_MPI" = 1 ] || { echo "- -"; return; }
  if [ "$np" = 2 ]; then hosts=$H1:1,$H2:1; else hosts=$H1:$((np / 2)),$H2:$((np / 2)); fi
  timeout 300 "${MPIRUN[@]}" --host "$hosts" -np "$np" "$BIN/mpi_allreduce" "$MPI_BUDGET" "$size" >"$OUT/mpi_np${np}_${size}_$LINKNAME$ROUND.txt" 2>&1 || { echo "fail fail"; return; }
  awk -v s="$size" '$1 == s { print $7, $8 }' "$OUT/mpi_np${np}_${size}_$LINKNAME$ROUND.txt"
}
# gloo_busbw NP SIZE -> "median best" GB/s (ranks fill host 1, then host 2)
gloo_busbw() {
  local np=$1 size=$2 r ns pids=() log="$OUT/gloo_np$1_$2_$LINKNAME$ROUND.txt"
  [ "$GLOO" = 1 ] && [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "- -"; return; }
  for ((r = 0; r < np; r++)); do
    if [ "$r" -lt $(( (np + 1) / 2 )) ]; then ns=gorun-bh1; else ns=gorun-bh2; fi
    timeout 300 ip netns exec $ns env RANK=$r WORLD_SIZE=$np MASTER_ADDR=$H1 MASTER_PORT=29555 GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
      /usr/bin/python3 "$ROOT/bench/peers/gloo_allreduce.py" --budget "$MPI_BUDGET" --sizes "$size" >>"$log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}" || { echo "fail fail"; return; }
  awk -v s="$size" '$1 == s { print $7, $8 }' "$log"
}
iperf_gbps() {
  ip netns exec gorun-bh2 iperf3 -s -1 -p 5399 -D
  sleep 0.3
  ip netns exec gorun-bh1 iperf3 -c "$H2" -p 5399 -t 5 -J >"$OUT/iperf_$LINKNAME.json"
  python3 -c 'import json,sys; print("%.3f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9))' "$OUT/iperf_$LINKNAME.json"
}
# medians "m1 b1 x1" "m2 b2 x2" ... -> the line whose first field is the
# median of the first fields (the lower middle one of an even count)
medians() { printf '%s\n' "$@" | sort -g -k1,1 | awk '{ l[NR] = $0 } END { print l[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else printf "-" }'; }

ROWS="$OUT/busbw.md"
{
  if [ "$PERF" = allreduce-perf ]; then g="gorun busbw median / mean GB/s (allreduce-perf -S: the median of up to 100 samples, each the slowest rank's, as the peers; and the mean of all $ITERS or more calls)"; else g="gorun busbw median / best GB/s (archeck, $ITERS)"; fi
  echo "| link | iperf3 Gbit/s | np | size | $g, default (auto: chosen) | same, GORUN_TRANSPORT=quic | same, GORUN_TRANSPORT=tcp | same, default, GOMAXPROCS=1 (chosen) | OpenMPI busbw median / best GB/s | gloo busbw median / best GB/s | gorun default/OpenMPI | gorun default GOMAXPROCS=1/OpenMPI | gorun QUIC/OpenMPI | gorun TCP/OpenMPI | gorun default/gloo | gorun default / link rate | gorun default / iperf3 |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} >"$ROWS"
for l in $LINKS; do
  LINKNAME=$l
  if [ "$l" = none ]; then LINK= test/hosts/link.sh >/dev/null; rate=; else LINK="rate $l" test/hosts/link.sh >/dev/null; rate=$(awk -v r="$l" 'BEGIN { v = r + 0; if (r ~ /gbit/) v *= 1e9; else if (r ~ /mbit/) v *= 1e6; printf "%g", v / 8 / 1e9 }'); fi
  ip=$(iperf_gbps)
  for np in $NPS; do
    for s in $SIZES; do
      A=() M=() L=()
      for ((k = 1; k <= ROUNDS; k++)); do
        [ "$ROUNDS" -gt 1 ] && ROUND=_round$k
        A+=("$(gorun_busbw "$np" "$s" auto)")
        M+=("$(mpi_busbw "$np" "$s")")
        L+=("$(gloo_busbw "$np" "$s")")
      done
      ROUND=
      read -r am ab ach < <(medians "${A[@]}")
      read -r mm mb < <(medians "${M[@]}")
      read -r lm lb < <(medians "${L[@]}")
      read -r gm gb _ < <(gorun_busbw "$np" "$s" quic)
      read -r tm tb _ < <(gorun_busbw "$np" "$s" tcp)
      pm=- pb=- pch=-
      [ -z "$CPUS" ] && read -r pm pb pch < <(gorun_busbw "$np" "$s" auto 1)
      vs_rate=-
      [ -n "$rate" ] && vs_rate=$(ratio "$am" "$rate")
      acell=$am gcell=$gm tcell=$tm
      pcell=$pm
      [ "$gb" != - ] && acell="$am / $ab" && gcell="$gm / $gb" && tcell="$tm / $tb" && pcell="$pm / $pb"
      row="| ${l/none/unshaped} | $ip | $np | $((s / 1048576)) MiB | $acell ($ach) | $gcell | $tcell | $pcell ($pch) | $mm / $mb | $lm / $lb | $(ratio "$am" "$mm") | $(ratio "$pm" "$mm") | $(ratio "$gm" "$mm") | $(ratio "$tm" "$mm") | $(ratio "$am" "$lm") | $vs_rate | $(ratio "$am" "$(awk -v g="$ip" 'BEGIN { print g / 8 }')") |"
      echo "$row" | tee -a "$ROWS"
    done
  done
done

# nmt-train at 1 Gbit/s: overlap on and off, alternating, one rank per host.
LINK="rate 1gbit" test/hosts/link.sh >/dev/null
TRAIN="$OUT/train.md"
{
  echo "| preset | overlap | s/step (mean of log lines after the first) | comm exposed ms | hidden % |"
  echo "|---|---|---|---|---|"
} >"$TRAIN"
for p in $TRAIN_PRESETS; do
  for ov in true false true false; do
    log="$OUT/train_${p}_overlap-$ov.txt"
    "${GORUN[@]}" -np 2 --map-by node "$BIN/nmt-train" train --preset "$p" --synthetic-lines 2000 \
      --max-steps "$TRAIN_STEPS" --log-every 10 --eval-every 0 --checkpoint-every 0 \
      --run-dir "$OUT/run-$p-$ov" --overlap="$ov" >>"$log" 2>&1
  done
  for ov in true false; do
    log="$OUT/train_${p}_overlap-$ov.txt"
    awk -v p="$p" -v ov="$ov" -F'|' '/ s\/step \|/ && !/\] step 10\// {   # step 10: the first log line of a run (warm-up)
        for (i = 1; i <= NF; i++) {
          if ($i ~ / s\/step/) { split($i, a, " "); s += a[1]; c++ }
          if ($i ~ /comm exposed/) { match($i, /exposed [0-9.]+ ms/); e += substr($i, RSTART + 8, RLENGTH - 11); match($i, /\([0-9.]+ %/); h += substr($i, RSTART + 1, RLENGTH - 3) }
        } }
      END { if (c) printf "| %s | %s | %.4f | %.1f | %.0f |\n", p, ov, s / c, e / c, h / c }' "$log"
  done
done | tee -a "$TRAIN"
echo
cat "$OUT/header.txt" "$ROWS"
echo
cat "$TRAIN"
