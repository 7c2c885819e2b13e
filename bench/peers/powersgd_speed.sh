#!/usr/bin/env bash
# PowerSGD where the link limits: step time and bytes a step of no
# compression, fp16 and powersgd on 2 test hosts of this machine (network
# namespaces, real ssh, a tbf-shaped link; test/hosts/up.sh), one rank a
# host, against the compute alone (the same preset on one rank, no
# network). Runs alternate (REPS rounds of every case), so all the ratios
# come from one sitting. Root only.
#
#   bench/peers/powersgd_speed.sh
#   env: PRESET (small), LINK ("rate 100mbit"), STEPS (25), LOG (5), PSGD_RANKS ("4 16": each a --powersgd-rank case),
#        THREADS (1), REPS (2), OUT (/tmp/gorun-powersgd-speed)
#
# Step time: the mean of step_time_s over a run's logged intervals after
# the first (warm-up), the least of the REPS runs. Bytes a step: what the
# rank sent over the network (net_out_MBps x step_time_s, the same
# intervals), from the transport's own counters.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PRESET=${PRESET:-small} LINK=${LINK:-"rate 100mbit"} STEPS=${STEPS:-25} LOG=${LOG:-5}
PSGD_RANKS=${PSGD_RANKS:-"4 16"} THREADS=${THREADS:-1} REPS=${REPS:-2} OUT=${OUT:-/tmp/gorun-powersgd-speed}
if [ "$(id -u)" != 0 ]; then echo "powersgd_speed.sh: must run as root (network namespaces)" >&2; exit 1; fi
if [ -e "$OUT" ] && [ ! -e "$OUT/.powersgd-speed" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  echo "powersgd_speed.sh: OUT=$OUT exists and was not made by this script; choose another OUT (nothing was deleted)" >&2
  exit 1
fi
rm -rf "$OUT" && mkdir -p "$OUT" && touch "$OUT/.powersgd-speed"
export GORUN_HOSTS_NAME=gorun-ps GORUN_HOSTS_VETH=grps GORUN_HOSTS_BRIDGE=gorunbrps \
  GORUN_HOSTS_NET=198.18.74 GORUN_HOSTS_STATE=/tmp/gorun-psgd-hosts
BIN=$(mktemp -d /tmp/gorun-psgd-bin.XXXXXX)
trap '"$ROOT/test/hosts/down.sh" >/dev/null 2>&1; rm -rf "$BIN"' EXIT
cd "$ROOT"
CGO_ENABLED=0 go build -o "$BIN/" ./cmd/gorun ./cmd/nmt-train
HOSTS=2 LINK="$LINK" test/hosts/up.sh >"$OUT/up.log" 2>&1
GORUN=("$BIN/gorun" -hostfile "$GORUN_HOSTS_STATE/hostfile" --ssh-args "-F $GORUN_HOSTS_STATE/ssh_config")
echo "# PowerSGD speed, $(date -u +%FT%TZ), $PRESET, link '$LINK', $(nproc) cores shared by both hosts, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD)" | tee "$OUT/header.txt"
common=(--preset "$PRESET" --synthetic-lines 4000 --max-steps "$STEPS" --log-every "$LOG" --eval-every 0
  --checkpoint-every 0 --eval-sentences 10 --threads "$THREADS" --quiet)
# mean DIR NAME...: the means over the train records after the first of step_time_s x each NAME
mean() {
  python3 -c '
import json, sys
recs = [json.loads(l)["values"] for l in open(sys.argv[1] + "/metrics.jsonl") if "\"train\"" in l][1:]
step = sum(r["step_time_s"] for r in recs) / len(recs)
out = ["%.4f" % step]
for name in sys.argv[2:]:
    out.append("%.0f" % (sum(r.get(name, 0) * r["step_time_s"] * 1e6 for r in recs) / len(recs)))
print(" ".join(out))' "$@"
}
for k in $(seq "$REPS"); do
  "$BIN/nmt-train" train "${common[@]}" --run-dir "$OUT/compute-$k" >"$OUT/compute-$k.log" 2>&1
  for c in none fp16 $(for r in $PSGD_RANKS; do echo "powersgd$r"; done); do
    case $c in
      powersgd*) extra=(--compression powersgd --powersgd-rank "${c#powersgd}" --powersgd-start-step 0) ;;
      *) extra=(--compression "$c") ;;
    esac
    "${GORUN[@]}" -np 2 --map-by node "$BIN/nmt-train" train "${common[@]}" "${extra[@]}" \
      --run-dir "$OUT/$c-$k" >"$OUT/$c-$k.log" 2>&1
  done
done
best() { # the least step time of the REPS runs of a case, and that run's bytes a step
  for k in $(seq "$REPS"); do mean "$OUT/$1-$k" net_out_MBps; done | sort -n | head -1
}
read -r compute _ <<<"$(best compute)"
{
  echo "| case | s/step (best of $REPS) | / compute alone | bytes sent a step (rank 0) | fp16's bytes / these |"
  echo "|---|---:|---:|---:|---:|"
  echo "| compute alone (1 rank) | $compute | 1.00 | 0 | |"
  read -r s16 b16 <<<"$(best fp16)"
  for c in none fp16 $(for r in $PSGD_RANKS; do echo "powersgd$r"; done); do
    read -r s b <<<"$(best "$c")"
    printf '| %s | %s | %.2f | %s | %.1fx |\n' "${c/powersgd/powersgd, rank }" "$s" "$(python3 -c "print($s / $compute)")" "$b" \
      "$(python3 -c "print($b16 / max($b, 1))")"
  done
} | tee "$OUT/table.md"
