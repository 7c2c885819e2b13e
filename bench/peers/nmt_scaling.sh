#!/usr/bin/env bash
# Tokens/s and step time of nmt-train for 1, 2 and 4 local ranks (issue 7's
# benchmark). All ranks share this machine's cores, so the "scaling
# efficiency" here says how much the distribution costs, not how a cluster
# scales: tokens/s at n ranks / (n x tokens/s at 1 rank).
#   bench/peers/nmt_scaling.sh [preset] [steps] [batch-tokens]
set -euo pipefail
cd "$(dirname "$0")/../.."
preset=${1:-tiny}; steps=${2:-60}; bt=${3:-4096}
make -s build >/dev/null
out=$(mktemp -d)
printf '%-6s %-5s %12s %12s %10s %14s %10s\n' preset ranks "tok/s" "s/step" efficiency "exposed ms" "hidden %"
base=""
for n in 1 2 4; do
  bin/gorun --oversubscribe -np $n bin/nmt-train train --preset "$preset" --synthetic-lines 20000 \
    --batch-tokens "$bt" --max-steps "$steps" --log-every $((steps / 2)) --eval-every 0 --eval-sentences 0 \
    --checkpoint-every 0 --quiet --run-dir "$out/np$n" >"$out/np$n.log" 2>&1 || { cat "$out/np$n.log"; exit 1; }
  # the second log window (steps/2+1 .. steps): no start-up in it
  read -r tps st ex hid < <(python3 - "$out/np$n/metrics.jsonl" <<'PY'
import json,sys
r=[json.loads(l) for l in open(sys.argv[1]) if '"train"' in l][-1]["values"]
print(r["tokens_per_s"], r["step_time_s"], r["comm_exposed_ms"], r["comm_hidden_pct"])
PY
)
  [ -z "$base" ] && base=$tps
  eff=$(python3 -c "print(f'{$tps/($n*$base):.2f}')")
  printf '%-6s %-5s %12.0f %12.3f %10s %14.1f %10.0f\n' "$preset" $n "$tps" "$st" "$eff" "$ex" "$hid"
done
rm -rf "$out"
