#!/usr/bin/env bash
# The one-call GPU check (docs/cuda.md). Runs on the GPU machine, in the
# repository root, after bench/gpu/build.sh made .gpu/gpu.tar.gz here:
#
#   bench/gpu/build.sh
#   # then, on the GPU machine (the device tool: carry .gpu):
#   BUDGET=570 bash bench/gpu/run.sh check torch train bench net
#
# GROUPS run in the order named (none: check train bench torch net). Each
# step has its own time limit and none stops the others. BUDGET=S fits the
# whole call into S seconds: a step's limit is cut to what is left (less 20 s
# to pack the results) and a step with under 20 s left is skipped, so one
# 10-minute device call (timeout_s 600) runs as much as fits and always
# brings its results back. Without BUDGET, each group's limits add up to
# under 10 minutes. Steps:
#   env          the GPU, driver, CPU (and the features gorun uses: --version),
#                libraries gorun finds (every call)
#   check:
#     conform    every backend op on the GPU against float64 references, the
#                host staging path, a transformer step against the CPU backend
#     tiny-np1   nmt-train on the built-in corpus, tiny preset, 1 rank on the GPU
#     tiny-np2   the same with 2 ranks sharing the GPU (gradients through the mesh)
#     translate  beam search from the tiny run's checkpoint on the GPU
#     interop    the tiny run's checkpoint read with Python's safetensors, its
#                event file with TensorBoard's loader (bench/gpu/interop.py)
#   train:
#     base       Transformer-base (the lab's model) for 300 steps
#   bench:
#     gorun-fp16, -bf16, -fp32  Transformer-base steps (bench/device_test.go) on
#                the batch shapes torch_transformer.py --dump-batches gives
#     gorun-prof  5 fp16 steps of the 25000-token batches with GORUN_CUDA_PROFILE=1:
#                the GPU time of every kernel, GEMM and copy, largest first
#   torch:
#     torch-check, torch  PyTorch's Transformer-base on the same GPU and shapes
#                (bench/peers/torch_transformer.py, docs/gpu-bench.md): a quick
#                self-check, then the sweep -> torch.jsonl
#   net (no GPU needed; issue 18's 16-core measurement; about 3 minutes):
#     net-tcp-npN, net-quic-npN  allreduce-perf -a ring on loopback, N = 2, 4,
#                8 ranks, each with cores/N cores, TLS/TCP and QUIC forced and
#                GORUN_SHM=0 (ranks on one host use shared memory otherwise),
#                1-256 MiB, -S 5
#     net-quic-np2-nogro  np 2 over QUIC received without UDP_GRO
#                (GORUN_QUIC_GRO=off), beside net-quic-np2's GRO
#     net-tcp-np2-aesgcm  np 2 over TLS/TCP with the records sealed by AES-128-GCM
#                (GORUN_TCP_CIPHER=aes-gcm), beside the default's AEGIS-128X4
#                where the CPU has VAES on AVX-512 (the transport line says which)
#     net-tcp-np2-1core  the same, one core per rank (GOMAXPROCS=1)
#     net-quic-np2-conns8, net-tcp-np2-conns8  np 2 with 8 connections (QUIC)
#                or lanes (TLS/TCP) and 8 rings per peer pair
#                (GORUN_CONNS_PER_PEER=8 GORUN_RINGS=8): scaling with cores
#     net-gloo-npN  torch gloo on loopback (bench/peers/gloo_allreduce.py;
#                PYTHON names the interpreter, python3 by default)
# Everything lands in $OUT (the device tool's) or bench/gpu/results/<date>/:
# summary.txt and results.tar.gz (logs, metrics, reports).
# QUICK=1 runs every training for 3 steps: a smoke test of this script itself,
# e.g. here on the CPU emulator (GORUN_CUDA_LIB_DIR=<internal/cudaemu build>).
set -uo pipefail
groups=${*:-check train bench torch net}
for g in $groups; do
	case $g in check | train | bench | torch | net) ;; *)
		echo "run.sh: unknown group '$g' (want check, train, bench, torch or net)" >&2
		exit 2
		;;
	esac
done
case ${BUDGET:-0} in *[!0-9]*)
	echo "run.sh: BUDGET=${BUDGET} is not a whole number of seconds" >&2
	exit 2
	;;
