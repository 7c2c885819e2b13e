#!/usr/bin/env bash
# Side-by-side: gorun's transformer training step (go test -bench Transformer) and the same
# architecture in PyTorch (torch_transformer.py), one sitting, 2 threads, 32 x 32 tokens per side.
# Needs Debian's python3-torch (1.13) and libopenblas0-openmp (installed if missing, as root).
# Usage: bench/peers/torch_transformer.sh [rounds]   (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-1}
need() { dpkg -s "$@" >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
need python3-torch libopenblas0-openmp
A=/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$A/openblas-openmp OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
go test -c -o /tmp/gorun-bench.test ./bench/
for r in $(seq "$ROUNDS"); do
  for cfg in tiny small base; do
    steps=5; [ $cfg = base ] && steps=3
    /usr/bin/python3 bench/peers/torch_transformer.py --config $cfg --threads 2 --warmup 1 --steps $steps | grep RESULT
    /tmp/gorun-bench.test -test.run XXX -test.bench "Transformer/$cfg\$" -test.benchtime ${steps}x -test.cpu 2 | grep '^BenchmarkTransformer' |
      awk -v c=$cfg '{for(i=1;i<=NF;i++){if($i=="tgt_tok/s")t=$(i-1); if($i=="fwd_s")f=$(i-1); if($i=="bwd_s")b=$(i-1); if($i=="adam_s")a=$(i-1); if($i=="peak_rss_MiB")m=$(i-1); if($i=="ns/op")s=$(i-1)/1e9}
        printf "RESULT impl=gorun config=%s threads=2 fwd_s=%.4f bwd_s=%.4f adam_s=%.4f step_s=%.4f tgt_tok_s=%.0f peak_rss_mib=%.0f\n", c, f, b, a, s, t, m}'
  done
done
