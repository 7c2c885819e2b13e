#!/usr/bin/env bash
# nmt-train plan against real runs (issue 19): on 2 test hosts of this
# machine (network namespaces, real ssh, tbf-shaped links; test/hosts/up.sh),
# nmt-train runs the tiny and small presets on np 2 (one rank per host)
# and np 4 (two per host), 1 Gbit/s and 10 Gbit/s, with and without
# overlap, each rank with THREADS compute threads; each run's measured step
# time is compared with `nmt-train plan --from-run BASELINE` of a one-rank
# run of the same preset with the same threads (like with like), started
# on this machine just before. One sitting; root only.
#
#   bench/peers/plan_validate.sh
#   env: PRESETS ("tiny small"), LINKS ("1gbit 10gbit"), NPS ("2 4"), OVERLAPS ("true false"),
#        COMPRESSIONS ("fp16"; "fp16 powersgd" adds the PowerSGD cases), PSGD_RANK (16, the default),
#        THREADS (1), STEPS_tiny (60), STEPS_small (30), LOG_tiny (10), LOG_small (5),
#        CORES_PER_HOST (the planner's: 1 = this machine's 2 cores shared by the 2 hosts),
#        TRANSPORT (1: fit the transports' constants first, allreduce-perf at 10 Gbit/s; PRESETS=none: only that),
#        REPS (2: baseline and run pairs per case), OUT
#
# Each case runs REPS times a one-rank baseline and right after it the
# distributed run. Measured step time: the mean of step_time_s over a
# run's logged intervals after the first (warm-up), the least of the REPS
# runs (the machine is shared: other work only slows a run down); the
# prediction is nmt-train plan --from-run of the baseline with the least
# step time, --hosts 2 --per-host NP/2 --link L --cores-per-host
# CORES_PER_HOST --threads THREADS --overlap=O.
#
# PowerSGD (COMPRESSIONS with powersgd; overlap on only, as nmt-train
# requires): the runs compress from step 0 (--powersgd-start-step 0, so
# every timed interval is compressed) at rank PSGD_RANK; the baseline is
# the same one-rank run (one rank communicates nothing). The prediction is
# the same plan --from-run with --compression powersgd, the compressor's
# compute given as --powersgd-compute-s: what `nmt-train plan --compression
# powersgd` measures on this machine's CPU for the preset with the
# baseline's vocabulary and THREADS threads (--from-run of an fp16 baseline
# would take it from FLOPs, which on this CPU underestimates it about 20x:
# docs/plan.md). The table's last column gives, beside the load, the
# compressor's time the run logged (powersgd_compute_ms) against that
# measurement.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PRESETS=${PRESETS:-"tiny small"}
LINKS=${LINKS:-"1gbit 10gbit"}
NPS=${NPS:-"2 4"}
OVERLAPS=${OVERLAPS:-"true false"}
COMPRESSIONS=${COMPRESSIONS:-"fp16"}
PSGD_RANK=${PSGD_RANK:-16}
THREADS=${THREADS:-1}
CORES_PER_HOST=${CORES_PER_HOST:-1}
TRANSPORT=${TRANSPORT:-1}
REPS=${REPS:-2}
STEPS_tiny=${STEPS_tiny:-60} LOG_tiny=${LOG_tiny:-10}
STEPS_small=${STEPS_small:-30} LOG_small=${LOG_small:-5}
OUT=${OUT:-/tmp/gorun-plan-validate}
if [ "$(id -u)" != 0 ]; then echo "plan_validate.sh: must run as root (network namespaces)" >&2; exit 1; fi
# OUT is emptied only if this script made it (its marker file is there):
# an OUT that holds anything else (someone's runs and checkpoints) is refused.
if [ -e "$OUT" ] && [ ! -e "$OUT/.plan-validate" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  echo "plan_validate.sh: OUT=$OUT exists and was not made by this script; choose another OUT (nothing was deleted)" >&2
  exit 1
fi
rm -rf "$OUT" && mkdir -p "$OUT" && touch "$OUT/.plan-validate"

export GORUN_HOSTS_NAME=gorun-pv GORUN_HOSTS_VETH=grpv GORUN_HOSTS_BRIDGE=gorunbrv \
  GORUN_HOSTS_NET=198.18.73 GORUN_HOSTS_STATE=/tmp/gorun-plan-hosts
BIN=$(mktemp -d /tmp/gorun-plan-bin.XXXXXX)
trap '"$ROOT/test/hosts/down.sh" >/dev/null 2>&1; rm -rf "$BIN"' EXIT
cd "$ROOT"
CGO_ENABLED=0 go build -o "$BIN/" ./cmd/gorun ./cmd/nmt-train ./cmd/allreduce-perf
HOSTS=2 LINK="rate 1gbit" test/hosts/up.sh >"$OUT/up.log" 2>&1
GORUN=("$BIN/gorun" -hostfile "$GORUN_HOSTS_STATE/hostfile" --ssh-args "-F $GORUN_HOSTS_STATE/ssh_config")
echo "# plan validation, $(date -u +%FT%TZ), $(nproc) cores shared by both hosts, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD)" | tee "$OUT/header.txt"

# The transports' constants: np 2 (one rank per host), the ring, fp16 on
# the wire, GOMAXPROCS=2 (as nmt-train runs) at 10 Gbit/s, which neither
# transport fills here: T = 2 steps + wire bytes / cap, fitted by least
# squares on relative error (plan/transport.go takes these).
if [ "$TRANSPORT" = 1 ]; then
  LINK="rate 10gbit" test/hosts/link.sh >/dev/null
  for tr in tcp quic; do
    for k in 1 2; do
      "${GORUN[@]}" -np 2 --map-by node -x GOMAXPROCS=2 -x GORUN_TRANSPORT=$tr "$BIN/allreduce-perf" \
        -b 4K -e 64M -f 4 -n 10 -w 2 -I 0 -W half -a ring >"$OUT/transport_${tr}_$k.txt" 2>&1
    done
    cat "$OUT"/transport_${tr}_*.txt | python3 -c '
import sys
rows = []
for l in sys.stdin:
    f = l.replace("[0]", "").split()
    if len(f) >= 9 and f[0].isdigit() and f[4] == "ring":
        rows.append((int(f[0]) / 2, float(f[5])))   # wire bytes (fp16), us
# The cap: T = a + b * B fitted on relative error to the rows of 512 KiB
# and more on the wire (the sizes of buckets); the step: the median over
# the rows of 32 KiB and less of (T - B * b) / 2 (2 ring steps at np 2).
def fit(rows):
    sw = sx = sy = sxx = sxy = 0.0
    for B, t in rows:
        w = 1 / (t * t)
        sw += w; sx += w * B; sy += w * t; sxx += w * B * B; sxy += w * B * t
    b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    return (sy - b * sx) / sw, b
a, b = fit([r for r in rows if r[0] >= 512 << 10])
small = sorted((t - B * b) / 2 for B, t in rows if B <= 32 << 10)
step = small[len(small) // 2]
print("%s: StepUs %.0f, CapGBs %.3f (%d rows)" % (sys.argv[1], step, 1e-3 / b, len(rows)))
for B, t in rows:
    print("  %9d B wire: %9.1f us measured, %9.1f with these constants" % (B, t, 2 * step + b * B))
' "$tr" | tee -a "$OUT/transport.txt"
  done
fi

# mean_step DIR FROM [NAME]: mean of NAME (step_time_s) of the train records after the FROM-th
mean_step() {
  python3 -c '
import json, sys
v = [json.loads(l)["values"].get(sys.argv[3], 0) for l in open(sys.argv[1] + "/metrics.jsonl") if "\"train\"" in l]
v = v[int(sys.argv[2]):]
print("%.4f" % (sum(v) / len(v)))' "$1" "$2" "${3:-step_time_s}"
}
# psgd_compute PRESET BASE L: the compressor's compute a step (s) as plan
# measures it on this CPU, for PRESET with BASE's vocabulary and THREADS
psgd_compute() {
  local vocab
  vocab=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1] + "/run.json")).get("vocab", 0))' "$2")
  "$BIN/nmt-train" plan --preset "$1" --vocab "$vocab" --hosts 2 --link "$3" --compression powersgd \
    --powersgd-rank "$PSGD_RANK" --powersgd-start-step 0 --threads "$THREADS" --measure-steps 2 2>/dev/null |
    awk '/^powersgd compute:/ { print $3 }'
}
TABLE="$OUT/table.md"
echo "| preset | np | link | overlap | compression | measured s/step (best; all) | predicted s/step | error | predicted parts (compute + wait + sync + exposed + CPU + compressor in backward) | transport | load |" >"$TABLE"
echo "|---|---|---|---|---|---|---|---|---|---|---|" >>"$TABLE"
# best DIR...: the directory whose mean step time is the least
best() {
  for d in "$@"; do echo "$(mean_step "$d" 1) $d"; done | sort -n | head -1 | cut -d' ' -f2
}
for p in $PRESETS; do
  [ "$p" = none ] && continue
  steps_var=STEPS_$p log_var=LOG_$p
  steps=${!steps_var} log=${!log_var}
  common=(--preset "$p" --synthetic-lines 2000 --max-steps "$steps" --log-every "$log" --eval-every 0
    --checkpoint-every 0 --eval-sentences 10 --threads "$THREADS" --quiet)
  for l in $LINKS; do
    LINK="rate $l" test/hosts/link.sh >/dev/null
    for np in $NPS; do
      map=()
      [ "$np" = 2 ] && map=(--map-by node)
      for ov in $OVERLAPS; do
      for comp in $COMPRESSIONS; do
        comp_args=() plan_args=()
        if [ "$comp" = powersgd ]; then
          [ "$ov" = true ] || continue # nmt-train compresses the overlapped buckets only
          comp_args=(--compression powersgd --powersgd-rank "$PSGD_RANK" --powersgd-start-step 0)
        fi
        case="$p-np$np-$l-$ov-$comp" bases=() runs=() all=""
        for ((k = 1; k <= REPS; k++)); do
          # the one-rank baseline right before the run: like with like, under the same load
          "$BIN/nmt-train" train "${common[@]}" --run-dir "$OUT/base-$case-$k" >"$OUT/base-$case-$k.log" 2>&1
          "${GORUN[@]}" -np "$np" "${map[@]}" "$BIN/nmt-train" train "${common[@]}" --overlap="$ov" "${comp_args[@]}" \
            --run-dir "$OUT/run-$case-$k" >"$OUT/run-$case-$k.log" 2>&1
          bases+=("$OUT/base-$case-$k") runs+=("$OUT/run-$case-$k")
          all="$all${all:+, }$(mean_step "$OUT/run-$case-$k" 1) (base $(mean_step "$OUT/base-$case-$k" 1))"
        done
        base=$(best "${bases[@]}") run=$(best "${runs[@]}")
        meas=$(mean_step "$run" 1)
        extra=""
        if [ "$comp" = powersgd ]; then
          psgd_s=$(psgd_compute "$p" "$base" "$l")
          plan_args=(--compression powersgd --powersgd-rank "$PSGD_RANK" --powersgd-start-step 0 --powersgd-compute-s "${psgd_s:-0}")
          extra="; compressor $(mean_step "$run" 1 powersgd_compute_ms) ms in the run, ${psgd_s:-?} s measured for the plan"
        fi
        "$BIN/nmt-train" plan --from-run "$base" --hosts 2 --per-host $((np / 2)) --link "$l" \
          --cores-per-host "$CORES_PER_HOST" --threads "$THREADS" --overlap="$ov" "${plan_args[@]}" >"$OUT/$case.plan" 2>&1
        pred=$(awk '/^predicted step time:/ { print $4 }' "$OUT/$case.plan")
        parts=$(awk '/^  (compute|wait|token-count|exposed|transport CPU|powersgd compute in backward) / { for (i = 2; i <= NF; i++) if ($i == "s") { printf "%s%s", sep, $(i-1); sep = " + "; break } }' "$OUT/$case.plan")
        trn=$(grep -o 'transport [A-Z/]*' "$run.log" | head -1 | cut -d' ' -f2)
        err=$(awk -v a="$pred" -v b="$meas" 'BEGIN { printf "%+.0f %%", 100 * (a - b) / b }')
        echo "| $p | $np | $l | $ov | $comp | $meas; $all | $pred | $err | $parts | $trn | $(cut -d' ' -f1 /proc/loadavg)$extra |" | tee -a "$TABLE"
      done
      done
    done
  done
done
echo "# done $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/header.txt"
echo
cat "$OUT/header.txt" "$OUT/transport.txt" 2>/dev/null || true
cat "$TABLE"