esac
t_start=$(date +%s)
cd "$(dirname "$0")/../.."
root=$(pwd)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
res=${OUT:-$root/bench/gpu/results/$stamp}
mkdir -p "$res"
work=$(mktemp -d)
logs=$work/logs
mkdir -p "$logs"
summary=$res/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }

tar -C "$work" -xzf .gpu/gpu.tar.gz || { say "no .gpu/gpu.tar.gz: run bench/gpu/build.sh first"; exit 2; }
bin=$work/bin
runs=$work/runs
say "gorun GPU check $stamp, commit $(cat "$work/COMMIT"), groups: $groups${BUDGET:+, budget ${BUDGET} s}"

# pack: results.tar.gz (logs, metrics, reports) as they are now, after every
# step, so that a call cut off still brings back what ran
pack() {
	(cd "$work" && tar -czf "$res/results.tar.gz.tmp" logs $(find runs -name '*.jsonl' -o -name '*.md' -o -name '*.png' 2>/dev/null)) &&
		mv "$res/results.tar.gz.tmp" "$res/results.tar.gz"
}

# step NAME LIMIT_S CMD...: runs CMD with a time limit (cut to the budget),
# its output in logs/NAME.log, and one line in the summary
step() {
	local name=$1 limit=$2
	shift 2
	if [ -n "${BUDGET:-}" ]; then
		local left=$((BUDGET - ($(date +%s) - t_start) - 20))
		if [ "$left" -lt 20 ]; then
			say "$(printf '%-10s skipped: %s s of the budget left' "$name" "$((left + 20))")"
			return 0
		fi
		[ "$left" -lt "$limit" ] && limit=$left
	fi
	local t0=$(date +%s)
	timeout -k 10 "$limit" "$@" > "$logs/$name.log" 2>&1
	local rc=$?
	say "$(printf '%-10s rc=%-3s %4ss  %s' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$(tail -n 1 "$logs/$name.log" | cut -c1-150)")"
	pack
	return 0
}

n() { if [ "${QUICK:-}" = 1 ]; then echo 3; else echo "$1"; fi; }

