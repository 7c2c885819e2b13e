#!/usr/bin/env bash
# PowerSGD against fp16 on real translation text: eval loss at equal steps.
#
# The corpus is OpenNMT-py's English-German sample (10,000 WMT training
# pairs; data/testdata/wmt-sample.md says where it comes from; its first 500
# pairs are data/testdata/wmt-sample.*): give the two files as SRC and TGT.
# prepare learns a joint BPE of MERGES merges and holds out the last VALID
# pairs; then each configuration trains the same preset from the same seed
# on NP local ranks for STEPS steps, evaluating every EVAL steps, and the
# eval losses go into one table (markdown, on stdout and in OUT/table.md).
#
#   SRC=.../src-train.txt TGT=.../tgt-train.txt bench/peers/powersgd_convergence.sh
#   env: PRESET (small), NP (2), STEPS (600), EVAL (100), START (100: --powersgd-start-step),
#        RANKS ("1 2 4 8 16"), MERGES (8000), VALID (500), BATCH (2048 tokens a rank),
#        WARMUP (400), OUT (/tmp/gorun-powersgd-convergence)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
: "${SRC:?give SRC, the English file}" "${TGT:?give TGT, the German file}"
PRESET=${PRESET:-small} NP=${NP:-2} STEPS=${STEPS:-600} EVAL=${EVAL:-100} START=${START:-100}
RANKS=${RANKS:-"1 2 4 8 16"} MERGES=${MERGES:-8000} VALID=${VALID:-500} BATCH=${BATCH:-2048}
WARMUP=${WARMUP:-400} OUT=${OUT:-/tmp/gorun-powersgd-convergence}
mkdir -p "$OUT"
make -s -C "$ROOT" build >/dev/null
BIN=$ROOT/bin
if [ ! -f "$OUT/corpus/train.bin" ]; then
  "$BIN/nmt-train" prepare --src "$SRC" --tgt "$TGT" --bpe-merges "$MERGES" --valid-lines "$VALID" \
    --max-length 100 --out "$OUT/corpus" >/dev/null
fi
run() { # name, extra flags...
  local name=$1; shift
  rm -rf "$OUT/run-$name"
  "$BIN/gorun" -np "$NP" "$BIN/nmt-train" train --preset "$PRESET" --data "$OUT/corpus" \
    --batch-tokens "$BATCH" --max-length 100 --warmup-steps "$WARMUP" --max-steps "$STEPS" \
    --log-every "$EVAL" --eval-every "$EVAL" --eval-sentences 0 --checkpoint-every 0 --seed 1 \
    --quiet --run-dir "$OUT/run-$name" "$@" >"$OUT/run-$name.log" 2>&1
}
names=(fp16)
run fp16 --compression fp16
for r in $RANKS; do
  run "powersgd-r$r" --compression powersgd --powersgd-rank "$r" --powersgd-start-step "$START"
  names+=("powersgd-r$r")
done
# one row per evaluation: the step, fp16's eval loss, each rank's and its ratio to fp16's
{
  printf '| step | fp16 |'
  for n in "${names[@]:1}"; do printf ' %s | / fp16 |' "${n#powersgd-}"; done
  printf '\n|---:|---:|'
  for n in "${names[@]:1}"; do printf -- '---:|---:|'; done
  printf '\n'
  python3 - "$OUT" "${names[@]}" <<'PY'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
loss = {}
for n in names:
    for line in open(f"{out}/run-{n}/metrics.jsonl"):
        r = json.loads(line)
        if r.get("kind") == "eval":
            loss.setdefault(r["step"], {})[n] = r["values"]["loss"]
for step in sorted(loss):
    row = loss[step]
    base = row.get(names[0])
    cells = [f"{step}", f"{base:.4f}" if base else "-"]
    for n in names[1:]:
        v = row.get(n)
        cells += [f"{v:.4f}" if v else "-", f"{v / base:.3f}" if v and base else "-"]
    print("| " + " | ".join(cells) + " |")
PY
} | tee "$OUT/table.md"