check() {
	step conform 200 env GORUN_CUDA_TEST_DEVICE=gpu "$work/cuda.test" -test.v -test.count=1 -test.timeout 190s
	step tiny-np1 140 "$bin/gorun" -np 1 "$bin/nmt-train" train --config configs/demo.yaml --device cuda \
		--max-steps "$(n 300)" --run-dir "$runs/tiny-np1"
	step tiny-np2 140 "$bin/gorun" -np 2 "$bin/nmt-train" train --config configs/demo.yaml --device cuda \
		--max-steps "$(n 200)" --run-dir "$runs/tiny-np2"
	step translate 40 bash -c "printf 'la gana vomego beto .\n' | '$bin/nmt-train' translate --device cuda --run-dir '$runs/tiny-np1'"
	step interop 60 python3 bench/gpu/interop.py "$runs/tiny-np1"
}
train() {
	step base 420 "$bin/gorun" -np 1 "$bin/nmt-train" train --preset base --synthetic-lines 200000 --device cuda \
		--batch-tokens 8192 --max-steps "$(n 300)" --log-every 25 --eval-every 0 --eval-sentences 100 --checkpoint-every 0 \
		--run-dir "$runs/base"
}
bench() {
	# the same batch shapes for gorun and PyTorch (the dump needs no torch)
	python3 bench/peers/torch_transformer.py --dump-batches "$work/batches.jsonl" --batch-tokens 4096,12288,25000 --steps 20 \
		> "$logs/batches.log" 2>&1
	for p in fp16 prof bf16 fp32; do
		if [ $p = prof ]; then
			# where the GPU's time goes: every kernel, GEMM and copy of 5
			# steps of the largest batches timed between CUDA events
			step gorun-prof 90 env GORUN_CUDA_PROFILE=1 GORUN_BENCH_DEVICE=cuda GORUN_BENCH_PRECISION=fp16 \
				GORUN_BENCH_BATCHES="$work/batches.jsonl" "$work/bench.test" -test.run '^$' \
				-test.bench 'TrainStepDevice/base/fp16/tokens=25000$' -test.benchtime 5x -test.v
			continue
		fi
		step gorun-$p 150 env GORUN_BENCH_DEVICE=cuda GORUN_BENCH_PRECISION=$p GORUN_BENCH_BATCHES="$work/batches.jsonl" \
			"$work/bench.test" -test.run '^$' -test.bench TrainStepDevice -test.benchtime 20x
	done
}
torch() {
	[ "${QUICK:-}" = 1 ] && return 0
	step torch-check 120 python3 bench/peers/torch_transformer.py --self-check
	step torch 300 python3 bench/peers/torch_transformer.py --sweep --json "$res/torch.jsonl"
}
net() {
	# brief FILE LABEL COLUMN: one line, busbw by size (GB/s, the medians in
	# COLUMN of FILE's rows). ar and gl print their rows as they come, so a
	# step cut off at its limit still leaves the sizes it finished in its log.
	brief() {
		awk -v t="$2" -v c="$3" '{ sub(/^\[0\] */, "") } $1 ~ /^[0-9]+$/ { l = l " " $1 / 1048576 "M " $c }
			END { print "busbw GB/s (" t "):" l }' "$1"
	}
	# shown LABEL COLUMN CMD...: CMD's output as it comes, then brief's
	# line; CMD's exit status
	shown() {
		local f rc
		f=$(mktemp)
		"${@:3}" 2>&1 | tee "$f"
		rc=${PIPESTATUS[0]}
		brief "$f" "$1" "$2"
		rm -f "$f"
		return $rc
	}
	ar() {
		shown "$2" 8 "$bin/gorun" -np "$1" -x GORUN_SHM=0 "${@:3}" "$bin/allreduce-perf" -a ring -b 1M -e 256M -f 4 \
			-n 10 -w 2 -S 5 -I 0 -c 1 -t 60s
	}
	gl() {
		shown gloo 7 "${PYTHON:-python3}" bench/peers/gloo_allreduce.py --np "$1" --budget 1 --timeout 45 \
			--sizes 1048576 4194304 16777216 67108864 268435456
	}
	export -f brief shown ar gl
	export bin
	# limits add up to 590 s, inside one device call
	for np in 2 4 8; do
		c="$np ranks on $(nproc) cores"
		step net-tcp-np$np 40 bash -c 'ar "$@"' _ "$np" "TLS/TCP, $c" -x GORUN_TRANSPORT=tcp
		step net-quic-np$np 50 bash -c 'ar "$@"' _ "$np" "QUIC, $c" -x GORUN_TRANSPORT=quic
		step net-gloo-np$np 45 bash -c 'gl "$@"' _ "$np"
	done
	# one peer pair over more connections and rings: does QUIC (one
	# goroutine per quic-go connection) or TLS/TCP scale with the cores?
	step net-quic-np2-conns8 40 bash -c 'ar "$@"' _ 2 "QUIC, 8 connections and 8 rings per peer pair, 2 ranks on $(nproc) cores" -x GORUN_TRANSPORT=quic -x GORUN_CONNS_PER_PEER=8 -x GORUN_RINGS=8
	step net-tcp-np2-conns8 35 bash -c 'ar "$@"' _ 2 "TLS/TCP, 8 lanes and 8 rings per peer pair, 2 ranks on $(nproc) cores" -x GORUN_TRANSPORT=tcp -x GORUN_CONNS_PER_PEER=8 -x GORUN_RINGS=8
	step net-quic-np2-nogro 30 bash -c 'ar "$@"' _ 2 "QUIC received one datagram at a time (GORUN_QUIC_GRO=off), 2 ranks on $(nproc) cores" -x GORUN_TRANSPORT=quic -x GORUN_QUIC_GRO=off
	step net-tcp-np2-aesgcm 40 bash -c 'ar "$@"' _ 2 "TLS/TCP sealed with AES-128-GCM, 2 ranks on $(nproc) cores" -x GORUN_TRANSPORT=tcp -x GORUN_TCP_CIPHER=aes-gcm
	step net-tcp-np2-1core 40 bash -c 'ar "$@"' _ 2 "TLS/TCP, GOMAXPROCS=1" -x GORUN_TRANSPORT=tcp -x GOMAXPROCS=1
}

step env 30 bash -c 'nvidia-smi; uname -a; lscpu | grep -E "Model name|^CPU\(s\)"; "$1" --version; ls /usr/local/nvidia/lib64 2>/dev/null | head; python3 -c "import torch; print(\"torch\", torch.__version__, torch.version.cuda)"; echo ok' _ "$bin/allreduce-perf"
for g in $groups; do
	$g
done
nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv >> "$logs/env.log" 2>&1
pack
say "results: $res"
rm -rf "$work"
